"""``model.execution: static`` (and the logic ``graphs`` adds on a GPU): a preallocated KV cache, bucket-padded
forwards, rollback by length, accepted paths copied into place. Checked on the CPU against eager forwards (hand-
built cache operations) and, for every method, against the same mode's greedy (property tests); graphs' capture
bookkeeping with a stand-in capture that replays by re-running (a real capture needs CUDA: test_cuda_graphs.py).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.backends.torch.static_lm import StaticLM, StaticModel
from specbench.errors import ConfigError
from specbench.methods.feature_head import FeatureHeadMethod
from specbench.methods.greedy import Greedy
from specbench.methods.hf_assisted import HFAssisted, assisted_supports_static_caches
from specbench.methods.lookahead import Lookahead
from specbench.methods.sam_decoding import SamDecoding
from specbench.methods.sl_policies import HeuristicSL
from specbench.methods.specinfer import SpecInfer
from specbench.methods.speculative import SpeculativeDecoding
from specbench.backends.execution import resolve_execution
from specbench.models.tiny import build_tiny_pair

from .conftest import TEST_DEVICE
from .loop_methods import loop_methods
from .test_feature_heads import random_head

PAIRS: dict = {}


def pair_for(arch: str = "llama", noise: float = 0.05, execution: str = "static", **options):
    key = (arch, noise, execution, repr(sorted(options.items())))
    if key not in PAIRS:
        PAIRS[key] = build_tiny_pair(name=f"tiny-{arch}", arch=arch, draft_noise=noise, device=TEST_DEVICE,
                                     execution=execution, **options)
    return PAIRS[key]


def rerun_capture(calls: list):
    """A stand-in for cuda_capture on the CPU: 'captures' by running once and replays by re-running, so every
    replay reads the static inputs as a graph would; ``calls`` counts captures."""
    def capture(fn, device=None):
        fn()
        calls.append(fn)
        return fn
    return capture


# -- the cache operations, hand-built ---------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_static_forward_gives_the_eager_logits_and_rollback_is_a_length(arch):
    static, eager = pair_for(arch), pair_for(arch, execution="eager")
    lm, ref = static.lm(), eager.lm()
    assert isinstance(lm, StaticLM)
    assert torch.allclose(lm.forward([5, 6, 7, 8]), ref.forward([5, 6, 7, 8]), atol=1e-5)
    lm.forward([9, 10, 11])  # a verify of 3 drafts (padded to 4); keep 1 of them
    lm.crop(5)
    ref.forward([9])
    assert lm.length == 5
    assert torch.allclose(lm.forward([12, 13], keep_last=1), ref.forward([12, 13], keep_last=1), atol=1e-5)


def test_stale_positions_are_masked_whatever_they_hold():
    pair = pair_for()
    lm = pair.lm()
    lm.forward([5, 6, 7, 8])
    lm.crop(3)
    kv = pair.statics["target"].kv
    with torch.inference_mode():  # garbage where the cropped position and the padding rows wrote
        for layer in kv.layers:
            layer.keys[:, :, 3:64].fill_(1e4)
            layer.values[:, :, 3:64].fill_(-1e4)
    ref = pair_for(execution="eager").lm()
    ref.forward([5, 6, 7])
    assert torch.allclose(lm.forward([40, 41]), ref.forward([40, 41]), atol=1e-5)


def test_keep_positions_copies_a_tree_path_into_place():
    pair, eager = pair_for(), pair_for(execution="eager")
    lm, ref = pair.lm(), eager.lm()
    prompt, parents = [5, 6, 7], [-1, 0, -1, 2, 3]  # two branches after x0: [20, 21] and [30, 31, 32]
    for m in (lm, ref):
        m.forward(prompt)
        m.forward([20, 21, 30, 31, 32], parents=parents)
        m.keep_positions([0, 1, 2, 5, 6])  # x0's prefix, then the accepted branch 30, 31
    assert lm.length == ref.length == 5
    assert torch.allclose(lm.forward([99]), ref.forward([99]), atol=1e-5)
    whole = eager.lm()
    whole.forward([5, 6, 7, 30, 31])
    assert torch.allclose(lm.forward([98])[-1:], (whole.forward([99]), whole.forward([98]))[1], atol=1e-5)


def test_a_tree_grown_against_cached_tree_nodes_equals_eager():
    pair, eager = pair_for(), pair_for(execution="eager")
    outs = []
    for m in (pair.lm(), eager.lm()):
        m.forward([5, 6, 7])
        first = m.forward([20, 30], parents=[-1, -1])  # depth 1: two children of x0
        second = m.forward([21, 31, 32], parents=[0, 1, 1], cached_parents=[-1, -1])  # depth 2 under them
        outs.append((first, second))
        m.crop(3)
        outs.append(m.forward([8]))
    assert torch.allclose(outs[0][0], outs[2][0], atol=1e-5) and torch.allclose(outs[0][1], outs[2][1], atol=1e-5)
    assert torch.allclose(outs[1], outs[3], atol=1e-5)


def test_a_block_larger_than_every_bucket_runs_unpadded_and_the_cache_grows():
    pair = pair_for(buckets=[1, 2, 4])
    prompt = [3 + i % 250 for i in range(300)]  # longer than the default capacity (256): the cache grows first
    lm, ref = pair.lm(), pair_for(buckets=[1, 2, 4], execution="eager").lm()
    assert torch.allclose(lm.forward(prompt, keep_last=2), ref.forward(prompt, keep_last=2), atol=1e-4)
    assert pair.statics["target"].capacity >= 300 + 4
    assert torch.allclose(lm.forward([9, 10, 11]), ref.forward([9, 10, 11]), atol=1e-4)  # a padded bucket after it


def test_the_forward_does_not_read_the_cache_length_from_python():
    """A captured graph could not: the cache says 0 always, and outputs match eager."""
    pair = pair_for()
    lm = pair.lm()
    lm.forward([5, 6, 7])
    assert pair.statics["target"].kv.get_seq_length() == 0
    ref = pair_for(execution="eager").lm()
    ref.forward([5, 6, 7])
    assert torch.allclose(lm.forward([8]), ref.forward([8]), atol=1e-5)


def test_an_earlier_generation_may_not_touch_the_cache_a_newer_one_took():
    pair = pair_for()
    old = pair.lm()
    old.forward([5, 6])
    pair.lm()
    with pytest.raises(RuntimeError, match="newer generation"):
        old.forward([7])


def test_captures_happen_once_per_bucket_at_first_use_and_again_only_when_the_cache_grows():
    calls: list = []
    pair = pair_for()
    static = StaticModel(pair.target, (1, 2, 4, 8), 64, rerun_capture(calls), label="test")
    reference = pair_for(execution="eager")
    for prompt in ([5, 6, 7], [9, 8, 7, 6]):
        lm, ref = StaticLM(static), reference.lm()
        for block in (prompt, [11, 12], [13], [14, 15, 16, 17, 18]):
            assert torch.allclose(lm.forward(block), ref.forward(block), atol=1e-5)
        lm.crop(len(prompt) + 1)
        ref.crop(len(prompt) + 1)
        assert torch.allclose(lm.forward([20]), ref.forward([20]), atol=1e-5)
    assert len(calls) == 4 and static.captures == 4  # one per bucket, at the first forward
    lm = StaticLM(static)
    lm.forward(list(range(3, 70)))  # (ids < 259) needs more than 64 positions: grown, every bucket captured again
    assert static.capacity >= 67 + 8 and static.spans == (64, 128)
    assert static.captures == 4 + 4 * 2  # every bucket for each key span of the grown cache


def test_attention_reads_the_shortest_key_span_holding_the_context():
    """Key spans (kv_spans): a forward attends over the cache's first 64, 128, ... positions, not its capacity, and
    gives the eager logits whichever span it reads."""
    pair = pair_for()
    static = StaticModel(pair.target, (1, 2, 4, 8), 512, None, label="test")
    assert static.spans == (64, 128, 256, 512)
    lm, ref = StaticLM(static), pair_for(execution="eager").lm()
    spans = []
    for block in ([5, 6, 7], list(range(3, 120)), [11, 12], list(range(3, 140)), [13]):
        assert torch.allclose(lm.forward(block), ref.forward(block), atol=1e-5)
        spans.append(static.kv.span)
    assert spans == [64, 128, 128, 512, 512]  # 3 positions; 120; 122 (+ the bucket of 2); 261; 262


def test_a_failed_capture_names_the_forward_and_leaves_no_half_captured_buckets():
    """A capture that fails (not out of memory) leaves no bucket half made: the error says which forward and what
    runs instead, and a later forward captures every bucket again rather than running some uncaptured."""
    calls: list = []
    working = rerun_capture(calls)

    def failing_third(fn, device=None):
        if len(calls) == 2:
            raise RuntimeError("operation not permitted when stream is capturing")
        return working(fn, device)

    pair = pair_for()
    static = StaticModel(pair.target, (1, 2, 4), 64, failing_third, label="test")
    with pytest.raises(RuntimeError, match=r"capturing test's forward of \d+ rows over \d+ positions as a CUDA graph "
                                           r"failed \(RuntimeError: operation not permitted.*model.execution=static"):
        StaticLM(static).forward([5, 6, 7])
    assert static.blocks == {}
    static.capture = working
    logits = StaticLM(static).forward([5, 6, 7])
    assert all(block.replay is not None for block in static.blocks.values())
    assert static.spans == (64,) and len(static.blocks) == 3 and static.captures == 2 + 3  # 2 before the failure
    assert torch.allclose(logits, pair_for(execution="eager").lm().forward([5, 6, 7]), atol=1e-5)


def test_a_graphed_call_replays_on_the_newest_arguments():
    from specbench.backends.torch.graphs import GraphedCall

    calls: list = []
    call = GraphedCall(lambda x, y: (x * y).sum(), rerun_capture(calls))
    assert float(call(torch.ones(3), torch.tensor(2.0))) == 6.0
    assert float(call(torch.arange(3.0), torch.tensor(3.0))) == 9.0  # the same capture, new values copied in
    assert len(calls) == 1


def test_reserve_sizes_every_static_cache_before_timing():
    pair = build_tiny_pair(execution="static")
    pair.lm().forward([5, 6])
    pair.reserve(1000)
    assert pair.statics["target"].capacity >= 1000 + max(pair.execution.buckets)
    pair.lm("draft").forward([5])  # built after the reservation: room for the largest bucket's padding too
    assert pair.statics["draft"].capacity >= 1000 + max(pair.execution.buckets)


def test_a_generation_within_what_was_reserved_never_grows_a_cache():
    """Reserved before any static cache exists (as the runner does), the longest generation runs to its last token,
    verify blocks padded to their bucket there: no cache grows (in graphs each growth recaptures every bucket while
    the clock runs; before, a cache built after the reservation had no room for the padding)."""
    pair = build_tiny_pair(execution="static")
    prompt, budget = list(range(5, 205)), 56
    pair.reserve(len(prompt) + budget)
    generation = SpeculativeDecoding(pair, "speculative", gamma=4).generate(prompt, budget, set())
    assert len(generation.tokens) == budget
    assert pair.growths == 0, {key: static.capacity for key, static in pair.statics.items()}
    pair.lm().forward([5 + i % 200 for i in range(len(prompt) + budget + 200)])  # beyond it: grows, and says so
    assert pair.growths == 1


# -- settings and errors ------------------------------------------------------------------------------------------

def test_execution_resolves_per_device_and_graphs_needs_cuda():
    assert resolve_execution("auto", "cpu").mode == "eager"
    assert resolve_execution("static", "cpu").static
    with pytest.raises(ConfigError, match="model.execution: graphs needs CUDA.*auto picks eager"):
        resolve_execution("graphs", "cpu")
    with pytest.raises(ConfigError, match="model.execution: unknown execution 'fast'"):
        resolve_execution("fast", "cpu")
    with pytest.raises(ConfigError, match="model.buckets"):
        resolve_execution("static", "cpu", buckets=[0, 4])
    with pytest.raises(ConfigError, match="model.cache_length"):
        resolve_execution("static", "cpu", cache_length=8)


def test_a_tree_larger_than_the_largest_bucket_is_refused():
    pair = pair_for(buckets=[1, 2, 4, 8, 16])
    with pytest.raises(ConfigError, match=r"model.buckets: method 'specinfer' feeds the target up to 33 tokens"):
        SpecInfer(pair, "specinfer", max_nodes=32).check_blocks()
    SpecInfer(pair, "specinfer", max_nodes=15).check_blocks()
    with pytest.raises(ConfigError, match="model.buckets: method 'lookahead'"):
        Lookahead(pair, window=5, ngram=4, guesses=5).check_blocks()
    SpeculativeDecoding(pair, "dyn_heur", policy=HeuristicSL()).check_blocks()  # no bound: nothing to check
    eager = pair_for(execution="eager", buckets=[1, 2])
    SpecInfer(eager, "specinfer", max_nodes=32).check_blocks()  # eager pads nothing


def test_bad_execution_settings_fail_before_any_model_loads(tmp_path):
    from .conftest import run_cli

    cases = {("model.execution=graphs",): "model.execution: graphs needs CUDA",
             ("model.execution=static", "model.buckets=[1,2,4,8,16]", "method=specinfer"):
                 "model.buckets: method 'specinfer' feeds the target up to 33 tokens",
             ("model=embedded", "model.backend=transformers", "model.execution=static", "model.buckets=[1,2,4]",
              "method=prompt_lookup"):
                 "model.buckets: method 'prompt_lookup' feeds the target up to 11 tokens",
             ("model.execution=jit",): "model.execution: unknown execution 'jit'",
             ("model.execution=static", "+model.attn_implementation=flash_attention_2"):
                 "model.attn_implementation: 'flash_attention_2' builds its own attention mask"}
    for overrides, message in cases.items():
        proc = run_cli(*overrides, "data=humaneval", "data.limit=1", records_dir=tmp_path / "records", check=False)
        assert proc.returncode == 2 and message in proc.stderr, (overrides, proc.stderr[-2000:])
        assert "Loading" not in proc.stderr and "converting" not in proc.stderr  # nothing loaded


@pytest.mark.parametrize("config, problem", [
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "RoPE scaling ['dynamic']"),
    (dict(rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
                        "original_max_position_embeddings": 64}), "RoPE scaling ['longrope']"),
    (dict(layer_types=["full_attention", "sliding_attention"]), "layers of kind ['sliding_attention']"),
    (dict(model_type="mistral", sliding_window=4096), "a sliding attention window of 4096 tokens"),
    (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), None),  # a fixed scaling: static-safe
    (dict(model_type="qwen2", sliding_window=4096, use_sliding_window=False), None),  # declared, not used
    (dict(), None),
])
def test_a_model_a_static_cache_cannot_run_is_refused_before_its_weights_load(tmp_path, config, problem):
    """Written as a checkpoint with a config.json and no weights: the hub loader refuses it on its config alone."""
    from transformers import AutoConfig

    from specbench.models.hub import load_hub_pair
    from specbench.backends.torch.static_support import static_problems

    model_type = config.pop("model_type", "llama")
    hf_config = AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=300, **config)
    problems = static_problems(hf_config)
    assert (problems == []) if problem is None else (problem in " ".join(problems)), problems
    if problem is None:
        return
    hf_config.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"model.execution: static runs a static cache.*"
                                          r"valid for it: model.execution=eager") as error:
        load_hub_pair("refused", str(tmp_path), None, device_map=None, execution="static")
    assert problem in str(error.value)
    with pytest.raises(ConfigError, match="cannot load"):  # eager: on to the weights, which are not there
        load_hub_pair("refused", str(tmp_path), None, device_map=None, execution="eager")


# -- every method equals the same mode's greedy --------------------------------------------------------------------

def head_dir(tmp_path_factory, kind: str) -> str:
    return random_head(pair_for(), kind, tmp_path_factory.mktemp(kind))


def methods(pair, gamma: int, heads: dict):
    made = loop_methods(pair, gamma)
    for kind, directory in heads.items():
        made[kind] = FeatureHeadMethod(pair, kind, kind=kind, head=directory, top_k=3, depth=3, max_nodes=8)
    if "eagle" in made:  # SAM[EAGLE-2]: the head's features must follow the steps the automaton drafts
        made["sam_eagle"] = SamDecoding(pair, "sam_eagle", max_draft=gamma, min_match_length=2, fallback=made["eagle"])
    if assisted_supports_static_caches():
        made["hf_assisted"] = HFAssisted(pair, "hf_assisted", gamma=gamma)
    return made


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    return {kind: head_dir(tmp_path_factory, kind) for kind in ("eagle", "griffin", "eagle3")}


cases = st.fixed_dictionaries({
    "arch": st.sampled_from(["llama", "gpt2"]),
    "noise": st.sampled_from([0.0, 0.05, 0.2]),
    "prompt": st.lists(st.integers(3, 258), min_size=1, max_size=10),
    "gamma": st.integers(1, 5),
    "max_new_tokens": st.integers(1, 30),
    "eos_pick": st.one_of(st.none(), st.integers(0, 29)),
})


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(case=cases)
def test_every_method_equals_static_greedy_and_eager_greedy(case, heads):
    pair, eager = pair_for(case["arch"], case["noise"]), pair_for(case["arch"], case["noise"], "eager")
    prompt, budget = case["prompt"], case["max_new_tokens"]
    free = Greedy(pair, "greedy").generate(prompt, budget, set()).tokens
    eos = {free[case["eos_pick"] % len(free)]} if case["eos_pick"] is not None else set()
    reference = Greedy(pair, "greedy").generate(prompt, budget, eos).tokens
    assert reference == Greedy(eager, "greedy").generate(prompt, budget, eos).tokens  # fp32: the modes agree
    usable = heads if case["arch"] == "llama" else {}  # feature heads draft for Llama-family targets
    for name, method in methods(pair, case["gamma"], usable).items():
        method.reset(0)
        gen = method.generate(prompt, budget, eos)
        assert gen.tokens == reference, name
        assert sum(gen.accept_lengths) == len(gen.tokens) or name == "hf_assisted", name


def test_graphs_bookkeeping_with_a_stand_in_capture(heads, monkeypatch):
    """The graphs path on the CPU: every bucket 'captured' before the first forward, replays reading only static
    inputs, nothing captured again across generations; outputs identical to greedy."""
    import specbench.backends.torch.static_lm as static_lm

    calls: list = []
    monkeypatch.setattr(static_lm, "cuda_capture", rerun_capture(calls))
    pair = build_tiny_pair(name="tiny-llama", execution="static", device=TEST_DEVICE)
    object.__setattr__(pair.execution, "mode", "graphs")  # what resolve_execution gives on CUDA
    reference = Greedy(pair_for(), "greedy").generate([5, 6, 7], 24, set()).tokens
    pair.reserve(64)
    for method in methods(pair, 3, heads).values():
        for _ in range(2):
            method.reset(0)
            assert method.generate([5, 6, 7], 24, set()).tokens == reference
    assert len(pair.statics) == 6  # target, draft, the target with EAGLE-3's taps, and the three heads
    assert pair.captures[0] == len(calls) == expected_captures(pair)  # none during the generations


def expected_captures(pair) -> int:
    """Each static forward's graphs: one per (bucket, key span) pair whose span holds the bucket."""
    return sum(span >= size for static in pair.statics.values() for size in static.buckets for span in static.spans)


