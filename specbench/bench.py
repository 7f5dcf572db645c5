"""``make bench``: greedy, speculative, hf_assisted, lookahead and ouroboros on the same prompts, one process,
interleaved; the forward-cost table; each method's speed-up against the bound those costs allow.

The pair is loaded once. For each prompt all methods run back to back in one round (the runner's paired
rounds, the order rotated from prompt to prompt), so drift on a shared machine hits all of them alike and
every speed-up is a mean of per-prompt paired ratios with a 95% bootstrap interval. ``--fp32`` adds greedy
on a float32 copy of the target to every round (the dtype's own gain, side by side). Several backends or
execution modes run side by side in the same rounds, each method paired with and checked against its own
variant's greedy (the runner's ``baselines``). Then the cost table (analysis/costs.py): T(k)/T(1) for the target
and the draft, k = 1..32, and per method: tok/s, paired speed-up, τ, the bound (the CLI's: engines/hf.method_bound)
and efficiency = speed-up / bound.

A Hydra app; its keys are conf/bench.yaml's (``--help`` lists them):

    python -m specbench.bench datasets=[gsm8k,humaneval] limit=2 max_new_tokens=128 [fp32=true]
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import hydra
import torch
from hydra import compose
from omegaconf import DictConfig, ListConfig, OmegaConf

from .analysis import costs as cost_model
from .run.components import build
from .conf_dir import group_options
from .cli import run_app
from .environment import available_cores, check_threads, environment
from .errors import ConfigError, fail, require, positive_int
from .analysis.metrics import compare, fmt, summarize
from .backends.choice import BACKENDS, backend_of_config
from .backends.execution import Execution, execution_of_config
from .backends.precision import precision_of_config
from .analysis.console import render_table, speedup_text
from .report.experiment import hydra_context
from .engines.hf import cost_table_store, method_bound
from .engines.loops import LoopBackend
from .run.runner import Entry, Runner, RunSpec

FP32_GREEDY = "greedy_fp32"


def option_list(cfg: DictConfig, key: str, group: str) -> list[str]:
    """``cfg[key]``: a list of conf/<group> options (one name alone is a list of one)."""
    value = cfg[key]
    value = [value] if isinstance(value, str) else value
    options = group_options(group, presets=True)
    require(isinstance(value, (list, ListConfig)) and len(value) > 0, key,
            f"must be a list of conf/{group} options, e.g. {key}=[{options[0]}], got {value!r}")
    for name in value:
        require(name in options, key, f"{name!r} is not a conf/{group} option; valid: "
                f"{[o for o in options if '/' not in o]} (and the presets in conf/{group}/<folder>/)")
    return [str(name) for name in value]


def validate(cfg: DictConfig) -> None:
    """Every key of conf/bench.yaml, before any model loads."""
    for key in ("limit", "max_new_tokens", "gamma", "cost_repeats"):
        positive_int(cfg[key], key)
    require(cfg.cost_tables in ("reuse", "measure"), "cost_tables",
            f"must be reuse (kept tables where they still hold) or measure, got {cfg.cost_tables!r}")
    require(isinstance(cfg.warmup, int) and not isinstance(cfg.warmup, bool) and cfg.warmup >= 0, "warmup",
            f"must be an integer >= 0, got {cfg.warmup!r}")
    positive_int(cfg.threads, "threads", optional=True, meaning="torch threads")
    require(isinstance(cfg.oversubscribe, bool), "oversubscribe", f"must be true or false, got {cfg.oversubscribe!r}")
    check_threads(cfg.threads, cfg.oversubscribe, "threads", "oversubscribe")
    require(isinstance(cfg.fp32, bool), "fp32", f"must be true or false, got {cfg.fp32!r}")
    temperature, top_p = cfg.temperature, cfg.top_p
    require(isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature >= 0,
            "temperature", f"must be a number >= 0, got {temperature!r}")
    require(isinstance(top_p, (int, float)) and not isinstance(top_p, bool) and 0 < top_p <= 1, "top_p",
            f"must be a number > 0 and <= 1, got {top_p!r}")
    require(isinstance(cfg.out, str) and cfg.out != "", "out", f"must be a directory, got {cfg.out!r}")
    option_list(cfg, "datasets", "data")
    option_list(cfg, "methods", "method")
    precision_of_config(OmegaConf.merge(cfg.model, {"backend": "transformers"}))  # a bad dtype/device/kernel
    variants(cfg)  # graphs on a CPU, an unknown mode or backend: the same


def variants(cfg: DictConfig) -> list[tuple[str, str, Execution]]:
    """(backend, label, execution) of every pair variant the methods run on, side by side: each of ``backends``
    that this pair and machine can run (a pair without GGUF files, a machine without llama-cpp-python: left out,
    with the reason printed), transformers in each of ``executions``. Labels suffix the method names (name@label)
    when there is more than one variant."""
    value = cfg.backends
    value = [value] if isinstance(value, str) else value
    require(isinstance(value, (list, ListConfig)) and len(value) > 0 and all(b in BACKENDS for b in value),
            "backends", f"must be a list of {list(BACKENDS)}, e.g. backends=[transformers,llamacpp], got {value!r}")
    chosen: list[str] = []
    for requested in value:
        try:
            backend = backend_of_config(OmegaConf.merge(cfg.model, {"backend": requested})).name
        except ConfigError as exc:
            if len(value) == 1:
                raise
            print(f"[specbench.bench] backend {requested} left out: {exc}", file=sys.stderr)
            continue
        if backend not in chosen:
            chosen.append(backend)
    require(chosen, "backends", f"none of {list(value)} runs pair '{cfg.model.get('name')}' here")
    modes = executions(cfg) if "transformers" in chosen else []
    out = []
    for backend in chosen:
        if backend == "llamacpp":
            out.append((backend, "llamacpp", Execution()))
            continue
        for execution in modes:
            label = execution.mode if chosen == ["transformers"] else (
                "transformers" if len(modes) == 1 else f"transformers-{execution.mode}")
            out.append((backend, label, execution))
    return out


def executions(cfg: DictConfig) -> list[Execution]:
    """``executions``: the modes every method runs in, side by side (each resolved for the pair's device; a mode
    that resolves to one already listed, auto = eager on a CPU, is measured once)."""
    value = cfg.executions
    value = [value] if isinstance(value, str) else value
    require(isinstance(value, (list, ListConfig)) and len(value) > 0, "executions",
            f"must be a list of execution modes, e.g. executions=[eager,static], got {value!r}")
    resolved: list[Execution] = []
    for mode in value:
        execution = execution_of_config(OmegaConf.merge(cfg.model, {"execution": mode}))
        if execution.mode not in [e.mode for e in resolved]:
            resolved.append(execution)
    return resolved


def compose_all(cfg: DictConfig):
    """The pair's config (and its float32 copy with fp32=true), each method's and each dataset's config."""
    base = cfg.model
    fp32 = OmegaConf.merge(cfg.model, {"dtype": "float32", "backend": "transformers"}) if cfg.fp32 else None
    with hydra_context():  # the main config's groups; Hydra's own when this runs as the app
        methods = {m: compose(config_name="config", overrides=[f"method={m}"]).method
                   for m in option_list(cfg, "methods", "method")}
        data = [compose(config_name="config", overrides=[f"data={d}", f"data.limit={cfg.limit}",
                                                        f"data.max_new_tokens={cfg.max_new_tokens}"]).data
                for d in option_list(cfg, "datasets", "data")]
    return base, fp32, methods, data


