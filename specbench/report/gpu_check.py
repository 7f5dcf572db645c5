"""The report of a ``make gpu-check`` results folder (specbench/gpu_check.py): ``render(results)`` is the Markdown
the check writes beside results.json; ``python -m specbench.report.gpu_check DIR`` renders a kept folder again."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def number(value, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def render(results: dict) -> str:
    lines = [f"# GPU check: {results.get('device')} ({'dry run, ' if results.get('dry_run') else ''}"
             f"{results.get('shapes')} shapes, random weights)", "",
             f"torch {results.get('torch')}, transformers {results.get('transformers')}, Python "
             f"{results.get('python')}, started {results.get('started')}. Command: `python -m specbench.gpu_check"
             f"{' --dry-run' if results.get('dry_run') else ''}`.", "", "## Phases", "",
             "| phase | status | seconds |", "|---|---|---|"]
    for phase, row in results.get("phases", {}).items():
        status = row["status"] + (f": {row['error'].splitlines()[0][:160]}" if row.get("error")
                                  else f" ({row['reason']})" if row.get("reason") else "")
        lines.append(f"| {phase} | {status} | {row.get('seconds', '')} |")
    lines += ["", "## Targets (issue 53: bf16, graphs)", "", "| target | measured | limit | met |", "|---|---|---|---|"]
    for name, row in results.get("targets", {}).items():
        lines.append(f"| {name} | {number(row['value'])} | {row['limit']} | {number(row['met'])} |")
    logits = (results.get("logits") or {}).get("stages")
    if logits:
        lines += ["", "## Logits, graphs against eager (fp32, TF32 off)", "",
                  "| stage | rows | max abs diff | max abs logit | argmax equal |", "|---|---|---|---|---|"]
        for stage, row in logits.items():
            lines.append(f"| {stage} | {row['rows']} | {row['max_abs_diff']:.3g} | {row['max_abs_logit']:.3g} | "
                         f"{number(row['argmax_equal'])} |")
    reads = results.get("host_reads")
    if reads:
        lines += ["", "## Host reads per step (our counter) and CUDA syncs (torch's sync debug mode)", "",
                  "| method | steps | reads/step | CUDA syncs/step | where |", "|---|---|---|---|---|"]
        for name, row in reads.items():
            where = ", ".join(f"{place} ×{count}" for place, count in row["where"].items())
            lines.append(f"| {name} | {row['steps']} | {row['reads_per_step']:.2f} | "
                         f"{number(row['cuda_syncs_per_step'])} | {where} |")
    costs = results.get("step_costs") or {}
    if costs.get("rows"):
        lines += ["", "## Steps (random weights: every draft rejected, one token per step)", "",
                  "| method | ms/step | cost (greedy steps) | forwards ms/step | loop overhead |",
                  "|---|---|---|---|---|"]
        for name, row in costs["rows"].items():
            lines.append(f"| {name} | {row['ms_per_step']:.2f} | {row['cost']:.2f} | "
                         f"{number(row.get('forwards_ms_per_step'))} | {number(row.get('overhead'))} |")
        for mode, tables in costs.get("forward_ms", {}).items():
            target = tables.get("target") or {}
            lines.append(f"\nForward ms, {mode}, target: " + ", ".join(f"T({k}) {v:.2f}" for k, v in target.items()))
    bandwidth = results.get("bandwidth")
    if bandwidth:
        lines += ["", f"Copy bandwidth {bandwidth['copy_gb_per_s']:.0f} GB/s; the target's weights "
                      f"{bandwidth['target_bytes'] / 1e9:.2f} GB: greedy floor {bandwidth['floor_ms']:.3f} ms/token."]
    generate = results.get("compiled_generate")
    if generate:
        lines.append(f"transformers' static-cache generate ({'compiled' if generate['compiled'] else 'not compiled'}):"
                     f" {generate['ms_per_token']:.3f} ms/token over {generate['new_tokens']} tokens.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not (Path(args[0]) / "results.json").is_file():
        sys.exit("usage: python -m specbench.report.gpu_check DIR (a folder holding a gpu-check results.json)")
    folder = Path(args[0])
    text = render(json.loads((folder / "results.json").read_text()))
    (folder / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
