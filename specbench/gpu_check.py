"""``make gpu-check``: ten minutes on a bare CUDA machine (torch and transformers, no network) that say whether our
loop measures the method and not itself (issue 53).

    python -m specbench.gpu_check [--out DIR] [--work DIR] [--bundle dist/gpu-bundle] [--budget-s 480] [--dry-run]

Phases, each recorded with its seconds and ok / failed / skipped (a failure is written down and the next phase
runs; nothing is lost if a later one is killed, results.json is rewritten after each):

1. ``checkpoints``: random-weight checkpoints at the seed pair's real shapes (Vicuna-7B and the 68M Llama draft
   Spec-Bench pairs it with), written with ``save_pretrained`` beside a tokenizer, then loaded by
   ``models.hub.load_hub_pair``: the route a hub pair takes.
2. ``cuda_tests``: ``tests/test_cuda_graphs.py`` with SPECBENCH_TEST_DEVICE=cuda (real captures; every method on
   the loop identical to greedy in eager and graphs, on the tiny pairs).
3. ``logits``: the target in fp32 with TF32 off, graphs against eager, through the CachedLM interface: a 128-token
   prefill, a 5-token chain, a 61-node tree after a crop, its accepted path kept and one more token.
4. ``host_reads``: host reads per step of greedy, speculative and the EAGLE-2 trees by our counter, and on CUDA
   the synchronizing operations torch itself reports (``set_sync_debug_mode``), side by side.
5. ``step_costs``: ``specbench.step_costs`` at those shapes in bf16, eager and graphs side by side: forward costs
   per mode, ms per step and loop overhead per method (step / the sum of its forwards' replay times), captures
   while timed.
6. ``bandwidth``: the device's copy bandwidth, and the greedy step's floor (the target's bytes read once).
7. ``compiled_generate``: transformers' ``generate`` with a static cache (compiled on CUDA), ms per token, beside
   our graphs greedy.

The targets (issue 53) are judged in ``targets``. ``--dry-run`` runs every phase's code on a CPU with tiny shapes
(static execution in place of graphs, no compile, CUDA tests skipped): what CI checks. Results: DIR/results.json
and DIR/report.md (``specbench.report.gpu_check`` renders it; ``python -m specbench.report.gpu_check DIR``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch

# config.json fields of each shape (LlamaForCausalLM): lmsys/vicuna-7b-v1.3 and JackFram/llama-68m, Spec-Bench's
# SpS pair; "tiny-*" for --dry-run
SHAPES = {
    "vicuna-7b": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 2048},
    "llama-68m": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 2, "num_attention_heads": 12,
                  "num_key_value_heads": 12, "max_position_embeddings": 2048},
    "tiny-target": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "max_position_embeddings": 1024},
    "tiny-draft": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                   "num_key_value_heads": 2, "max_position_embeddings": 1024},
}
PAIRS = {"vicuna-7b": ("vicuna-7b", "llama-68m"), "tiny": ("tiny-target", "tiny-draft")}
VOCAB = 32000
# issue 53's targets (GPU, bf16, graphs)
TARGETS = {"overhead_chain": 1.10, "overhead_tree": 1.25, "floor_ratio": 2.0}


def write_checkpoint(shape: str, directory: Path, device: str, seed: int) -> Path:
    """A random-weight LlamaForCausalLM of ``shape`` saved (bf16 on CUDA, fp32 on a CPU) with a byte tokenizer."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from .models.tiny import byte_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "config.json").is_file() and any(directory.glob("*.safetensors")):
        return directory  # written by an earlier run
    config = LlamaConfig(vocab_size=VOCAB, rms_norm_eps=1e-6, tie_word_embeddings=False, **SHAPES[shape])
    torch.manual_seed(seed)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(directory)
    byte_tokenizer().save_pretrained(directory)
    del model
    return directory