@hydra.main(version_base="1.3", config_path="../conf", config_name="bench")
def app(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except ConfigError as exc:  # a bad key: one clear line, no traceback
        fail("specbench.bench", exc)


def main(argv: list[str] | None = None) -> None:
    run_app(app, "specbench.bench", "bench", sys.argv[1:] if argv is None else argv)


def run(cfg: DictConfig) -> dict:
    """The bench from its config (conf/bench.yaml); returns what result.json holds."""
    validate(cfg)
    threads = cfg.threads or available_cores()
    torch.set_num_threads(threads)
    base, fp32_cfg, method_cfgs, data_cfgs = compose_all(cfg)
    pairs: dict = {}  # label -> the pair it runs on: one load per backend, execution modes on the same weights
    loaded: dict = {}
    for backend, label, execution in variants(cfg):
        if backend not in loaded:
            loaded[backend] = build(OmegaConf.merge(base, {"backend": backend}), "model")
        first = loaded[backend]
        pairs[label] = first if first.execution.mode == execution.mode else first.with_execution(execution)
    pair = next(iter(pairs.values()))
    sampling = dict(temperature=float(cfg.temperature), top_p=float(cfg.top_p), seed=0)  # prompt i: seed + i
    for name, method_cfg in method_cfgs.items():
        if "gamma" in method_cfg and name in ("speculative", "hf_assisted"):
            method_cfg.gamma = cfg.gamma
    built = {}
    for mode, mode_pair in pairs.items():
        for name, method_cfg in method_cfgs.items():
            label = name if len(pairs) == 1 else f"{name}@{mode}"
            try:
                built[label] = build(method_cfg, "method", pair=mode_pair, **sampling)
            except ConfigError as exc:  # a method this variant cannot run (hf_assisted on llama.cpp, ...)
                if name == next(iter(method_cfgs)):
                    raise
                print(f"[specbench.bench] {label} left out: {exc}", file=sys.stderr)
    if fp32_cfg is not None:
        built[FP32_GREEDY] = build(method_cfgs[next(iter(method_cfgs))], "method", pair=build(fp32_cfg, "model"),
                                   **sampling)
    names = list(built)
    first = next(iter(method_cfgs))  # each mode's baseline: the first method in that mode
    baseline_of = {name: (first if len(pairs) == 1 else f"{first}@{name.rsplit('@', 1)[1]}") if name != FP32_GREEDY
                   else names[0] for name in names}
    # each method checked against its own variant's greedy in the same round (the runner; the float32 greedy is
    # another model: no claim), the first variant's greedy the round's anchor
    baselines = [names.index(baseline_of[name]) for name in names]
    out = Path(cfg.out) / time.strftime("%Y%m%d-%H%M%S")
    records = {name: [] for name in names}
    first_prompt = None
    for data_cfg in data_cfgs:
        dataset = build(data_cfg, "data")
        backend = LoopBackend(pair, cfg.max_new_tokens, warmup=cfg.warmup, chat=dataset.chat_template,
                              threads=threads, exact=cfg.temperature == 0)
        runner = Runner(backend, progress=False, scorer=dataset.scorer)
        examples = dataset.examples()
        first_prompt = first_prompt or backend.encode([{"role": "user", "content": examples[0].prompt}], False)
        entries = [Entry(built[n], RunSpec(key="bench", method=n, pair=pair.name, data=dataset.name, records_dir=out))
                   for n in names]
        measured = runner.run(entries, examples, dataset.warmup_example(), order_offset=len(records[names[0]]),
                              baselines=baselines)
        for name, recs in zip(names, measured):
            records[name] += recs
            for r in recs:
                print(f"{dataset.name} {r.prompt_id:>14} {name:<12} {r.new_tokens:4d} tok {r.wall_s:7.2f} s "
                      f"{r.new_tokens / r.wall_s:6.2f} tok/s", flush=True)
    baseline = records[names[0]]
    # the fp32 greedy is another model (dtype): timed for its speed, its tokens are not expected to be greedy's
    # at temperature > 0 outputs are samples: compared by distribution (the tests), not token by token
    # every method against its own mode's greedy, timed in the same rounds (a mode's greedy against the first's)
    exact = sampling["temperature"] == 0
    # a variant's greedy against the first variant's: the same tokens are expected only on the same backend
    summaries = {name: summarize(recs, records[baseline_of[name]] if name != baseline_of[name] else baseline,
                                 exact=exact and name != FP32_GREEDY and (
                                     name != baseline_of[name] or built[name].pair.backend == pair.backend),
                                 is_baseline=name == names[0])
                 for name, recs in records.items()}
    print(render_table(list(summaries.items())))

    forward_ms, efficiency = {}, {}
    for mode, mode_pair in pairs.items():
        if mode_pair.sized_to_the_run:  # room for the largest block the cost table feeds (no regrowth mid-table)
            mode_pair.reserve(len(first_prompt) + max(cost_model.TABLE_SIZES + cost_model.EXTRA_SIZES))
        sizes = cost_model.TABLE_SIZES + cost_model.EXTRA_SIZES  # each forward priced with its rows of logits
        target_costs = cost_model.measure_forward_costs(mode_pair.lm("target"), first_prompt, sizes,
                                                        repeats=cfg.cost_repeats)
        draft_costs = (cost_model.measure_forward_costs(mode_pair.lm("draft"), first_prompt, sizes,
                                                        repeats=cfg.cost_repeats)
                       if mode_pair.draft is not None else None)
        print(f"{mode}: " + (f"llama.cpp {mode_pair.info['backend']['llama_cpp_python']}, "
                              f"{mode_pair.info['gguf']['quantization']}" if mode_pair.backend == "llamacpp"
                              else f"transformers {mode_pair.dtype}, {mode_pair.execution.describe()}"))
        print_cost_table(target_costs, draft_costs)
        mine = [n for n in names if n == FP32_GREEDY and mode_pair is pair or n != FP32_GREEDY and (
            len(pairs) == 1 or n.endswith(f"@{mode}"))]
        store = (cost_table_store(OmegaConf.to_container(base, resolve=True), mode_pair, threads)
                 if cfg.cost_tables == "reuse" else None)
        bounds = {n: method_bound(built[n], records[n], records[baseline_of[n]], first_prompt, store,
                                  repeats=cfg.cost_repeats, reuse_key="cost_tables")
                  for n in mine if n not in (baseline_of[n], FP32_GREEDY)}  # the float32 greedy: another model
        efficiency.update(efficiency_rows(mine, summaries, bounds, baseline_of))
        forward_ms[mode] = {"target": target_costs.as_record(), "draft": draft_costs and draft_costs.as_record()}
    native = {}
    for mode, mode_pair in pairs.items():  # our greedy loop on llama.cpp against llama.cpp's own (in C)
        if mode_pair.backend == "llamacpp":
            from .llamacpp_reference import compare_greedy

            native[mode] = compare_greedy(mode_pair, first_prompt, cfg.max_new_tokens)
            n = native[mode]
            print(f"{mode}: our greedy {n['ours_ms_per_token']:.1f} ms/token, llama.cpp's own "
                  f"{n['llamacpp_ms_per_token']:.1f} ms/token: ratio {n['ratio']:.3f} {fmt_ci(n['ratio_ci95'])} "
                  f"over {n['rounds']} interleaved rounds; same tokens: {n['same_tokens']}")
    result = {"command": ["python", "-m", "specbench.bench", *sys.argv[1:]], "env": environment(pair.device),
              "greedy_vs_llamacpp": native,
              "pair": pair.name, "precision": pair.precision.as_record(), "threads": threads,
              "executions": {mode: p.execution.as_record() for mode, p in pairs.items()},
              "backends": {mode: {"name": p.backend, "precision": p.precision.as_record(),
                                  **({"build": p.info["backend"], "gguf": p.info["gguf"]} if p.backend == "llamacpp"
                                     else {})} for mode, p in pairs.items()},
              "max_new_tokens": cfg.max_new_tokens, "gamma": cfg.gamma, "sampling": sampling,
              "forward_ms": forward_ms[next(iter(pairs))] if len(pairs) == 1 else forward_ms, "efficiency": efficiency,
              "summaries": {k: {kk: vv for kk, vv in v.items() if kk not in ("first_divergence", "divergences")}
                            for k, v in summaries.items()}}
    ours, theirs = summaries.get("speculative", {}).get("speedup"), summaries.get("hf_assisted", {}).get("speedup")
    if ours and theirs:
        result["ours_over_hf"] = ours / theirs
        print(f"speculative speedup / hf_assisted speedup = {ours:.2f} / {theirs:.2f} = {ours / theirs:.2f}x")
    if FP32_GREEDY in summaries:  # the dtype's own gain: greedy over greedy in float32, paired per round
        gain = compare(baseline, records[FP32_GREEDY], exact=False)
        result["greedy_over_fp32"] = {"speedup": gain["speedup"], "speedup_ci95": gain["speedup_ci95"]}
        print(f"greedy {pair.dtype} over greedy float32: {speedup_text(gain)}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2, default=str))
    print(f"records and result: {out}")
    return result


def fmt_ci(ci) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""


def print_cost_table(target_costs, draft_costs) -> None:
    """T(k) of a verify block (all k rows of logits: ForwardCosts.at) over the table sizes, and T(k)/T(1)."""
    print("forward cost after the first prompt (median ms, all rows of logits; T(k)/T(1) below)")
    print("k          " + " ".join(f"{k:>6}" for k in cost_model.TABLE_SIZES))
    for label, costs in (("target", target_costs), ("draft", draft_costs)):
        if costs:
            table = cost_model.verify_table(costs)
            print(f"{label:<6} ms  " + " ".join(f"{v:6.1f}" for v in table.values()))
            print(f"{label:<6} x   " + " ".join(f"{v / table[1]:6.2f}" for v in table.values()))


def efficiency_rows(names, summaries, bounds: dict, baseline_of: dict) -> dict:
    """Per method of ``names`` but its baseline (``baseline_of[name]``): tok/s, paired speed-up with its interval,
    τ, the bound (``bounds[name]``: engines/hf.method_bound, as the CLI's summary has it) and speed-up / bound."""
    rows = {}
    print(f"{'method':<14} {'tok/s':>7} {'speed-up [95% CI]':>22} {'Σ/Σ':>5} {'tau':>5} {'bound':>6} "
          f"{'efficiency':>10}")
    for name in names:
        if name == baseline_of[name]:
            continue
        s = summaries[name]
        limit = (bounds.get(name) or {}).get("bound")
        eff = cost_model.efficiency(s.get("speedup_total"), limit)
        rows[name] = {"tok_per_s": s["tok_per_s"], "speedup": s.get("speedup"), "speedup_ci95": s.get("speedup_ci95"),
                      "speedup_total": s.get("speedup_total"), "tau": s.get("tau"), "bound": limit, "efficiency": eff}
        print(f"{name:<14} {fmt(s['tok_per_s']):>7} {speedup_text(s):>22} {fmt(s.get('speedup_total')):>5} "
              f"{fmt(s.get('tau')):>5} {fmt(limit):>6} {fmt(eff):>10}")
    return rows


if __name__ == "__main__":
    main()
