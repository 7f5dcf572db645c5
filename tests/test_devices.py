"""Real pairs on GPUs, without one: tensors built on the device of the logits they meet, a cache whose layers
sit on several devices (device_map=auto), and target/draft vocabularies of different sizes. With
SPECBENCH_TEST_DEVICE=cuda the DISCO path runs on the GPU too."""
import copy
from types import SimpleNamespace

import pytest
import torch

from specbench.backends.torch.cached_lm import CachedLM, fit_vocabulary
from specbench.errors import ConfigError
from specbench.methods.disco import DiscoClassifier, DiscoSL, disco_features
from specbench.methods.greedy import Greedy
from specbench.methods.hf_assisted import HFAssisted
from specbench.methods.speculative import SpeculativeDecoding
from specbench.models.pair import ModelPair
from specbench.training.disco.extract import extract_prompt

from .conftest import TEST_DEVICE
from .test_equivalence import pair_for

DEVICE = TEST_DEVICE  # SPECBENCH_TEST_DEVICE, e.g. cuda, to check the GPU code path


def test_disco_features_follow_the_logits_device():
    logits = torch.randn(3, 20, device="meta")  # not the CPU: a position feature built on the CPU cannot join it
    assert disco_features(logits, torch.arange(3)).device.type == "meta"
    assert disco_features(logits[0], 7).shape == (12,)


def test_disco_decodes_and_extracts_on_the_test_device():
    pair = pair_for("llama", 0.05)  # on SPECBENCH_TEST_DEVICE
    classifier = DiscoClassifier(top_k=10, hidden=8)  # built on the CPU, as load_classifier does
    method = SpeculativeDecoding(pair, "disco", policy=DiscoSL(classifier, threshold=0.3, sl_max=4))
    gen = method.generate([5, 6, 7, 8], 12, set())
    assert gen.tokens == Greedy(pair, "greedy").generate([5, 6, 7, 8], 12, set()).tokens
    assert classifier.mean.device.type == pair.device.type
    row = extract_prompt(pair, [5, 6, 7, 8], 6, set(), top_k=10)
    assert len(row["labels"]) == len(row["tokens"]) == 6 and len(row["features"][0]) == 12


class FakeKV:
    """Stands for a layer's key/value tensor on ``device``: index_select demands an index on the same device."""

    def __init__(self, device: str):
        self.device = torch.device(device)

    def index_select(self, dim: int, index: torch.Tensor) -> "FakeKV":
        assert index.device == self.device, f"index on {index.device} for a layer on {self.device}"
        return self


def test_keep_positions_indexes_each_layer_on_its_own_device():
    lm = CachedLM(pair_for("llama", 0.05).target)
    lm.cache = SimpleNamespace(layers=[SimpleNamespace(keys=FakeKV(d), values=FakeKV(d)) for d in ("cpu", "meta")])
    lm.keep_positions([0, 2, 3])  # layer 0 on one device, layer 1 on another


def test_fit_vocabulary_cuts_or_pads_with_minus_infinity():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    assert fit_vocabulary(logits, 2).tolist() == [[1.0, 2.0]]
    padded = fit_vocabulary(logits, 5)
    assert padded[0, :3].tolist() == [1.0, 2.0, 3.0] and padded[0, 3:].eq(float("-inf")).all()
    assert fit_vocabulary(logits, None) is logits


def pair_with_draft_vocab(extra_rows: int, favour_padding: bool = False) -> ModelPair:
    """The tiny pair, its draft a copy of the target with ``extra_rows`` more (padded) vocabulary rows;
    ``favour_padding``: the padded rows always win the draft's argmax unless the harness cuts them off."""
    base = pair_for("llama", 0.0)
    draft = copy.deepcopy(base.target)
    draft.resize_token_embeddings(len(base.tokenizer) + extra_rows)
    if favour_padding:
        bonus = torch.zeros(len(base.tokenizer) + extra_rows, device=base.device)
        bonus[len(base.tokenizer):] = 1e4
        draft.get_output_embeddings().register_forward_hook(lambda module, inputs, out: out + bonus)
    return ModelPair(name="unequal", target=base.target, draft=draft, tokenizer=base.tokenizer,
                     eos_ids=base.eos_ids, precision=base.precision)


def test_a_larger_draft_vocabulary_never_proposes_an_id_the_target_lacks():
    pair = pair_with_draft_vocab(16, favour_padding=True)
    assert pair.info["vocabularies"]["target"] == 259 and pair.info["vocabularies"]["draft"] == 275
    gen = SpeculativeDecoding(pair, "speculative", gamma=4).generate([5, 6, 7], 10, set())
    assert gen.tokens == Greedy(pair, "greedy").generate([5, 6, 7], 10, set()).tokens
    assert gen.accepted == gen.drafted  # the draft is the target once its padded rows are cut off


@pytest.mark.parametrize("extra_rows", [16, 0])
def test_unequal_vocabularies_sample_at_temperature_above_zero(extra_rows):
    pair = pair_with_draft_vocab(extra_rows)
    gen = SpeculativeDecoding(pair, "speculative", gamma=3, temperature=0.8, seed=1).generate([5, 6, 7], 10, set())
    assert len(gen.tokens) == 10 and max(gen.tokens) < 259


def test_a_smaller_draft_vocabulary_samples_too():
    base = pair_for("llama", 0.0)
    target = copy.deepcopy(base.target)
    target.resize_token_embeddings(len(base.tokenizer) + 16)  # the target is the padded one (CodeLlama 34B / 7B)
    pair = ModelPair(name="unequal", target=target, draft=base.target, tokenizer=base.tokenizer,
                     eos_ids=base.eos_ids, precision=base.precision)
    gen = SpeculativeDecoding(pair, "speculative", gamma=3, temperature=0.8, seed=1).generate([5, 6, 7], 10, set())
    assert len(gen.tokens) == 10


def test_a_tokenizer_larger_than_a_model_is_refused_naming_the_sizes():
    base = pair_for("llama", 0.0)
    draft = copy.deepcopy(base.target)
    draft.resize_token_embeddings(200)
    with pytest.raises(ConfigError, match=r"259 tokens.*draft's 200"):
        ModelPair(name="bad", target=base.target, draft=draft, tokenizer=base.tokenizer, eos_ids=base.eos_ids,
                  precision=base.precision)


def test_hf_assisted_refuses_to_sample_with_unequal_vocabularies():
    pair = pair_with_draft_vocab(16)
    with pytest.raises(ConfigError, match="vocabularies of one size"):
        HFAssisted(pair, "hf_assisted", temperature=0.8)
    HFAssisted(pair, "hf_assisted")  # greedy: transformers compares ids only
