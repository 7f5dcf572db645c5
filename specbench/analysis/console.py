"""The summary table printed at the end of a run."""
from __future__ import annotations

from .metrics import fmt
from ..scoring import primary_value

COLUMNS = ("method", "prompts", "tokens", "tok/s", "ms/token", "speedup", "tau", "accept", "identical to greedy",
           "task score")


def accuracy_text(accuracy: dict | None) -> str:
    """'pass@1 40.00', 'not scored', or '-' (no scorer); failed scorings are counted beside it."""
    if not accuracy:
        return "-"
    if accuracy["primary"] is None:
        return "mixed (per-task metrics in the summary)" if accuracy["scorer"] == "mixed" else "not scored"
    value = primary_value(accuracy)
    text = f"{accuracy['primary']} {fmt(value)}" if value is not None else f"{accuracy['primary']} -"
    return text + (f" ({accuracy['failed']} failed)" if accuracy.get("failed") else "")


def identity_text(s: dict) -> str:
    """'14/15 (1 near-tie)', '13/15 (1 near-tie, 1 MISMATCH)', '(baseline)' or '-'."""
    if not s.get("compared"):
        return "(baseline)" if s.get("is_baseline") else "-"
    notes = [f"{s[key]} {label}" for key, label in (("near_ties", "near-tie"), ("mismatches", "MISMATCH"),
                                                    ("unclassified", "unclassified")) if s.get(key)]
    return f"{s['identical']}/{s['compared']}" + (f" ({', '.join(notes)})" if notes else "")


def lossless_text(s: dict) -> str:
    """'lossless: 4/4 (1 identical, 3 differ from one-row greedy only by kernel rounding, largest gap 0.16 <=
    tolerance 0.75)', then any mismatches and unclassified divergences."""
    identical, near, mismatches = s.get("identical") or 0, s.get("near_ties") or 0, s.get("mismatches") or 0
    parts = [f"{identical} identical"]
    if near:
        largest = s.get("largest_gap")
        gap = f", largest gap {largest['gap']:.3g} <= tolerance {largest['tolerance']:.3g}" if largest else ""
        parts.append(f"{near} differ{'s' if near == 1 else ''} from one-row greedy only by kernel rounding{gap}")
    line = f"lossless: {identical + near}/{s['compared']} ({', '.join(parts)})"
    if mismatches:
        line += (f"; {mismatches} MISMATCH{'ES' if mismatches != 1 else ''}: beyond the measured numerical noise, a "
                 "bug (each record's `lossless` says where and why)")
    if s.get("unclassified"):
        line += f"; {s['unclassified']} unclassified"
    return line


def work_text(s: dict) -> str:
    """'over 811 of 877 tokens emitted alike' (+ the flag when the cell is unlike: analysis/identical_work.py)."""
    work = s.get("identical_work") or {}
    if not work:
        return ""
    text = f"over {work['tokens']} of {work['method_tokens']} tokens emitted alike"
    if work.get("missing_clock"):
        text += f"; {work['missing_clock']} diverged prompt(s) without a step clock count their identical turns only"
    if work.get("estimated_clock"):
        text += f"; {work['estimated_clock']} clock(s) estimated from per-forward times"
    if work.get("flagged"):
        text += (f"; UNLIKE: the shared prefix covers {fmt(work.get('shared_fraction'), '.0%')} of the shorter outputs"
                 f", lengths {fmt(work.get('length_ratio'))}x greedy's")
    return text


def speedup_text(s: dict) -> str:
    """'1.42x [1.35, 1.49]' (paired, 95% interval), '1.42x ±0.03' (unpaired, std over repeats) or '-'."""
    speedup = s.get("speedup")
    if speedup is None:
        return "-"
    if s.get("speedup_ci95"):
        lo, hi = s["speedup_ci95"]
        return f"{speedup:.2f}x [{lo:.2f}, {hi:.2f}]"
    return f"{speedup:.2f}x" + (f" ±{s['speedup_std']:.2f}" if s.get("speedup_std") else "") + \
        (" unpaired" if s.get("paired") is False else "")


