"""What one decoding step of each method costs, in greedy steps, on a machine that has no weights.

``python -m specbench.step_costs --target <dir with config.json> --draft <dir> --device cuda`` builds the pair
from its configs alone (random weights, the same shapes and kernels: a step's cost does not depend on what the
weights say) plus a random feature head of the shape ours have, and times greedy, speculative decoding (γ) and
the feature-head methods' trees side by side, interleaved round by round, in one process.

Reads: ms per step after the prefill, and ``cost`` = a method step / a greedy step, each round's ratio
between steps timed back to back (95% interval over rounds). A method's speed-up at acceptance length τ
(tokens per step, measured with the real weights anywhere: at T = 0 it does not depend on the machine) is then
about τ / cost. With random weights every draft is rejected, so each step emits one token: the cost is that of
a full step (draft, tree, verify, cache bookkeeping), not of a short one.

``--execution eager,graphs`` (the default ``eager,auto`` is that on CUDA) runs every method in each mode side by
side, each against its own mode's greedy, and adds per mode the bare forward costs T(k) and per method the
forwards' own ms per step (target, draft and draft-head forwards, each by its own cost table) and the overhead =
step / forwards: what the loop, sampling and cache bookkeeping add to them (with graphs the target is <= 1.10x).

For a machine where the real weights cannot go (a lent GPU without the hub): what would the τ we measured buy
there? Prints a table and, with ``--json``, writes it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from .environment import device_name
from .errors import ConfigError
from .analysis.metrics import bootstrap_mean_ci
from .backends.execution import resolve_execution
from .models.pair import ModelPair, prepare_for_inference
from .backends.precision import resolve_precision
from .timing import Stopwatch

# (name, top_k K, depth D, max_nodes): the default tree, EAGLE-2-like on a CPU budget, EAGLE-2's GPU tree
TREES = (("default", 4, 4, 10), ("mid", 8, 5, 24), ("eagle2_gpu", 10, 6, 60))


def config_of(path: str, key: str):
    from transformers import AutoConfig

    where = Path(path).expanduser()
    if not (where / "config.json").is_file() and not (where.name == "config.json" and where.is_file()):
        raise ConfigError(f"{key}: {path!r} has no config.json; give a Hugging Face checkpoint directory (only "
                          "its config.json is read)")
    return AutoConfig.from_pretrained(where.parent if where.name == "config.json" else where)


def random_model(config, precision, seed: int):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(precision.device):
        model = AutoModelForCausalLM.from_config(config, dtype=precision.torch_dtype)
    return prepare_for_inference(model, precision.device, precision)


class IdsOnly:
    """The tokenizer stand-in: the prompt is random ids, so only the vocabulary's size is asked for."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def random_head_dir(target_config, kind: str, draft_vocab: int, directory: Path) -> str:
    from .models.heads.draft_head import DraftHead, HeadConfig
    from .models.heads.artifact import save_head

    config = HeadConfig.for_target(target_config, kind, draft_vocab_size=draft_vocab)
    ids = torch.randperm(target_config.vocab_size, generator=torch.Generator().manual_seed(0))[:draft_vocab]
    save_head(directory, DraftHead(config).init_weights(seed=1), ids.sort().values if draft_vocab else None,
              {"step_costs": "random weights"})
    return str(directory)


def methods_for(pair, args, head_dir: str, suffix: str = "") -> dict:
    from .methods.feature_head import FeatureHeadMethod
    from .methods.greedy import Greedy
    from .methods.speculative import SpeculativeDecoding

    methods = {"greedy" + suffix: Greedy(pair, "greedy"),
               f"speculative γ={args.gamma}{suffix}": SpeculativeDecoding(pair, "speculative", gamma=args.gamma)}
    for tree, k, depth, nodes in TREES:
        methods[f"{args.kind} {tree} (K {k}, D {depth}, {nodes} nodes){suffix}"] = FeatureHeadMethod(
            pair, args.kind, kind=args.kind, head=head_dir, top_k=k, depth=depth, max_nodes=nodes)
    return methods


