"""EAGLE-3 heads (kind eagle3): the low/mid/high features the verify forward keeps, the fc3 fusion, the
training-time-test loss and a tiny head trained in-process, greedy-exactness and exact sampling on the shared loop
with random heads, the pipeline end to end, and the errors around them."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench import benchmark
from specbench.backends.torch.cached_lm import FeatureLM
from specbench.decoding.dynamic_tree import HeadTree
from specbench.decoding.proposal import StepContext
from specbench.decoding.sampling import Sampler
from specbench.errors import ConfigError
from specbench.methods.feature_head import FeatureHeadMethod
from specbench.methods.greedy import Greedy
from specbench.models.heads.draft_head import DraftHead, HeadConfig, TargetParts, eagle3_layers
from specbench.models.heads.artifact import save_head
from specbench.models.tiny import build_tiny_pair
from specbench.training.heads.eagle3 import chain_accuracy, train_eagle3_stage, unrolled_loss
from specbench.training.heads.pipeline import HeadPipeline
from specbench.training.heads.train import draft_vocabulary, target_to_draft

from .conftest import ROOT, TEST_DEVICE
from .distribution_helpers import (EOS, MAX_NEW, exact_sequence_distribution, goodness_of_fit, sample_generations,
                                   small_vocab_pair)
from .test_head_training import sharegpt_file

PAIRS = {}


def tiny_pair(layers: int = 2):
    if layers not in PAIRS:
        PAIRS[layers] = build_tiny_pair(name="tiny-llama", layers=layers, device=TEST_DEVICE)
    return PAIRS[layers]


def random_head(pair, directory, seed: int = 1, std: float = 0.1, draft_ids=None, **options) -> str:
    config = HeadConfig.for_target(pair.target.config, "eagle3", draft_vocab_size=0 if draft_ids is None
                                   else len(draft_ids), **options)
    save_head(directory, DraftHead(config).init_weights(seed=seed, std=std), draft_ids, {"test": True})
    return str(directory)


# -- the features and the fusion -------------------------------------------------------------------------------------

def test_default_layers_are_eagle3s_low_mid_high_clamped_into_the_target():
    assert eagle3_layers(32) == [2, 16, 29]  # Llama-3.1-8B: EAGLE-3's code reads the inputs of layers 2, 16, 29
    assert eagle3_layers(4) == [2, 2, 1]
    assert eagle3_layers(2) == [1, 1, 0]
    assert HeadConfig.for_target(tiny_pair(4).target.config, "eagle3").feature_layers == [2, 2, 1]
    with pytest.raises(ValueError, match="fuses three layers"):
        HeadConfig.for_target(tiny_pair().target.config, "eagle3", feature_layers=[0, 1])


def test_the_verify_forward_keeps_the_inputs_of_the_chosen_layers():
    pair = tiny_pair(4)
    ids = [5, 6, 7, 8, 9]
    ref = pair.target(input_ids=torch.tensor([ids], device=pair.device), output_hidden_states=True).hidden_states
    lm = FeatureLM(pair.target, layers=[2, 1, 3])
    lm.forward(ids[:3])
    lm.forward(ids[3:])  # a cached call: only its own positions
    expected = torch.cat([ref[2][0, 3:], ref[1][0, 3:], ref[3][0, 3:]], dim=-1)
    assert lm.features_at(range(2)).shape == (2, 3 * 64)
    assert torch.allclose(lm.features_at(range(2)), expected, atol=1e-4)  # cached vs whole: rounding
    plain = FeatureLM(pair.target)
    plain.forward(ids)
    assert plain.features_at([0]).shape == (1, 64)  # without layers: the last hidden state, as before
    assert not pair.target.model.layers[2]._forward_pre_hooks  # the hooks are gone after each call


def test_the_tree_fuses_the_targets_features_with_fc3_as_they_arrive(tmp_path):
    pair = tiny_pair()
    head = DraftHead(HeadConfig.for_target(pair.target.config, "eagle3")).init_weights(seed=2, std=0.2)
    tree = HeadTree(head, TargetParts.of(pair.target, None), 2, 2, 4)
    states = torch.randn(3, 3 * 64)
    tree.observe(SimpleNamespace(features=states))  # a Step: observe reads its features
    assert torch.allclose(tree.features, head.layer_fc(states), atol=1e-6)
    if torch.backends.mkldnn.is_available():  # the pair's oneDNN-packed kernel (bf16 on AVX-512 CPUs) keeps no weight
        from specbench.backends.torch.cpu_linear import pack_linears
        packed = DraftHead(head.cfg)
        packed.load_state_dict(head.state_dict())
        pack_linears(packed)
        assert torch.allclose(packed.fuse_layers(states), head.layer_fc(states), atol=1e-5)
    eagle = DraftHead(HeadConfig.for_target(pair.target.config, "eagle"))
    assert eagle.fuse_layers(states[:, :64]) is not None and not hasattr(eagle, "layer_fc")


# -- training-time test ----------------------------------------------------------------------------------------------

def greedy_sequences(pair, n: int = 12, prompt: int = 6, answer: int = 20) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(3, 250, (prompt,), generator=gen).tolist()
        ids += Greedy(pair, "g").generate(ids, answer, set()).tokens
        out.append({"ids": torch.tensor(ids, dtype=torch.int32), "start": prompt})
    return out


def test_step_j_of_the_unrolled_loss_counts_no_position_before_its_chain_can_start():
    pair = tiny_pair()
    head = DraftHead(HeadConfig.for_target(pair.target.config, "eagle3")).init_weights(seed=0)
    parts = TargetParts.of(pair.target, None)
    ids = torch.arange(10, 20)[None]
    states, final = torch.randn(1, 10, 3 * 64), torch.randn(1, 10, 64)
    _, stats = unrolled_loss(head, parts, ids, [0], [10], states, final, 3, target_to_draft(None, pair.vocab_size))
    assert [s["positions"] for s in stats] == [8, 7, 6]  # m = 8 head positions; step j skips the first j - 1
    _, stats = unrolled_loss(head, parts, ids, [6], [10], states, final, 2, target_to_draft(None, pair.vocab_size))
    assert [s["positions"] for s in stats] == [4, 4]  # answer tokens x_6..x_9: positions 4..7


def test_a_tiny_head_trained_in_process_predicts_better_at_every_unrolled_step():
    pair = tiny_pair()
    sequences = greedy_sequences(pair)
    draft_ids = draft_vocabulary(sequences, 80, pair.vocab_size, set(pair.eos_ids))
    config = HeadConfig.for_target(pair.target.config, "eagle3", draft_vocab_size=len(draft_ids))
    head = DraftHead(config).init_weights(seed=0)
    parts = TargetParts.of(pair.target, draft_ids)
    t2d = target_to_draft(draft_ids, pair.vocab_size)
    before = chain_accuracy(head, parts, pair.target, sequences, t2d, 3)
    rows = train_eagle3_stage(head, parts, pair.target, sequences, t2d, steps=3, epochs=20, lr=3e-3, batch_tokens=104)
    after = chain_accuracy(head, parts, pair.target, sequences, t2d, 3)
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert all(a > b + 0.15 for a, b in zip(after, before)), (before, after)


def test_a_head_as_conf_trains_it_learns_from_a_residual_stream_with_massive_activations(monkeypatch):
    """Qwen2's and Llama's residual streams (the layer inputs fc3 fuses) carry a few channels of ~10^3. A head as
    conf/head/eagle3.yaml builds it (g RMS-normalized, a final norm) learns on them; without the norms g and the
    logits scale with that channel and training barely moves (the embedded pair's first run without them: loss in
    the hundreds, top-1 ~0.02 after 70 steps)."""
    from omegaconf import OmegaConf

    from specbench.training.heads import eagle3 as trainer

    options = {k: v for k, v in OmegaConf.load(ROOT / "conf/head/eagle3.yaml").items()
               if k in ("layer_norm", "final_norm")}
    assert options == {"layer_norm": True, "final_norm": True}
    plain_features = trainer.target_features

    def massive(target, ids, attention, layers):  # one channel of every fused layer input 1000x
        states, final = plain_features(target, ids, attention, layers)
        states = states.clone()
        states[..., 7::64] *= 1000.0
        return states, final

    monkeypatch.setattr(trainer, "target_features", massive)
    pair = tiny_pair()
    sequences = greedy_sequences(pair)
    draft_ids = draft_vocabulary(sequences, 80, pair.vocab_size, set(pair.eos_ids))
    t2d = target_to_draft(draft_ids, pair.vocab_size)
    parts = TargetParts.of(pair.target, draft_ids)
    config = HeadConfig.for_target(pair.target.config, "eagle3", draft_vocab_size=len(draft_ids), **options)
    head = DraftHead(config).init_weights(seed=0)
    before = trainer.chain_accuracy(head, parts, pair.target, sequences, t2d, 3)
    rows = trainer.train_eagle3_stage(head, parts, pair.target, sequences, t2d, steps=3, epochs=20, lr=3e-3,
                                      batch_tokens=104)
    after = trainer.chain_accuracy(head, parts, pair.target, sequences, t2d, 3)
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert all(a > b + 0.3 for a, b in zip(after, before)), (before, after)  # without the norms: +0.16 to +0.22
    assert float(head.fuse_layers(torch.randn(2, 3 * 64) * 1e4).pow(2).mean().sqrt()) < 10  # g at the norm's scale


# -- on the loop -------------------------------------------------------------------------------------------------

cases = st.fixed_dictionaries({
    "layers": st.sampled_from([2, 4]),
    "seed": st.integers(0, 3),
    "std": st.sampled_from([0.05, 0.3]),
    "prompt": st.lists(st.integers(3, 258), min_size=1, max_size=10),
    "top_k": st.integers(1, 4), "depth": st.integers(1, 5), "max_nodes": st.integers(1, 20),
    "max_new_tokens": st.integers(1, 30), "eos_pick": st.one_of(st.none(), st.integers(0, 29)),
    "reduced": st.booleans(),
})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(case=cases)
def test_eagle3_equals_greedy(case, tmp_path_factory):
    pair = tiny_pair(case["layers"])
    free = Greedy(pair, "greedy").generate(case["prompt"], case["max_new_tokens"], set()).tokens
    eos = {free[case["eos_pick"] % len(free)]} if case["eos_pick"] is not None else set()
    ref = Greedy(pair, "greedy").generate(case["prompt"], case["max_new_tokens"], eos)
    directory = tmp_path_factory.mktemp("head")
    draft_ids = torch.arange(3, 200, 2) if case["reduced"] else None
    random_head(pair, directory, seed=case["seed"], std=case["std"], draft_ids=draft_ids)
    method = FeatureHeadMethod(pair, "eagle3", kind="eagle3", head=str(directory), top_k=case["top_k"],
                               depth=case["depth"], max_nodes=case["max_nodes"])
    gen = method.generate(case["prompt"], case["max_new_tokens"], eos)
    assert gen.tokens == ref.tokens
    assert sum(gen.accept_lengths) == len(gen.tokens) and gen.target_forwards == len(gen.accept_lengths)
    assert all(n <= case["max_nodes"] for n in gen.extra["tree_nodes"])
    assert gen.drafted == sum(gen.extra["tree_nodes"])


def test_a_reduced_vocabulary_drafts_only_its_tokens(tmp_path):
    pair = tiny_pair()
    draft_ids = torch.arange(3, 200, 2)
    head = DraftHead(HeadConfig.for_target(pair.target.config, "eagle3", draft_vocab_size=len(draft_ids)))
    tree = HeadTree(head.init_weights(seed=1, std=0.3), TargetParts.of(pair.target, draft_ids), 4, 3, 20)
    lm = FeatureLM(pair.target, layers=head.cfg.feature_layers)
    lm.forward([5, 6, 7])
    tree.observe(SimpleNamespace(features=lm.features_at(range(2))))
    proposal = tree.propose(StepContext([5, 6, 7], 0, 30, set(), Sampler()))
    assert proposal.tokens and set(proposal.tokens) <= set(draft_ids.tolist())


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.9, 0.95)])
def test_sampled_generations_are_distributed_as_the_targets(tmp_path, temperature, top_p):
    pair = small_vocab_pair()
    random_head(pair, tmp_path, std=0.3)
    method = FeatureHeadMethod(pair, "eagle3", kind="eagle3", head=str(tmp_path), top_k=2, depth=2, max_nodes=4,
                               temperature=temperature, top_p=top_p)
    prompt = [1, 2, 4]
    counts, gens = sample_generations(method, prompt, MAX_NEW, {EOS}, 2000)
    assert sum(g.drafted for g in gens) > 1000 and sum(g.accepted for g in gens) > 100  # the test has power
    target = exact_sequence_distribution(pair.target, temperature, top_p, prompt, MAX_NEW, {EOS})
    assert goodness_of_fit(counts, target) > 1e-3


# -- errors ----------------------------------------------------------------------------------------------------------

def test_heads_for_another_target_or_kind_and_published_ids_are_refused(tmp_path):
    deep = tiny_pair(4)
    random_head(deep, tmp_path / "deep")  # layers [2, 2, 1]: the 2-layer target has no layer 2
    with pytest.raises(ConfigError, match=r"^method\.head: .* was made for another target \(feature_layers "
                                          r"\[2, 2, 1\] but the target has 2 decoder layers\)"):
        FeatureHeadMethod(tiny_pair(), "eagle3", kind="eagle3", head=str(tmp_path / "deep"))
    random_head(tiny_pair(), tmp_path / "e3")
    with pytest.raises(ConfigError, match=r"^method\.head: .* is a eagle3 head; method eagle needs a eagle head"):
        FeatureHeadMethod(tiny_pair(), "eagle", kind="eagle", head=str(tmp_path / "e3"))
    with pytest.raises(ConfigError, match=r"^method\.kind: must be one of \['eagle', 'griffin', 'eagle3'\]"):
        FeatureHeadMethod(tiny_pair(), "eagle4", kind="eagle4", head=str(tmp_path / "e3"))


def test_a_static_target_taps_the_same_layers_inside_its_forward_and_eagle3_equals_greedy(tmp_path):
    """Static/graphs execution: the layer taps are part of the static forward (captured with it in graphs), in a
    static cache of their own; the features equal the eager FeatureLM's and EAGLE-3 decodes exactly greedy."""
    from specbench.backends.execution import resolve_execution

    eager = tiny_pair(4)
    static = eager.with_execution(resolve_execution("static", TEST_DEVICE))
    ids = [5, 6, 7, 8, 9]
    reference, tapped = FeatureLM(eager.target, layers=[2, 1, 3]), static.lm("target", True, layers=[2, 1, 3])
    logits = []
    for lm in (reference, tapped):
        lm.forward(ids[:3])
        logits.append(lm.forward(ids[3:]))
    assert torch.allclose(tapped.features_at(range(2)), reference.features_at(range(2)), atol=1e-4)
    assert torch.allclose(logits[1], logits[0], atol=1e-4)  # the logits from the last hidden state, not the taps
    assert set(static.statics) == {"target:taps(2, 1, 3)"}  # greedy's static target stays without taps
    random_head(eager, tmp_path)
    reference_tokens = Greedy(static, "greedy").generate(ids, 20, set()).tokens
    method = FeatureHeadMethod(static, "eagle3", kind="eagle3", head=str(tmp_path), top_k=3, depth=3, max_nodes=8)
    assert method.generate(ids, 20, set()).tokens == reference_tokens