def parameters(shape: str) -> int:
    """The parameter count of a shape (built on the meta device: no memory)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=VOCAB, tie_word_embeddings=False, **SHAPES[shape])
    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())


def load_pair(target: Path, draft: Path, device: str, dtype: str, execution: str):
    from .models.hub import load_hub_pair

    return load_hub_pair("gpu-check", str(target), str(draft), dtype=dtype, device_map=device, execution=execution,
                         attn_implementation="sdpa", local_files_only=True)


def logits_parity(target: Path, draft: Path, device: str, static_mode: str) -> dict:
    """fp32, TF32 off: the static (graphs) target's logits against the eager one's at each stage."""
    from .backends.execution import resolve_execution

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    eager_pair = load_pair(target, draft, device, "float32", "eager")
    static_pair = eager_pair.with_execution(resolve_execution(static_mode, device))
    vocab = eager_pair.vocab_size
    prompt = torch.randint(0, vocab, (128,), generator=torch.Generator().manual_seed(3)).tolist()
    static_pair.reserve(len(prompt) + 128)
    eager, static = eager_pair.lm("target"), static_pair.lm("target")
    generator = torch.Generator().manual_seed(4)
    tree = [-1] + [int(torch.randint(0, i, (1,), generator=generator)) if i > 1 else 0 for i in range(1, 61)]
    tree_ids = torch.randint(0, vocab, (61,), generator=generator).tolist()
    path = [0]
    while any(p == path[-1] for p in tree):  # the first child all the way down: an accepted path
        path.append(tree.index(path[-1]))
    past = len(prompt) + 1
    stages = {
        "prefill (128)": lambda lm: lm.forward(prompt),
        "chain (5)": lambda lm: lm.forward(tree_ids[:5]),
        "tree (61 nodes) after a crop": lambda lm: (lm.crop(len(prompt)), lm.forward([7]),
                                                     lm.forward(tree_ids, parents=tree))[-1],
        "kept path, then one token": lambda lm: (lm.keep_positions(list(range(past)) + [past + n for n in path]),
                                                 lm.forward([11]))[-1],
    }
    rows = {}
    for stage, run in stages.items():
        a, b = run(eager), run(static)
        scale = float(a.abs().max())
        rows[stage] = {"max_abs_diff": float((a - b).abs().max()), "max_abs_logit": scale,
                       "argmax_equal": bool(torch.equal(a.argmax(-1), b.argmax(-1))), "rows": a.shape[0]}
    del eager_pair, static_pair, eager, static
    return {"stages": rows, "ok": all(r["argmax_equal"] and r["max_abs_diff"] <= 1e-3 * max(r["max_abs_logit"], 1)
                                      for r in rows.values())}


def host_reads(target: Path, draft: Path, device: str, static_mode: str, work: Path) -> dict:
    """Per method of step_costs (greedy, speculative, the EAGLE-2 trees; random weights, so one token per step) and
    speculative sampling at T = 1 (three reads per step by design: verify.verify_tree_sampling): host reads per step
    by our counter (backends/host_reads.py) and, on CUDA, the synchronizing operations torch reports, counted over
    one generation after a warm one."""
    from argparse import Namespace

    from .backends.host_reads import count_host_reads, cuda_syncs
    from .methods.speculative import SpeculativeDecoding
    from .step_costs import methods_for, random_head_dir

    pair = load_pair(target, draft, device, "auto", static_mode)
    prompt = torch.randint(0, pair.vocab_size, (128,), generator=torch.Generator().manual_seed(5)).tolist()
    pair.reserve(len(prompt) + 32 + 64)  # 32 new tokens, and the largest tree's 60 nodes past them: no cache grows
    head = random_head_dir(pair.target.config, "eagle", 0, work / "reads-head")
    rows = {}
    methods = methods_for(pair, Namespace(gamma=4, kind="eagle"), head)
    methods["speculative T=1"] = SpeculativeDecoding(pair, "speculative", gamma=4, temperature=1.0)
    for name, method in methods.items():
        method.generate(prompt, 32, set())  # warm: kernels, captures
        with count_host_reads() as reads, cuda_syncs(device) as syncs:
            generation = method.generate(prompt, 32, set())
        steps = len(generation.accept_lengths)
        where = Counter()
        for (_, place), count in reads.items():
            where[place] += count
        rows[name] = {"steps": steps, "reads_per_step": sum(reads.values()) / steps,
                      "cuda_syncs_per_step": len(syncs) / steps if device.startswith("cuda") else None,
                      "where": dict(where.most_common(4))}
    del pair
    return rows


def copy_bandwidth(device: str, megabytes: int = 1024) -> float:
    """GB/s of a device-to-device copy (bytes read + written)."""
    from .timing import Stopwatch

    source = torch.empty(megabytes << 20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    watch = Stopwatch(torch.device(device))
    target.copy_(source)
    best = float("inf")
    for _ in range(5):
        watch.start()
        target.copy_(source)
        best = min(best, watch.stop())
    return 2 * source.numel() / best / 1e9


def compiled_generate(target: Path, device: str, new_tokens: int, compile_: bool) -> dict:
    """transformers' own greedy with a static cache (compiled on CUDA), ms per new token after a 128-token prompt."""
    from transformers import AutoModelForCausalLM

    from .timing import Stopwatch

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype, attn_implementation="sdpa",
                                                 device_map=device).eval()  # straight onto the device
    ids = torch.randint(0, VOCAB, (1, 128), generator=torch.Generator().manual_seed(2)).to(device)
    settings = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                    cache_implementation="static", pad_token_id=0)
    if not compile_:
        settings["disable_compile"] = True
    watch, runs = Stopwatch(torch.device(device)), []
    with torch.inference_mode():
        for attempt in range(4):  # two warm-ups (compilation), two timed
            watch.start()
            model.generate(ids, **settings)
            if attempt >= 2:
                runs.append(watch.stop())
            else:
                watch.stop()
    del model
    return {"ms_per_token": 1000 * min(runs) / new_tokens, "compiled": compile_, "new_tokens": new_tokens}


