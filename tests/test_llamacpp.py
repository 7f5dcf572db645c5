"""``model.backend: llamacpp``: a CachedLM over llama.cpp contexts (backends/llamacpp/lm.py) on a tiny random GGUF
pair written in-process (models/tiny_gguf.py: tiny_llama's weights). Checked against transformers on the very same
weights, against its own one-token path (trees, cached-tree growth, commits, crops), every method on the one loop
against the same backend's greedy (no MISMATCH: identical, or a near-tie within llama.cpp's measured noise), the
records it writes, and the errors a bad backend setting gives before anything loads.
"""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.errors import ConfigError
from specbench.analysis.lossless import MISMATCH, LosslessCheck
from specbench.methods.greedy import Greedy

from .loop_methods import loop_methods

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (make llamacpp)")

from specbench.backends.llamacpp.lm import LlamaCppLM, trunk_length  # noqa: E402
from specbench.models.gguf_pair import build_tiny_gguf_pair  # noqa: E402

PAIRS: dict = {}
ATOL = 5e-3  # llama.cpp vs itself by another path (its kernels differ by batch size); see test_noise_is_small


def pair_for(noise: float = 0.05, backend: str = "llamacpp"):
    key = (noise, backend)
    if key not in PAIRS:
        PAIRS[key] = build_tiny_gguf_pair(draft_noise=noise, backend=backend)
    return PAIRS[key]


def one_by_one(pair, tokens: list[int]) -> torch.Tensor:
    lm = pair.lm("check")
    return torch.cat([lm.forward([t]) for t in tokens])


def test_the_gguf_weights_are_tiny_llamas_weights():
    """The same weights through llama.cpp and transformers give the same logits (float32 GGUF: up to the KV cache's
    f16 rounding), prefill and a tree."""
    ours, theirs = pair_for().lm(), pair_for(backend="transformers").lm()
    prompt = list(range(3, 60))
    assert torch.allclose(ours.forward(prompt), theirs.forward(prompt), atol=0.05)
    parents = [-1, 0, 0, 1, 2, 2]
    a, b = ours.forward([7, 8, 9, 10, 11, 12], parents=parents), theirs.forward([7, 8, 9, 10, 11, 12], parents=parents)
    assert torch.allclose(a, b, atol=0.05)
    assert (a.argmax(-1) == b.argmax(-1)).all()


def test_noise_is_small():
    """A 60-token prefill against 60 one-token steps: llama.cpp's batched and one-row kernels differ slightly."""
    prompt = list(range(3, 63))
    block = pair_for().lm().forward(prompt)
    assert (block - one_by_one(pair_for(), prompt)).abs().max() < ATOL


def test_a_tree_node_sees_its_ancestors_and_the_prefix_only():
    pair = pair_for()
    prompt, tree, parents = [5, 6, 7, 8], [20, 21, 22, 23, 24], [-1, 0, 0, 1, 3]
    lm = pair.lm()
    lm.forward(prompt)
    rows = lm.forward(tree, parents=parents)
    for node, path in enumerate([[0], [0, 1], [0, 2], [0, 1, 3], [0, 1, 3, 4]]):
        expected = one_by_one(pair, prompt + [tree[i] for i in path])[-1]
        assert torch.allclose(rows[node], expected, atol=ATOL), node
    assert lm.length == len(prompt) + len(tree)
    assert lm.committed == len(prompt) + 1 and len(lm.nodes) == 4  # the root, which all hang below, is committed


def test_keep_positions_commits_the_path_and_drops_the_rest():
    pair = pair_for()
    lm = pair.lm()
    lm.forward([5, 6, 7, 8])
    lm.forward([20, 21, 22, 23, 24], parents=[-1, 0, 0, 1, 3])
    lm.keep_positions([0, 1, 2, 3, 4, 5, 7])  # nodes 0, 1, 3: 20, 21, 23
    assert lm.length == lm.committed == 7 and not lm.nodes
    after = lm.forward([30, 31])
    assert torch.allclose(after, one_by_one(pair, [5, 6, 7, 8, 20, 21, 23, 30, 31])[-2:], atol=ATOL)
    assert sorted(lm.free) == list(range(1, 256))  # every tree id back in the pool


def test_the_pending_trunk_is_committed_and_a_cached_tree_grows_level_by_level():
    """A block of pending tokens + a tree (the loop's layout): the trunk goes to the committed text; a second call
    names the whole cached tree (trunk included, as the HF cache would) and hangs new nodes from cached ones."""
    pair = pair_for()
    lm = pair.lm()
    lm.forward([5, 6])
    assert trunk_length([-1, 0, 1, 1]) == 2 and trunk_length([-1, -1]) == 0 and trunk_length([-1, 0, 0]) == 1
    lm.forward([7, 8, 9, 10], parents=[-1, 0, 1, 1])  # 7, 8 pending; 9 and 10 children of 8
    assert lm.committed == 4 and len(lm.nodes) == 2
    rows = lm.forward([11, 12], parents=[2, 3], cached_parents=[-1, 0, 1, 1])  # 11 under 9, 12 under 10
    assert torch.allclose(rows[0], one_by_one(pair, [5, 6, 7, 8, 9, 11])[-1], atol=ATOL)
    assert torch.allclose(rows[1], one_by_one(pair, [5, 6, 7, 8, 10, 12])[-1], atol=ATOL)
    lm.crop(4)  # the tree goes, the committed text stays
    assert lm.length == 4 and not lm.nodes
    assert torch.allclose(lm.forward([13]), one_by_one(pair, [5, 6, 7, 8, 13])[-1:], atol=ATOL)
    lm.crop(2)  # into the committed text
    assert torch.allclose(lm.forward([14]), one_by_one(pair, [5, 6, 14])[-1:], atol=ATOL)


