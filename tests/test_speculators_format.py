"""EAGLE-3 heads in the speculators format (models/heads/speculators_format.py), the one vLLM reads: a head written here
loads back identical and drafts greedy's output; the reference, the ``speculators`` package's own Eagle3DraftModel
(installed by make install), loads what we write and ranks the same draft tokens as our head at every position;
layouts this head cannot be are refused by name."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from specbench.errors import ConfigError
from specbench.methods.feature_head import FeatureHeadMethod
from specbench.methods.greedy import Greedy
from specbench.models.heads.draft_head import DraftHead, HeadConfig, TargetParts
from specbench.models.heads.artifact import load_head, save_head
from specbench.models.heads.speculators_format import save_speculators
from specbench.models.tiny import build_tiny_pair

from .conftest import TEST_DEVICE

PAIRS = {}


def tiny_pair(layers: int = 4):
    if layers not in PAIRS:
        PAIRS[layers] = build_tiny_pair(name="tiny-llama", layers=layers, device=TEST_DEVICE)
    return PAIRS[layers]


def released_head(pair, seed: int = 3, bias: bool = False, draft_ids=None) -> DraftHead:
    """A random EAGLE-3 head of the released layout (norm-concat layer, final norm), its norms not at 1."""
    config = HeadConfig.for_target(pair.target.config, "eagle3", fusion="norm_concat", final_norm=True,
                                   draft_vocab_size=0 if draft_ids is None else len(draft_ids))
    head = DraftHead(dataclasses.replace(config, attention_bias=bias)).init_weights(seed=seed, std=0.2)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.dim() == 1:  # norms' gains and biases: a swapped or dropped one changes the output
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
    return head


def export(pair, head, directory, draft_ids=None):
    parts = TargetParts.of(pair.target, draft_ids)
    save_speculators(directory, head, parts.lm_head_weight, draft_ids, parts.embed_weight, verifier="tiny-llama",
                     verifier_architecture="LlamaForCausalLM", max_positions=4096)
    return parts


@pytest.mark.parametrize("bias", [False, True])
def test_a_head_written_in_the_speculators_format_loads_back_identical_and_drafts_greedys_output(tmp_path, bias):
    pair = tiny_pair()
    draft_ids = torch.arange(3, 250, 3)
    head = released_head(pair, bias=bias, draft_ids=draft_ids)
    parts = export(pair, head, tmp_path / "spec", draft_ids)
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == len(draft_ids)
    assert config["norm_before_residual"] is False  # vLLM takes a missing one as true
    assert config["eagle_aux_hidden_state_layer_ids"] == head.cfg.feature_layers
    artifact = load_head(str(tmp_path / "spec"), "eagle3")
    for name, value in head.state_dict().items():
        assert torch.equal(artifact.state[name], value), name
    assert torch.equal(artifact.draft_ids, draft_ids) and torch.equal(artifact.lm_head, parts.lm_head_weight)
    assert dataclasses.replace(artifact.config, target={}) == dataclasses.replace(head.cfg, target={})
    method = FeatureHeadMethod(pair, "eagle3", kind="eagle3", head=str(tmp_path / "spec"), top_k=3, depth=3,
                               max_nodes=8)
    assert method.identity["sha256"] == artifact.sha256
    for prompt in ([5, 9, 14, 200, 31], [7, 7, 7]):
        assert method.generate(prompt, 16, set()).tokens == Greedy(pair, "g").generate(prompt, 16, set()).tokens


def test_layouts_the_format_cannot_hold_are_refused_by_name(tmp_path):
    pair = tiny_pair()
    ours = DraftHead(HeadConfig.for_target(pair.target.config, "eagle3", layer_norm=True, final_norm=True))
    with pytest.raises(ConfigError, match="fusion fc .*norm_concat"):
        export(pair, ours, tmp_path / "fc")
    export(pair, released_head(pair), tmp_path / "spec")
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    (tmp_path / "spec" / "config.json").write_text(json.dumps({**config, "norm_before_fc": True}))
    with pytest.raises(ConfigError, match=r"^method\.head: .* sets \['norm_before_fc'\]"):
        load_head(str(tmp_path / "spec"), "eagle3")
    (tmp_path / "spec" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="method=eagle3 runs it"):
        load_head(str(tmp_path / "spec"), "eagle")


def speculators_model(directory, pair):
    try:
        from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    except ImportError:  # make install adds it (pyproject's `reference` extra); CI (make test) must have it
        if os.environ.get("SPECBENCH_REFERENCES") == "required":
            raise
        pytest.skip("speculators is not installed (make install adds it)")
    config = Eagle3SpeculatorConfig.from_pretrained(directory)
    verifier = directory.parent / "verifier"  # it reads the verifier's config and lm_head (unused to draft)
    pair.target.save_pretrained(verifier)
    config.speculators_config.verifier.name_or_path = str(verifier)
    config.transformer_layer_config._attn_implementation = "eager"  # flex attention needs a GPU compiler
    return Eagle3DraftModel.from_pretrained(directory, config=config).eval()


@pytest.mark.parametrize("bias", [False, True])
def test_the_speculators_reference_loads_what_we_write_and_drafts_the_same_tokens(tmp_path, bias):
    """Over a sequence of the target's fused features and tokens, the first training-time-test step of
    speculators' Eagle3DraftModel (the reference) and our head's forward rank the same draft token at every
    position: its fc, both norms, the 2H attention, rotary, MLP, final norm and lm_head read our file as we do."""
    pair = tiny_pair(8)  # its feature layers 2, 4, 5: distinct, as speculators requires
    draft_ids = torch.arange(2, 259, 2)
    head = released_head(pair, seed=5, bias=bias, draft_ids=draft_ids).eval()
    parts = export(pair, head, tmp_path / "spec", draft_ids)
    reference = speculators_model(tmp_path / "spec", pair)
    gen = torch.Generator().manual_seed(0)
    n = 24
    ids = torch.randint(3, 259, (1, n), generator=gen)
    states = torch.randn(1, n, 3 * 64, generator=gen) * 3  # stands in for [low; mid; high]
    with torch.no_grad():
        theirs = reference(hidden_states=states, input_ids=ids, document_ids=torch.zeros(1, n, dtype=torch.long),
                           ttt_steps=1)[0][0]
        predict, _ = head(parts.embed(ids), head.fuse_layers(states), torch.arange(n)[None])
        ours = parts.logits(predict).argmax(-1)[0]
    assert torch.equal(ours, theirs), (ours, theirs)
    other = released_head(pair, seed=6, bias=bias, draft_ids=draft_ids).eval()  # the test can fail: another head
    with torch.no_grad():
        assert not torch.equal(parts.logits(other(parts.embed(ids), other.fuse_layers(states),
                                                        torch.arange(n)[None])[0]).argmax(-1)[0], theirs)


def test_the_pipeline_trains_a_released_layout_head_and_exports_it(tmp_path):
    """head=eagle3_published (norm-concat layer, 7 training-time-test steps) trains on the tiny pair; stage=export
    writes it for vLLM, and method=eagle3 decodes with the written directory."""
    from hydra import compose, initialize_config_dir

    from specbench.training.heads.pipeline import HeadPipeline

    from .conftest import ROOT
    from .test_head_training import sharegpt_file

    data = sharegpt_file(tmp_path / "s.json", 8)
    overrides = ["model=tiny_llama", f"model.device={TEST_DEVICE}", f"data.path={data}", "data.prompts=6",
                 "data.max_new_tokens=16", "data.batch_size=3", "data.exclude=[]",
                 "head=eagle3_published", "head.draft_vocab_size=100", "head.train.batch_tokens=256",
                 "head.train.max_length=48", "head.train.stages=[{passes:7,epochs:1,lr:3e-3}]",
                 f"paths.root={tmp_path / 'runs'}"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        HeadPipeline(compose(config_name="heads", overrides=overrides)).run("all")  # all: trains and exports
    head_dir = tmp_path / "runs" / "heads" / "tiny-llama" / "eagle3_published"
    meta = json.loads((head_dir / "head.json").read_text())
    assert (meta["config"]["fusion"], meta["config"]["layer_norm"]) == ("norm_concat", False)
    assert len(json.loads((head_dir / "evaluation.json").read_text())["top1_by_unrolled_step"]) == 7
    pair = tiny_pair(2)
    trained = load_head(str(head_dir), "eagle3").build()
    exported = load_head(str(head_dir / "speculators"), "eagle3")
    for name, value in trained.state_dict().items():
        assert torch.equal(exported.state[name], value), name
    method = FeatureHeadMethod(pair, "eagle3", kind="eagle3", head=str(head_dir / "speculators"), top_k=3, depth=3)
    prompt = pair.encode("prompt 3: say something about 21")
    assert method.generate(prompt, 12, set()).tokens == Greedy(pair, "g").generate(prompt, 12, set()).tokens
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        eagle = compose(config_name="heads", overrides=["model=tiny_llama", "head=eagle3", "stage=export",
                                                        f"paths.root={tmp_path / 'runs'}"])
    (tmp_path / "runs" / "heads" / "tiny-llama" / "eagle3").mkdir(parents=True)
    (tmp_path / "runs" / "heads" / "tiny-llama" / "eagle3" / "head.json").write_text(json.dumps(
        {"config": dataclasses.asdict(HeadConfig.for_target(pair.target.config, "eagle3", layer_norm=True))}))
    with pytest.raises(ConfigError, match=r"^stage: export writes EAGLE-3 heads of the released layout; .* fusion fc"):
        HeadPipeline(eagle).run("export")


def test_save_head_of_the_released_layout_keeps_it(tmp_path):
    """Our own artifact holds a norm-concat head too (the pipeline's stages), loaded back identical."""
    pair = tiny_pair()
    head = released_head(pair)
    save_head(tmp_path / "ours", head, None, {"test": True})
    assert all(torch.equal(load_head(str(tmp_path / "ours"), "eagle3").state[k], v)
               for k, v in head.state_dict().items())