ALPHA_SHOWN = 8  # positions of α_k the headline prints


def alpha_text(alpha: list | None, shown: int = ALPHA_SHOWN) -> str:
    """'0.71 0.55 0.43': α_1, α_2, ... up to the first position without data, at most ``shown`` of them ('…' when
    more had data); '' when there is none (greedy, records without ``proposed``)."""
    values = []
    for value in alpha or []:
        if value is None:
            break
        values.append(value)
    return " ".join(f"{v:.2f}" for v in values[:shown]) + (" …" if len(values) > shown else "")


def summary_rows(summaries: list[tuple[str, dict]]) -> list[list[str]]:
    rows = []
    for name, s in summaries:
        identical, speedup_txt = identity_text(s), speedup_text(s)
        rows.append([name, str(s.get("prompts", 0)), str(s.get("new_tokens", 0)), fmt(s.get("tok_per_s")),
                     fmt(s.get("ms_per_token"), ".1f"), speedup_txt, fmt(s.get("tau")), fmt(s.get("acceptance_rate")),
                     identical, accuracy_text(s.get("accuracy"))])
    return rows


def render_table(summaries: list[tuple[str, dict]]) -> str:
    rows = [list(COLUMNS)] + summary_rows(summaries)
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_headline(name: str, s: dict) -> str:
    """The key numbers of the measured method, one per line."""
    lines = [f"method: {name}" + (f" ({s['dtype']}, {s['threads']} threads)" if s.get("dtype") else ""),
             f"tokens/s: {fmt(s.get('tok_per_s'))} (mean of per-prompt rates {fmt(s.get('tok_per_s_prompt_mean'))})",
             f"latency per token: {fmt(s.get('ms_per_token'), '.1f')} ms"]
    if s.get("is_baseline"):
        lines.append("speedup vs greedy: 1.00x (this run is the baseline)")
    elif s.get("speedup") is not None and s.get("paired"):
        unpaired = (f"; {s['unpaired_records']} record(s) without their baseline left out"
                    if s.get("unpaired_records") else "")
        if s.get("identical_work"):
            whole = {"speedup": s.get("speedup_whole"), "speedup_ci95": s.get("speedup_whole_ci95")}
            lines.append(f"speedup vs greedy over identical work: {speedup_text(s)} (mean of paired per-prompt ratios, "
                         f"95% interval; {work_text(s)})")
            lines.append(f"  whole outputs: {speedup_text(whole)}; Σtokens/Σtime {s['speedup_total']:.2f}x "
                         f"({s['pairs']} pair(s){unpaired})")
        else:
            lines.append(f"speedup vs greedy: {speedup_text(s)} (mean of {s['pairs']} paired ratio(s), 95% interval; "
                         f"Σtokens/Σtime {s['speedup_total']:.2f}x{unpaired})")
    elif s.get("speedup") is not None:
        lines.append(f"speedup vs greedy: {s['speedup']:.2f}x (unpaired: the baseline was timed separately"
                     + (f"; {work_text(s)})" if s.get("identical_work") else ")"))
    if s.get("serving"):  # a served run: the level's throughput and latencies instead of a batch's
        lines.append(serving_line(s))
    elif s.get("batch_size"):  # engine=vllm: the numbers above are per request (latency); throughput per batch
        line = (f"batch size {s['batch_size']} ({s.get('engine', '')}): throughput "
                f"{fmt(s.get('batch_tok_per_s'))} tok/s")
        if not s.get("is_baseline") and s.get("throughput_speedup") is not None:
            ci = s.get("throughput_speedup_ci95")
            line += (f", speedup vs greedy at this batch size {s['throughput_speedup']:.2f}x"
                     f"{f' [{ci[0]:.2f}, {ci[1]:.2f}]' if ci else ''} (mean of {s.get('batches', 0)} paired batch(es))")
        lines.append(line)
    tuned = s.get("tuned")
    if tuned:
        lines.append(f"proposal length: auto -> {tuned['chosen']} (predicted {tuned['predicted']:.2f}x greedy from "
                     "the warm-up prompt's acceptance and this machine's T(k))")
    limit = s.get("bound")
    if limit and not s.get("is_baseline"):
        ratio = limit.get("verify_ratio")
        verify = f"; T({ratio['k']})/T(1) = {ratio['ratio']:.2f}" if ratio else ""
        far = limit.get("long_context")
        where = (f" (each forward priced at its context, between tables after {limit.get('prompt_tokens')} and "
                 f"{far['prompt_tokens']} tokens)") if far else ""
        lines.append(f"bound from this machine's forward costs: {limit['bound']:.2f}x{verify}; efficiency "
                     f"(Σ/Σ speed-up / bound) {fmt(limit.get('efficiency'))}{where}")
        split = limit.get("split")
        if split:  # costs.forward_split: efficiency = forwards x host
            method, base = split["method"], split["baseline"]
            lines.append(f"  = forwards {split['forwards']:.2f} (in the loop at {method['vs_table']:.2f}x their "
                         f"table, greedy's at {base['vs_table']:.2f}x) x host work {split['host']:.2f} (forwards "
                         f"{method['forward_share']:.0%} of its wall time, {base['forward_share']:.0%} of greedy's)")
    if s.get("identical_work"):
        lines.append(f"tau (tokens per target forward over identical work, pooled): {fmt(s.get('tau'))} (per-prompt "
                     f"mean {fmt(s.get('tau_prompt_mean'))}; whole outputs {fmt(s.get('tau_whole'))})")
    else:
        lines.append(f"tau (mean tokens per target forward): {fmt(s.get('tau'))}")
    lines.append(f"acceptance rate: {fmt(s.get('acceptance_rate'))}")
    alpha = alpha_text(s.get("alpha"))
    if alpha:
        lines.append(f"α_k (per-position acceptance): {alpha}")
    if s.get("compared"):
        lines.append(lossless_text(s))
    acc = s.get("accuracy")
    if acc:
        counted = f"over {acc['scored']} scored prompt(s)" if acc["scored"] else f"{acc['not_scored']} prompt(s)"
        lines.append(f"task score: {accuracy_text(acc)} {counted}")
    return "\n".join(lines)