def judge(results: dict) -> dict:
    """Issue 53's targets from the phases' numbers (None where a phase did not run)."""
    rows = (results.get("step_costs") or {}).get("rows", {})

    def overhead(prefix: str):
        found = [r["overhead"] for name, r in rows.items() if name.startswith(prefix) and name.endswith("@graphs")]
        return found[0] if found else None

    greedy = rows.get("greedy @graphs", {}).get("ms_per_step")
    floor = (results.get("bandwidth") or {}).get("floor_ms")
    compiled = (results.get("compiled_generate") or {}).get("ms_per_token")
    captures = (results.get("step_costs") or {}).get("captured_while_timed")
    tree = next((name for name in rows if "eagle2_gpu" in name and name.endswith("@graphs")), None)
    checks = {
        "greedy loop overhead <= 1.10": (overhead("greedy"), TARGETS["overhead_chain"]),
        "speculative loop overhead <= 1.10": (overhead("speculative"), TARGETS["overhead_chain"]),
        "EAGLE-2 tree (60 nodes) loop overhead <= 1.25": (rows[tree]["overhead"] if tree else None,
                                                          TARGETS["overhead_tree"]),
        "greedy step <= 2x the bandwidth floor": (greedy / floor if greedy and floor else None,
                                                  TARGETS["floor_ratio"]),
        "greedy step <= transformers' compiled static generate": (greedy / compiled if greedy and compiled else None,
                                                                  1.0),
        "graphs captured while timed == 0": (captures, 0),
    }
    return {name: {"value": value, "limit": limit, "met": None if value is None else value <= limit}
            for name, (value, limit) in checks.items()}


def run_phase(results: dict, name: str, out: Path, work) -> None:
    started = time.perf_counter()
    try:
        value = work()
        results[name] = value
        results["phases"][name] = {"status": "skipped" if value is None else "ok"}
    except Exception as error:  # recorded; the next phase still runs
        results["phases"][name] = {"status": "failed", "error": f"{type(error).__name__}: {error}"[:2000]}
        print(f"[gpu-check] {name} failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
    results["phases"][name]["seconds"] = round(time.perf_counter() - started, 1)
    save(results, out)
    print(f"[gpu-check] {name}: {results['phases'][name]['status']} ({results['phases'][name]['seconds']} s)",
          flush=True)


def save(results: dict, out: Path) -> None:
    from .report.gpu_check import render

    results["targets"] = judge(results)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "report.md").write_text(render(results))


def cuda_tests(dry_run: bool, out: Path, timeout_s: float):
    """tests/test_cuda_graphs.py on CUDA, its whole output kept in OUT/cuda_tests.log."""
    if dry_run:
        return None
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "not slow", "tests/test_cuda_graphs.py"],
                          env={**os.environ, "SPECBENCH_TEST_DEVICE": "cuda"}, capture_output=True, text=True,
                          timeout=max(timeout_s, 30))
    (out / "cuda_tests.log").write_text(done.stdout + done.stderr)
    tail = (done.stdout + done.stderr)[-3000:]
    if done.returncode:
        raise RuntimeError(f"pytest exited {done.returncode} ({out / 'cuda_tests.log'}):\n{tail}")
    return {"summary": tail.strip().splitlines()[-1] if tail.strip() else ""}


def step_costs(target: Path, draft: Path, device: str, out: Path, dry_run: bool) -> dict:
    from .step_costs import main as step_costs_main

    table = out / "step_costs.json"
    step_costs_main(["--target", str(target), "--draft", str(draft), "--device", device,
                     "--execution", "eager,static" if dry_run else "eager,graphs", "--kind", "eagle",
                     "--draft-vocab", "0", "--rounds", "1" if dry_run else "5",
                     "--new-tokens", "16" if dry_run else "64", "--prompt-tokens", "32" if dry_run else "128",
                     "--json", str(table)])
    measured = json.loads(table.read_text())
    if dry_run:  # name the static rows as graphs ones, so the dry run exercises the judging
        measured["rows"] = {name.replace("@static", "@graphs"): row for name, row in measured["rows"].items()}
    return measured