def test_a_plain_sequence_after_an_uncommitted_tree_is_refused():
    lm = pair_for().lm()
    lm.forward([5, 6])
    lm.forward([7, 8], parents=[-1, -1])
    with pytest.raises(ValueError, match="holds a token tree"):
        lm.forward([9])


def test_a_context_serves_one_generation_at_a_time():
    pair = pair_for()
    old = pair.lm()
    old.forward([5, 6])
    pair.lm()  # a new generation takes the target's context
    with pytest.raises(RuntimeError, match="another generation"):
        old.forward([7])


# -- every method against the same backend's greedy ------------------------------------------------------------

def methods(pair, gamma: int):
    return loop_methods(pair, gamma)


cases = st.fixed_dictionaries({
    "noise": st.sampled_from([0.0, 0.05, 0.2]),
    "prompt": st.lists(st.integers(3, 258), min_size=1, max_size=10),
    "gamma": st.integers(1, 5),
    "max_new_tokens": st.integers(1, 30),
})
VERDICTS: dict = {}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases)
def test_every_method_equals_llamacpp_greedy_up_to_its_noise(case):
    """Identical to greedy on the same backend, or diverging only where greedy's two best tokens are within
    llama.cpp's measured batched-vs-one-row noise (the runner's own classification); never a MISMATCH."""
    pair = pair_for(case["noise"])
    prompt, budget = case["prompt"], case["max_new_tokens"]
    reference = Greedy(pair, "greedy").generate(prompt, budget, set())
    check = LosslessCheck(pair, threads=torch.get_num_threads())
    for name, method in methods(pair, case["gamma"]).items():
        method.reset(0)
        gen = method.generate(prompt, budget, set())
        assert sum(gen.accept_lengths) == len(gen.tokens), name
        verdict = check.classify(prompt, reference, gen)
        assert verdict["verdict"] != MISMATCH, (name, verdict)
        VERDICTS.setdefault(verdict["verdict"], []).append(name)


def test_most_outputs_are_identical_not_near_ties():
    """The property test above must not pass by calling everything a near-tie."""
    pair = pair_for(0.05)
    identical = 0
    for start in range(3, 13):
        prompt = list(range(start, start + 6))
        reference = Greedy(pair, "greedy").generate(prompt, 24, set()).tokens
        for method in methods(pair, 3).values():
            method.reset(0)
            identical += method.generate(prompt, 24, set()).tokens == reference
    assert identical >= 0.9 * 10 * len(methods(pair, 3))


def test_the_loop_counts_the_same_forwards_on_both_backends():
    """Same weights, same proposals: the same target forwards, rows of logits and accepted tokens wherever the
    outputs agree."""
    prompt = [5, 9, 13, 40, 41]
    for name in ("speculative", "lookahead", "specinfer"):
        gens = [methods(pair_for(backend=b), 3)[name].generate(prompt, 20, set()) for b in ("llamacpp", "transformers")]
        if gens[0].tokens == gens[1].tokens:
            assert gens[0].target_forwards == gens[1].target_forwards, name
            assert gens[0].accept_lengths == gens[1].accept_lengths, name
            assert gens[0].forward_rows == gens[1].forward_rows, name  # the bound prices the rows of logits


# -- through the CLI: records, errors -------------------------------------------------------------------------------

def test_the_cli_runs_on_llamacpp_and_records_the_backend(tmp_path):
    from .conftest import run_cli

    records = tmp_path / "records"
    run_cli("model=tiny_gguf", "-m", "method=speculative,ouroboros", "data=humaneval", "data.limit=2",
            "data.max_new_tokens=24", records_dir=records)
    record = json.loads(next(records.rglob("speculative-*.jsonl")).read_text().splitlines()[0])
    backend = record["model_info"]["backend"]
    assert backend["name"] == "llamacpp" and backend["llama_cpp_python"] and "CPU" in backend["system_info"]
    gguf = record["model_info"]["gguf"]
    assert gguf["quantization"] == "F32" and len(gguf["sha256"]) == 64
    assert record["env"]["precision"]["dtype"] == "gguf"
    summary = json.loads(next(records.rglob("ouroboros-*.summary.json")).read_text())
    assert summary["mismatches"] == 0 and summary["compared"] == 2