# -- T > 0: distribution-preserving in static mode too ---------------------------------------------------------------

@pytest.mark.parametrize("make", ["speculative", "specinfer"])
def test_sampling_over_a_static_cache_is_distributed_as_the_target(make):
    """1500 generations of at most 3 tokens over a 6-token vocabulary, the chain (crop by length) and a tree
    (accepted path copied into place) against the target's exact distribution (tests/distribution_helpers)."""
    from .distribution_helpers import EOS, MAX_NEW, PROMPT, exact_sequence_distribution, goodness_of_fit
    from .distribution_helpers import sample_generations, small_vocab_pair

    eager = small_vocab_pair()
    pair = eager.with_execution(resolve_execution("static", "cpu"))
    target = exact_sequence_distribution(pair.target, 1.0, 1.0, PROMPT, MAX_NEW, {EOS})
    method = (SpeculativeDecoding(pair, "speculative", gamma=2, temperature=1.0) if make == "speculative" else
              SpecInfer(pair, "specinfer", widths=[2, 2], max_nodes=6, temperature=1.0))
    counts, gens = sample_generations(method, PROMPT, MAX_NEW, {EOS}, 1500)
    accepted, drafted = sum(g.accepted for g in gens), sum(g.drafted for g in gens)
    assert 0.1 * drafted < accepted < drafted  # drafts were accepted and rejected
    assert goodness_of_fit(counts, target) > 1e-3