def use_bundle(bundle: Path, site: Path) -> None:
    """Install the bundle's wheels into ``site`` (no index, no dependencies) and put it first on this process's path
    and its children's (the CUDA tests' pytest): what ``make gpu-check`` does, for a machine without make."""
    wheels = sorted(str(w) for w in bundle.glob("*.whl"))
    if not wheels:
        sys.exit(f"error: --bundle {bundle}: no wheels there (make gpu-bundle writes them)")
    subprocess.run([sys.executable, "-m", "pip", "install", "--target", str(site), "--no-index", "--no-deps",
                    "--upgrade", "--quiet", "--no-compile", "--no-cache-dir", *wheels], check=True)
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specbench.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="results folder (default runs/gpu-check/<device>)")
    parser.add_argument("--shapes", default=None, choices=sorted(PAIRS), help="default vicuna-7b (tiny: --dry-run)")
    parser.add_argument("--work", default="/tmp/specbench-gpu-check",
                        help="where the random checkpoints go, 13.5 GB at the 7B shapes (%(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="on a CPU, tiny shapes, no graphs or compile (CI)")
    parser.add_argument("--bundle", default=None,
                        help="a folder of wheels (make gpu-bundle) to install into --site first and put on the path: "
                             "the check without make")
    parser.add_argument("--site", default="/tmp/specbench-gpu-site", help="where --bundle installs (%(default)s)")
    parser.add_argument("--budget-s", type=float, default=480,
                        help="seconds for all phases: a phase not started by then is skipped (recorded), the CUDA "
                             "tests' pytest gets what is left (default 480)")
    args = parser.parse_args(argv)
    if args.bundle:
        use_bundle(Path(args.bundle), Path(args.site))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network there: a stray hub call fails at once, never hangs
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # the output's tail is what comes back
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        sys.exit("error: gpu-check needs a CUDA device (torch.cuda.is_available() is False); --dry-run runs its code "
                 "on the CPU with tiny shapes")
    device = "cpu" if args.dry_run else "cuda"
    shapes = args.shapes or ("tiny" if args.dry_run else "vicuna-7b")
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    out = Path(args.out or Path("runs/gpu-check") / name.lower().replace(" ", "-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    import transformers

    results = {"device": name, "dry_run": args.dry_run, "shapes": shapes, "torch": torch.__version__,
               "transformers": transformers.__version__, "python": sys.version.split()[0],
               "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "phases": {}}
    target_shape, draft_shape = PAIRS[shapes]
    target, draft = work / target_shape, work / draft_shape
    static_mode = "static" if args.dry_run else "graphs"

    def checkpoints():
        write_checkpoint(target_shape, target, device, seed=0)
        write_checkpoint(draft_shape, draft, device, seed=1)
        pair = load_pair(target, draft, device, "auto", static_mode)
        loaded = {"target": type(pair.target).__name__, "vocab": pair.vocab_size,
                  "execution": pair.execution.mode, "dtype": str(next(pair.target.parameters()).dtype)}
        del pair
        return loaded

    def bandwidth():
        gbps = copy_bandwidth(device, 64 if args.dry_run else 1024)
        weight_bytes = parameters(target_shape) * (2 if device == "cuda" else 4)  # bf16 on CUDA
        return {"copy_gb_per_s": gbps, "target_bytes": weight_bytes, "floor_ms": weight_bytes / gbps / 1e6}

    deadline = time.perf_counter() + args.budget_s
    # the CUDA tests last: they ran on an H200 before, the new measurements did not, and they take what time is left
    phases = [("checkpoints", checkpoints), ("bandwidth", bandwidth),
              ("logits", lambda: logits_parity(target, draft, device, static_mode)),
              ("host_reads", lambda: host_reads(target, draft, device, static_mode, work)),
              ("step_costs", lambda: step_costs(target, draft, device, out, args.dry_run)),
              ("compiled_generate", lambda: compiled_generate(target, device, 16 if args.dry_run else 128,
                                                              compile_=not args.dry_run)),
              ("cuda_tests", lambda: cuda_tests(args.dry_run, out, deadline - time.perf_counter()))]
    for phase, work_fn in phases:
        if time.perf_counter() > deadline:
            results["phases"][phase] = {"status": "skipped", "reason": f"--budget-s {args.budget_s:g} spent"}
            save(results, out)
            print(f"[gpu-check] {phase}: skipped (budget spent)", flush=True)
            continue
        run_phase(results, phase, out, work_fn)
        if device == "cuda":
            torch.cuda.empty_cache()
    failed = [p for p, r in results["phases"].items() if r["status"] == "failed"]
    print(f"[gpu-check] results: {out / 'results.json'}, {out / 'report.md'}"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