def published_eagle3_state(pair, draft_ids, seed=5):
    """A released EAGLE-3 head's layout (fc, midlayer.*, norm, lm_head over the draft vocabulary, d2t offsets,
    t2d), from one of ours with the released layer (norm_concat) and random weights."""
    config = HeadConfig.for_target(pair.target.config, "eagle3", fusion="norm_concat", final_norm=True,
                                   draft_vocab_size=len(draft_ids))
    head = DraftHead(config).init_weights(seed=seed, std=0.2)
    names = {"layer_fc.": "fc.", "fusion.embed_norm.": "midlayer.input_layernorm.",
             "fusion.hidden_norm.": "midlayer.hidden_norm.", "norm.": "norm."}
    state = {}
    for name, value in head.state_dict().items():
        prefix = next((k for k in names if name.startswith(k)), None)
        state[names[prefix] + name[len(prefix):] if prefix else "midlayer." + name] = value
    lm_head = torch.randn(len(draft_ids), 64, generator=torch.Generator().manual_seed(seed))
    state.update({"lm_head.weight": lm_head, "d2t": draft_ids - torch.arange(len(draft_ids)),
                  "t2d": torch.zeros(pair.vocab_size, dtype=torch.bool)})
    return head, lm_head, state


def test_a_published_eagle3_checkpoint_loads_from_the_hub_cache_and_drafts(tmp_path, monkeypatch):
    from transformers import LlamaConfig

    from .test_feature_heads import hub_snapshot

    pair = tiny_pair(4)
    draft_ids = torch.arange(3, 200, 2)
    head, lm_head, state = published_eagle3_state(pair, draft_ids)
    config = LlamaConfig(**{**pair.target.config.to_dict(), "num_hidden_layers": 1, "draft_vocab_size": len(draft_ids)})
    hub_snapshot(tmp_path / "hub", "someone/EAGLE3-tiny", config, state, monkeypatch)
    method = FeatureHeadMethod(pair, "eagle3", kind="eagle3", head="someone/EAGLE3-tiny", top_k=3, depth=3,
                               max_nodes=8)
    assert method.artifact.config.feature_layers == [2, 2, 1]  # the target's 2, L/2, L-3 (L = 4)
    assert torch.equal(method.parts.draft_ids, draft_ids) and torch.equal(method.parts.lm_head_weight, lm_head)
    for name, value in head.state_dict().items():
        assert torch.equal(method.head.state_dict()[name].cpu(), value)
    for prompt in ([5, 9, 14, 200, 31], [7, 7, 7]):
        gen = method.generate(prompt, 16, set())
        assert gen.tokens == Greedy(pair, "g").generate(prompt, 16, set()).tokens
    with pytest.raises(ConfigError, match=r"^method\.head: someone/EAGLE3-absent is not in the local Hugging Face "
                                          r"cache and hub access is off"):
        FeatureHeadMethod(pair, "eagle3", kind="eagle3", head="someone/EAGLE3-absent")


