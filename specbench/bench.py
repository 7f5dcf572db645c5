"""``make bench``: greedy, speculative, hf_assisted, lookahead and ouroboros on the same prompts, one
process, interleaved.

The pair is loaded once; for each prompt the methods run back to back (rotating their order), so
drift on a shared machine hits all of them alike. Prints each method's speedup over greedy, the
ratio of our speculative speedup to transformers' assisted generation (target: >= 1.0), and the cost
of the forwards the methods are made of (a target forward over 1 token and over each method's verify
block, a draft forward over 1 token and over Ouroboros' phrase-drafting block), measured here, outside
the methods, after a real prompt.

    python -m specbench.bench --data gsm8k,humaneval --limit 2 --max-new-tokens 128
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from .app import build
from .metrics import fmt, summarize
from .report.console import render_table
from .runner import Runner, RunSpec

CONF = Path(__file__).resolve().parents[1] / "conf"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded", help="conf/model option (default: embedded)")
    parser.add_argument("--data", default="gsm8k,humaneval", help="comma list of conf/data options")
    parser.add_argument("--methods", default="greedy,speculative,hf_assisted,lookahead,ouroboros",
                        help="first one is the baseline")
    parser.add_argument("--limit", type=int, default=2, help="prompts per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=4, help="γ for speculative and hf_assisted")
    parser.add_argument("--cost-repeats", type=int, default=3, help="timed calls per forward-cost entry")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", default="runs/bench", help="where the bench records go")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    methods = args.methods.split(",")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        base = compose(config_name="config", overrides=[f"model={args.model}"])
        method_cfgs = {m: compose(config_name="config", overrides=[f"method={m}"]).method for m in methods}
        data_cfgs = [compose(config_name="config", overrides=[f"data={d}", f"data.limit={args.limit}",
                                                            f"data.max_new_tokens={args.max_new_tokens}"]).data
                     for d in args.data.split(",")]
    pair = build(base.model, "model")
    sampling = dict(temperature=0.0, top_p=1.0, seed=0)
    built = {}
    for name, cfg in method_cfgs.items():
        if "gamma" in cfg and name in ("speculative", "hf_assisted"):
            cfg.gamma = args.gamma
        built[name] = build(cfg, "method", pair=pair, **sampling)
    runner = Runner(pair, args.max_new_tokens, warmup=args.warmup, progress=False)
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    records = {name: [] for name in methods}
    for data_cfg in data_cfgs:
        dataset = build(data_cfg, "data")
        runner.scorer, runner.chat = dataset.scorer, dataset.chat_template  # task score outside the timed region
        warm = dataset.warmup_example()
        for name in methods:  # warm every method once per dataset, outside timing
            runner.warm_up(built[name], warm)
        for index, example in enumerate(dataset.examples()):
            order = methods[index % len(methods):] + methods[: index % len(methods)]
            for name in order:
                spec = RunSpec(key="bench", method=name, pair=pair.name, data=dataset.name, records_dir=out)
                record = runner.measure(built[name], spec, example, index, repeat=0)
                spec.store.append(record)
                records[name].append(record)
                print(f"{dataset.name} {example.id:>14} {name:<12} {record['new_tokens']:4d} tok "
                      f"{record['wall_s']:7.2f} s  {record['new_tokens'] / record['wall_s']:6.2f} tok/s", flush=True)
    baseline = records[methods[0]]
    summaries = {name: summarize(recs, baseline, is_baseline=name == methods[0]) for name, recs in records.items()}
    print(render_table(list(summaries.items())))
    result = {"pair": pair.name, "max_new_tokens": args.max_new_tokens, "gamma": args.gamma,
              "summaries": {k: {kk: vv for kk, vv in v.items() if kk != "first_divergence"} for k, v in summaries.items()}}
    ours, theirs = summaries.get("speculative", {}).get("speedup"), summaries.get("hf_assisted", {}).get("speedup")
    if ours and theirs:
        result["ours_over_hf"] = ours / theirs
        print(f"speculative speedup / hf_assisted speedup = {ours:.2f} / {theirs:.2f} = {ours / theirs:.2f}x "
              f"(target >= 1.0)  [{fmt(summaries['speculative']['tok_per_s'])} vs "
              f"{fmt(summaries['hf_assisted']['tok_per_s'])} tok/s]")
    result["forward_ms"] = forward_costs(pair, built, dataset.examples()[0], runner, args.cost_repeats)
    for label, ms in result["forward_ms"].items():
        print(f"forward cost  {label:<44} {ms:8.1f} ms")
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2, default=str))
    print(f"records and result: {out}")
    return result


def block_sizes(built: dict) -> dict[str, tuple[str, int]]:
    """The largest block each method feeds per step: label -> (model, tokens)."""
    sizes = {"one token (greedy step)": ("target", 1)}
    if "speculative" in built:
        sizes[f"speculative verify (γ+1 = {built['speculative'].gamma + 1})"] = ("target", built["speculative"].gamma + 1)
    if "lookahead" in built:
        la = built["lookahead"]
        n = 1 + (la.window + la.guesses) * (la.ngram - 1)
        sizes[f"lookahead step (1 + (W+G)(N-1) = {n})"] = ("target", n)
    if "ouroboros" in built:
        ob = built["ouroboros"]
        n = 1 + ob.gamma + ob.top_k * (ob.beta - 1)
        sizes[f"ouroboros verify (1 + γ + K(β-1) = {n})"] = ("target", n)
        sizes["draft one token"] = ("draft", 1)
        m = 1 + (ob.draft_window + ob.window) * (ob.beta - 1)
        sizes[f"ouroboros draft phrase step (≤ {m})"] = ("draft", m)
    return sizes


def forward_costs(pair, built: dict, example, runner, repeats: int) -> dict[str, float]:
    """ms per forward of each block size after the example's prompt (median of ``repeats``, sequential blocks)."""
    import statistics

    from .decoding.cached_lm import CachedLM
    from .timing import Stopwatch

    prompt = runner.encode([{"role": "user", "content": example.prompt}], False)
    watch, costs = Stopwatch(pair.device), {}
    for label, (which, n) in block_sizes(built).items():
        model = pair.target if which == "target" else pair.draft
        if model is None:
            continue
        lm = CachedLM(model)
        lm.forward(prompt, keep_last=1)
        times = []
        for _ in range(repeats + 1):  # the first call warms up
            watch.start()
            lm.forward(prompt[-1:] * n)
            times.append(watch.stop())
            lm.crop(len(prompt))
        costs[label] = 1000 * statistics.median(times[1:])
    return costs


if __name__ == "__main__":
    main()