def test_bad_backend_settings_fail_before_any_model_loads(tmp_path):
    from .conftest import run_cli

    cases = {("model.backend=llamacpp",): "model.backend: llamacpp runs GGUF files, and pair 'tiny-llama' has none",
             ("model=tiny_gguf", "method=eagle", "method.head=/nonexistent"): "does not run on model.backend=llamacpp",
             ("model=tiny_gguf", "model.execution=static"): "model.execution: 'static' is a transformers execution",
             ("model=tiny_gguf", "model.backend=onnx"): "model.backend: unknown backend 'onnx'",
             ("model=gguf",): "model.target_gguf"}
    for overrides, message in cases.items():
        proc = run_cli(*overrides, "data=humaneval", "data.limit=1", records_dir=tmp_path / "records", check=False)
        assert proc.returncode == 2 and message in proc.stderr, (overrides, proc.stderr[-2000:])


def test_auto_runs_a_method_llamacpp_cannot_run_on_transformers_and_says_why(tmp_path):
    """model.backend=auto is the fastest backend that runs the run's methods: hf_assisted (transformers' generate())
    on a GGUF pair goes to transformers with a line saying why, instead of refusing; greedy still gets llama.cpp."""
    from hydra import compose, initialize_config_dir

    from specbench.run.components import spec_for

    from .conftest import ROOT, run_cli

    records = tmp_path / "records"
    proc = run_cli("model=tiny_gguf", "model.backend=auto", "method=hf_assisted", "data=humaneval", "data.limit=1",
                   "data.max_new_tokens=8", records_dir=records)
    assert "model.backend: auto -> transformers: method=hf_assisted does not run on llamacpp" in proc.stderr
    record = json.loads(next(records.rglob("hf_assisted-*.jsonl")).read_text().splitlines()[0])
    assert record["env"]["precision"]["dtype"] == "float32" and record["model_info"].get("backend") is None
    # the report names the run from the same overrides as the CLI did (it found none when only the CLI fitted auto)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["model=tiny_gguf", "model.backend=auto", "method=hf_assisted",
                                           "data=humaneval", "data.max_new_tokens=8", f"runner.records_dir={records}"])
    assert spec_for(cfg, cfg.method).key == record["run_key"] and spec_for(cfg, cfg.method).store.path.exists()
    proc = run_cli("model=tiny_gguf", "model.backend=auto", "method=greedy", "data=humaneval", "data.limit=1",
                   "data.max_new_tokens=8", records_dir=records)
    assert "auto -> transformers" not in proc.stderr
    backends = {(json.loads(path.read_text().splitlines()[0])["model_info"].get("backend") or {}).get("name")
                for path in records.rglob("greedy-*.jsonl")}
    assert backends == {None, "llamacpp"}  # hf_assisted's transformers baseline, and this run's: two runs


def test_without_the_package_the_error_says_how_to_install(monkeypatch):
    import sys

    from specbench.backends.choice import resolve_backend

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp now raises ImportError
    with pytest.raises(ConfigError, match="make llamacpp"):
        resolve_backend("llamacpp", "cpu", gguf=True, pair="embedded")
    assert resolve_backend("auto", "cpu", gguf=True, pair="embedded").name == "transformers"


def test_a_build_with_ggmls_amx_kernels_is_refused_before_any_model_loads(monkeypatch):
    """They segfault in llama_decode on Sapphire Rapids (ggml-org/llama.cpp#20824); the Makefile compiles them out."""
    import sys
    from types import SimpleNamespace

    from specbench.backends.choice import resolve_backend
    from specbench.backends.llamacpp.context import build_problem

    info = "CPU : AVX2 = 1 | AVX512 = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | REPACK = 1 | "
    assert "AMX" in build_problem(info) and build_problem(info.replace("AMX_INT8 = 1 | ", "")) is None
    monkeypatch.setitem(sys.modules, "llama_cpp", SimpleNamespace(llama_print_system_info=lambda: info.encode()))
    with pytest.raises(ConfigError, match=r"^model\.backend: llamacpp: .*AMX_INT8 = 1.*make llamacpp.*model\.backend"
                                          r"=transformers$"):
        resolve_backend("llamacpp", "cpu", gguf=True, pair="embedded")
    auto = resolve_backend("auto", "cpu", gguf=True, pair="embedded")
    assert auto.name == "transformers" and "AMX kernels" in auto.reason


def test_run_keys_name_llamacpp_and_keep_transformers_keys():
    from specbench.backends.execution import model_identity

    base = {"_target_": "specbench.models.embedded.load_embedded_pair", "name": "e", "dtype": "auto"}
    assert "backend" not in model_identity({**base, "backend": "transformers", "flash_attn": False})
    assert model_identity({**base, "backend": "transformers", "flash_attn": False}) == model_identity(base)
    assert model_identity({**base, "backend": "transformers"}) == model_identity(base)
    assert model_identity({**base, "backend": "llamacpp"})["backend"] == "llamacpp"
    assert model_identity({**base, "backend": "auto"})["backend"] == "llamacpp"  # installed here
    assert isinstance(pair_for().lm(), LlamaCppLM)