def test_the_cli_runs_every_method_on_a_static_cache_identical_to_greedy(tmp_path):
    """Through the CLI (strict losslessness: a divergence exits 3): each method and its greedy on a static cache,
    records that say so, run keys apart from eager's."""
    import json

    from .conftest import run_cli

    records = tmp_path / "records"
    methods = "speculative,specinfer,lookahead,ouroboros,prompt_lookup,dyn_heur"
    run_cli("-m", f"method={methods}", "model.execution=static", "data=humaneval", "data.limit=2",
            "data.max_new_tokens=20", records_dir=records)
    run_cli("method=speculative", "data=humaneval", "data.limit=2", "data.max_new_tokens=20", records_dir=records)
    for method in methods.split(","):
        summaries = [json.loads(p.read_text()) for p in records.rglob(f"{method}-*.summary.json")]
        static = [s for s in summaries if s.get("execution", {}).get("mode") == "static"]
        assert len(static) == 1 and static[0]["identical"] == static[0]["prompts"] == 2, method
        assert static[0]["execution"]["graphs_captured"] == 0  # no graphs on a CPU: buckets run directly
        record = json.loads(next(p for p in records.rglob(f"{method}-{static[0]['run_key']}.jsonl")).read_text()
                            .splitlines()[0])
        execution = record["env"]["execution"]
        assert execution["mode"] == "static" and execution["captured_while_timed"] == 0
    keys = {json.loads(p.read_text())["run_key"] for p in records.rglob("speculative-*.summary.json")}
    assert len(keys) == 2  # the eager run and the static one are two runs


def test_run_keys_name_the_execution_and_graphs_runs_are_found_from_a_cpu():
    """A report rendered on a CPU finds runs measured with graphs on a GPU: an explicit mode names the run without
    being resolved against this machine; eager keeps the key it had before execution modes existed."""
    from omegaconf import OmegaConf

    from specbench.run.components import spec_for
    from specbench.report.experiment import compose_config, hydra_context

    with hydra_context():
        cfgs = {mode: compose_config(["model=tiny_llama", f"model.execution={mode}", "method=speculative"])
                for mode in ("eager", "static", "graphs", "auto")}
        old = compose_config(["model=tiny_llama", "method=speculative"])
    keys = {mode: spec_for(cfg, cfg.method).key for mode, cfg in cfgs.items()}
    assert len({keys["eager"], keys["static"], keys["graphs"]}) == 3 and keys["auto"] == keys["eager"]
    OmegaConf.set_struct(old, False)
    for key in ("execution", "buckets", "cache_length"):  # the config before these keys
        old.model.pop(key)
    assert spec_for(old, old.method).key == keys["eager"]