def test_the_released_layer_reads_normed_token_and_feature_with_g_as_its_residual():
    pair = tiny_pair()
    config = HeadConfig.for_target(pair.target.config, "eagle3", fusion="norm_concat", final_norm=True)
    head = DraftHead(config).init_weights(seed=1, std=0.2)
    assert head.self_attn.q_proj.in_features == 2 * 64
    e, g = torch.randn(1, 3, 64), torch.randn(1, 3, 64)
    predict, hidden = head(e, g, torch.arange(3)[None])
    with torch.no_grad():
        head.self_attn.o_proj.weight.zero_()
        head.mlp.down_proj.weight.zero_()
    predict, hidden = head(e, g, torch.arange(3)[None])
    assert torch.allclose(hidden, g) and torch.allclose(predict, head.norm(g))  # zero layer: g passes through


# -- the pipeline ----------------------------------------------------------------------------------------------------

def test_pipeline_trains_an_eagle3_head_then_method_eagle3_decodes_with_it(tmp_path):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="heads", overrides=[
            "model=tiny_llama", f"model.device={TEST_DEVICE}", f"data.path={sharegpt_file(tmp_path / 'sg.json', 14)}",
            "data.prompts=10", "data.max_new_tokens=20", "data.batch_size=4", "data.exclude=[]", "head=eagle3",
            "head.draft_vocab_size=120", "head.train.batch_tokens=256", "head.train.max_length=64",
            "head.train.stages=[{passes:2,epochs:2,lr:3e-3}]", f"paths.root={tmp_path / 'runs'}"])
    HeadPipeline(cfg).run("all")
    head_dir = tmp_path / "runs" / "heads" / "tiny-llama" / "eagle3"
    meta = json.loads((head_dir / "head.json").read_text())
    assert meta["config"]["kind"] == "eagle3" and meta["config"]["feature_layers"] == [1, 1, 0]
    assert meta["config"]["draft_vocab_size"] == 120
    assert meta["config"]["layer_norm"] and meta["config"]["final_norm"]  # conf/head/eagle3.yaml reaches the head
    evaluation = json.loads((head_dir / "evaluation.json").read_text())
    assert len(evaluation["top1_by_unrolled_step"]) == 2
    pair = PAIRS.setdefault(2, build_tiny_pair(name="tiny-llama", device=TEST_DEVICE))
    method = FeatureHeadMethod(pair, "eagle3", kind="eagle3", head=str(head_dir), top_k=3, depth=3)
    assert method.identity["sha256"] == meta["sha256"]
    prompt = pair.encode("prompt 3: say something about 21")
    assert method.generate(prompt, 16, set()).tokens == Greedy(pair, "g").generate(prompt, 16, set()).tokens
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        run_cfg = compose(config_name="config", overrides=[
            "model=tiny_llama", f"model.device={TEST_DEVICE}", "method=eagle3", "method.depth=3",
            f"paths.root={tmp_path / 'runs'}", "data=gsm8k", "data.limit=2", "data.max_new_tokens=12",
            "runner.warmup=0", "runner.progress=false"])
    summary = benchmark.run(run_cfg)  # the CLI's path: conf/method/eagle3.yaml finds the head by its name
    assert summary["identical"] == summary["compared"] == 2
    record = json.loads(next((tmp_path / "runs" / "records").rglob("*eagle3*.jsonl")).read_text().splitlines()[0])
    assert record["config"]["method"]["head_sha256"] == meta["sha256"]