def step_of(method, prompt: list[int], new_tokens: int, watch: Stopwatch) -> tuple[float, object]:
    """(ms per step after the prefill mark: decode time over the target forwards after it, the Generation)."""
    watch.start()
    gen = method.generate(prompt, new_tokens, set(), timeline=watch)
    total = watch.stop()
    steps = gen.target_forwards - 1
    return 1000 * (total - watch.marks.get("prefill", 0.0)) / max(steps, 1), gen


def ms_per_step(method, prompt: list[int], new_tokens: int, watch: Stopwatch) -> float:
    return step_of(method, prompt, new_tokens, watch)[0]


def forwards_ms_per_step(gen, target_costs: dict, draft_costs: dict | None, head_costs: dict | None = None) -> float:
    """What the forwards of the timed steps cost by the forward-cost tables: the target's after its first (the
    prefill), the draft's after its first (which reads the prompt before the first step) and every draft-head
    forward (none runs before the first step), per step."""
    from .analysis.costs import interpolate

    sizes = gen.forward_sizes
    total = sum(interpolate(target_costs, k) for k in sizes.get("target", [])[1:])
    if draft_costs:
        total += sum(interpolate(draft_costs, k) for k in sizes.get("draft", [])[1:])
    if head_costs:
        total += sum(interpolate(head_costs, k) for k in sizes.get("head", []))
    return total / max(gen.target_forwards - 1, 1)


def measure(methods: dict, prompt: list[int], new_tokens: int, rounds: int, device, baseline_of=None,
            forward_costs: dict | None = None, mode_of=None, after_warm_up=None) -> dict:
    """Every method timed once per round, all interleaved in one process; cost = a step over its baseline's
    (``baseline_of[name]``, default greedy) step in the same round. With ``forward_costs`` ({mode: (target
    table, draft table)}) also the forwards' own ms per step and overhead = step / forwards (loop, sampling,
    cache bookkeeping: all that is not a model or head forward; ``forward_costs`` values may hold a third table, the
    draft head's forwards, for the methods that run one). ``after_warm_up()`` is called between
    the warm-up and the timed rounds."""
    watch = Stopwatch(device)
    for method in methods.values():  # warm-up, a whole generation each: kernels, allocator, caches, clocks
        ms_per_step(method, prompt, new_tokens, watch)
    if after_warm_up is not None:
        after_warm_up()
    times: dict[str, list[float]] = {name: [] for name in methods}
    gens: dict[str, object] = {}
    for _ in range(rounds):
        for name, method in methods.items():
            ms, gens[name] = step_of(method, prompt, new_tokens, watch)
            times[name].append(ms)
    rows = {}
    for name, values in times.items():
        base = times[(baseline_of or {}).get(name, "greedy")]
        ratios = [v / g for v, g in zip(values, base)]
        rows[name] = {"ms_per_step": statistics.median(values), "cost": statistics.fmean(ratios),
                      "cost_ci": bootstrap_mean_ci([[r] for r in ratios]), "ms": values}
        if forward_costs:
            tables = forward_costs[mode_of(name) if mode_of else next(iter(forward_costs))]
            forwards = forwards_ms_per_step(gens[name], *tables)
            rows[name].update(forwards_ms_per_step=forwards, overhead=rows[name]["ms_per_step"] / forwards)
    return rows


