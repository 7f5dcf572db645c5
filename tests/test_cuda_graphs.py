"""CUDA graphs for real (``model.execution: graphs``): runs only with SPECBENCH_TEST_DEVICE=cuda on a machine with a
GPU (docs/testing.md, *Testing on a GPU*); skipped elsewhere, where test_static_execution.py checks the same logic
with a stand-in capture. Tiny pairs, fp32 (exact equality) and bf16 (the CLI's losslessness classification)."""
from __future__ import annotations

import pytest
import torch

from specbench.methods.greedy import Greedy

from .conftest import TEST_DEVICE, run_cli
from .test_static_execution import expected_captures, methods

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(
    TEST_DEVICE != "cuda" or not torch.cuda.is_available(),
    reason="CUDA graphs need a GPU: run with SPECBENCH_TEST_DEVICE=cuda on one")]

PAIRS: dict = {}


def graphs_pair(arch: str = "llama", execution: str = "graphs", dtype: str = "float32"):
    from specbench.models.tiny import build_tiny_pair

    key = (arch, execution, dtype)
    if key not in PAIRS:
        PAIRS[key] = build_tiny_pair(name=f"tiny-{arch}", arch=arch, device="cuda", execution=execution, dtype=dtype)
    return PAIRS[key]


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    from .test_feature_heads import random_head

    return {kind: random_head(graphs_pair(), kind, tmp_path_factory.mktemp(kind))
            for kind in ("eagle", "griffin", "eagle3")}


@pytest.fixture(autouse=True)
def no_tf32():
    """fp32 exactness means fp32 GEMMs: TF32 off for every test here (bf16 is judged by the near-tie rule)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_a_model_on_another_gpu_is_captured_and_replayed_there():
    """Graphs, streams and the pool on the model's device, not the current one."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    from specbench.models.tiny import build_tiny_pair

    pair = build_tiny_pair(name="tiny-llama", device="cuda:1", execution="graphs", dtype="float32")
    eager = build_tiny_pair(name="tiny-llama", device="cuda:1", execution="eager", dtype="float32")
    with torch.cuda.device(0):
        assert Greedy(pair, "greedy").generate([5, 6, 7], 20, set()).tokens == \
            Greedy(eager, "greedy").generate([5, 6, 7], 20, set()).tokens
    assert pair.captures[0] > 0


def test_auto_is_graphs_and_sdpa_on_cuda():
    pair = graphs_pair(execution="auto")
    assert pair.execution.mode == "graphs" and pair.info["attn_implementation"] == "sdpa"


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_every_method_in_graphs_equals_greedy_in_graphs_and_in_eager(arch, heads):
    pair, eager = graphs_pair(arch), graphs_pair(arch, "eager")
    pair.reserve(128)
    for prompt, budget in (([5, 6, 7], 40), ([40, 41, 42, 43, 44, 45, 46], 33), ([9], 17)):
        reference = Greedy(pair, "greedy").generate(prompt, budget, set()).tokens
        assert reference == Greedy(eager, "greedy").generate(prompt, budget, set()).tokens
        for name, method in methods(pair, 4, heads if arch == "llama" else {}).items():
            method.reset(0)
            assert method.generate(prompt, budget, set()).tokens == reference, name


def test_graphs_are_captured_once_per_bucket_and_replayed_after(heads):
    pair = graphs_pair()
    pair.reserve(128)
    made = methods(pair, 3, heads)  # built once, as a run builds its method (a head loaded again is new weights,
    for method in made.values():    # which need graphs of their own)
        method.generate([5, 6, 7], 24, set())
    captured = pair.captures[0]
    assert captured == expected_captures(pair)
    for method in made.values():
        method.reset(0)
        method.generate([8, 9, 10], 24, set())
    assert pair.captures[0] == captured  # nothing captured again: every later forward was a replay
    static = pair.statics["target"]
    assert all(block.replay is not None for block in static.blocks.values())


def test_a_greedy_step_launches_only_its_replay_and_a_few_kernels():
    """One decoding step in graphs mode: the replay plus the input copies, the visibility mask and lm_head, not
    the hundreds of kernels of an eager forward."""
    from torch.profiler import ProfilerActivity, profile

    pair = graphs_pair()
    lm = pair.lm()
    lm.forward([5, 6, 7])
    lm.forward([8])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        lm.forward([9])
    launches = [e for e in prof.events() if e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")]
    assert len(launches) <= 12, [e.name for e in prof.events()][:80]


def test_the_cli_runs_every_method_in_graphs_identical_to_greedy(tmp_path):
    for method in ("speculative", "specinfer", "lookahead", "ouroboros", "prompt_lookup"):
        run_cli(f"method={method}", "model.device=cuda", "model.execution=graphs", "model.dtype=bfloat16",
                "data=humaneval", "data.limit=2", "data.max_new_tokens=24", records_dir=tmp_path / "records")