def serving_line(s: dict) -> str:
    """A served run's level (analysis/latency.serving_metrics): throughput on both servers, the paired per-user
    speed-up, median latencies and the server's own acceptance."""
    v, load = s["serving"], s["serving"].get("load", {})
    level = f"concurrency {load.get('value', 0):g}" if load.get("kind") == "concurrency" else \
        f"{load.get('value', 0):g} requests/s"
    line = (f"served ({s.get('engine', '')}, {level}, {load.get('requests')} requests): throughput "
            f"{fmt(v.get('served_tok_per_s'))} tok/s, TTFT p50 {fmt(v.get('ttft_p50_ms'), '.0f')} ms, TPOT p50 "
            f"{fmt(v.get('tpot_p50_ms'), '.0f')} ms")
    if v.get("baseline_served_tok_per_s") is not None:
        ci = v.get("user_speedup_ci95")
        line += (f"; without speculation {fmt(v['baseline_served_tok_per_s'])} tok/s, TPOT p50 "
                 f"{fmt(v.get('baseline_tpot_p50_ms'), '.0f')} ms; per-user speed-up {fmt(v.get('user_speedup'))}x"
                 f"{f' [{ci[0]:.2f}, {ci[1]:.2f}]' if ci else ''}, throughput {fmt(v.get('throughput_ratio'))}x")
    if v.get("server_acceptance") is not None:
        line += f"; server acceptance {v['server_acceptance']:.1%}"
        if v.get("server_accept_length") is not None:
            line += f", acceptance length {v['server_accept_length']:.2f}"
    return line