FORWARD_SIZES = (1, 2, 4, 5, 8, 16, 32, 64)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specbench.step_costs", description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, help="checkpoint dir whose config.json shapes the target")
    parser.add_argument("--draft", help="checkpoint dir whose config.json shapes the draft (speculative)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--execution", default="eager,auto",
                        help="execution modes side by side, comma-separated: eager, static, graphs, auto (graphs on "
                             "CUDA, eager elsewhere); default eager,auto")
    parser.add_argument("--kind", default="griffin", choices=("griffin", "eagle"))
    parser.add_argument("--draft-vocab", type=int, default=32000, help="the head's reduced vocabulary (0: full)")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the table here")
    args = parser.parse_args(argv)
    try:
        target_config = config_of(args.target, "--target")
        draft_config = config_of(args.draft, "--draft") if args.draft else None
        precision = resolve_precision(args.dtype, args.device)
        modes = []
        for mode in args.execution.split(","):
            execution = resolve_execution(mode.strip(), args.device, key="--execution")
            if execution.mode not in [m.mode for m in modes]:
                modes.append(execution)
    except ConfigError as error:
        sys.exit(f"error: {error}")
    print(f"[step_costs] {precision.dtype} on {precision.device} ({precision.reason}); random weights; execution "
          f"{', '.join(m.mode for m in modes)}", flush=True)
    target = random_model(target_config, precision, seed=0)
    draft = random_model(draft_config, precision, seed=1) if draft_config is not None else target
    eager = ModelPair(name="step-costs", target=target, draft=draft, tokenizer=IdsOnly(target_config.vocab_size),
                      eos_ids=set(), precision=precision, info={"target": f"random({args.target})"})
    pairs = {m.mode: eager.with_execution(m) for m in modes}
    prompt = torch.randint(0, target_config.vocab_size, (args.prompt_tokens,),
                           generator=torch.Generator().manual_seed(2)).tolist()
    several = len(pairs) > 1
    with tempfile.TemporaryDirectory() as tmp:
        head_dir = random_head_dir(target_config, args.kind, args.draft_vocab, Path(tmp) / "head")
        methods, baseline_of, mode_of = {}, {}, {}
        for mode, pair in pairs.items():
            suffix = f" @{mode}" if several else ""
            for name, method in methods_for(pair, args, head_dir, suffix).items():
                methods[name], baseline_of[name], mode_of[name] = method, "greedy" + suffix, mode
        for pair in pairs.values():
            if pair.execution.static:  # every cache sized and every graph captured before anything is timed
                pair.reserve(args.prompt_tokens + args.new_tokens + 16)
        forward_costs = {mode: forward_tables(pair, prompt, [m for name, m in methods.items() if mode_of[name] == mode])
                         for mode, pair in pairs.items()}
        captured = {}  # graphs captured by the end of the warm-up, then by the end of the timed rounds
        count = lambda: sum(p.captures[0] for p in pairs.values())  # noqa: E731
        rows = measure(methods, prompt, args.new_tokens, args.rounds, eager.device, baseline_of, forward_costs,
                       mode_of.get, after_warm_up=lambda: captured.update(warm=count()))
        captured["timed"] = count() - captured["warm"]
    for mode, tables in forward_costs.items():
        print(f"forward ms, {mode}: " + "; ".join(f"{role} " + " ".join(f"{k}:{table[k]:.2f}" for k in FORWARD_SIZES)
                                                  for role, table in zip(("target", "draft", "head"), tables) if table))
    print(f"{'method':<54} {'ms/step':>8} {'cost (greedy steps)':>22} {'forwards':>9} {'overhead':>9}")
    for name, row in rows.items():
        ci = row["cost_ci"]
        interval = f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        print(f"{name:<54} {row['ms_per_step']:8.2f} {row['cost']:8.2f} {interval:>13} "
              f"{row['forwards_ms_per_step']:9.2f} {row['overhead']:8.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": device_name(eager.device), "dtype": precision.dtype, "torch": torch.__version__,
            "args": vars(args), "executions": {mode: p.execution.as_record() for mode, p in pairs.items()},
            "captures": {mode: {"graphs": p.captures[0], "seconds": p.captures[1]} for mode, p in pairs.items()},
            "captured_while_timed": captured["timed"],
            "forward_ms": {mode: dict(zip(("target", "draft", "head"), tables))
                           for mode, tables in forward_costs.items()},
            "rows": rows}, indent=1))


def forward_tables(pair, prompt: list[int], methods=()) -> tuple[dict, dict | None, dict | None]:
    """ms per target, draft and (the first of ``methods`` that runs one) draft-head forward of k tokens after
    ``prompt``, in the pair's execution mode (None: no draft model, no head)."""
    from .analysis.costs import measure_costs

    target = measure_costs(pair.lm("target"), prompt, sizes=FORWARD_SIZES)
    draft = measure_costs(pair.lm("draft"), prompt, sizes=FORWARD_SIZES) if pair.draft is not pair.target else None
    probe = next((m.head_cost_probe() for m in methods if hasattr(m, "head_cost_probe")), None)
    head = measure_costs(probe, prompt, sizes=FORWARD_SIZES) if probe is not None else None
    return target, draft, head


if __name__ == "__main__":
    main()
