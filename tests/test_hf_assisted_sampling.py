"""hf_assisted (transformers' assisted generation, methods/hf_assisted.py) at temperature > 0, on tiny fp32 models:
seeds fix the output, and the outputs are samples of the target's own distribution (whole generations over a
6-token vocabulary, and the first token over the byte-level pair's 259).

Statistical tests use fixed seeds (generation i after ``reset(i)``), so they are deterministic; the threshold
p < 1e-3 is the false-failure rate each would have under a correct sampler with fresh seeds.
"""
from collections import Counter

import pytest
import torch

from specbench.methods.hf_assisted import HFAssisted
from specbench.methods.speculative import SpeculativeDecoding
from specbench.models.tiny import build_tiny_pair

from .distribution_helpers import one_thread  # noqa: F401  (autouse fixture: one torch thread)
from .distribution_helpers import (EOS, MAX_NEW, PROMPT, exact_sequence_distribution, goodness_of_fit, outputs_by_seed,
                                   reference_probs, sample_generations, small_vocab_pair)

ALPHA = 1e-3


@pytest.fixture(scope="module")
def byte_pair():
    return build_tiny_pair(name="tiny-llama", arch="llama", draft_noise=0.5)


def outcome(gen):
    return gen.tokens, gen.target_forwards, gen.draft_forwards, gen.forward_sizes


# -- seeds ----------------------------------------------------------------------------------------------------------

def test_same_seed_same_output_whatever_the_global_rng(byte_pair):
    method = HFAssisted(byte_pair, "hf_assisted", gamma=3, temperature=1.0, top_p=0.95)
    prompt = [10, 20, 30]
    method.reset(5)
    first = outcome(method.generate(prompt, 16, set()))
    assert first[1] > 1 and len(first[0]) == 16
    method.reset(9)
    method.generate([200, 201], 11, set())  # another prompt and seed in between
    torch.manual_seed(1234)
    method.reset(5)
    assert outcome(method.generate(prompt, 16, set())) == first
    torch.manual_seed(4321)
    again = HFAssisted(byte_pair, "hf_assisted", gamma=3, temperature=1.0, top_p=0.95)
    again.reset(5)
    assert outcome(again.generate(prompt, 16, set())) == first


def test_constructor_seed_is_used_like_reset(byte_pair):
    prompt = [10, 20, 30]
    reset = HFAssisted(byte_pair, "hf_assisted", gamma=3, temperature=1.0)
    reset.reset(5)
    built = HFAssisted(byte_pair, "hf_assisted", gamma=3, temperature=1.0, seed=5)
    assert built.generate(prompt, 16, set()).tokens == reset.generate(prompt, 16, set()).tokens


def test_different_seeds_give_different_outputs(byte_pair):
    method = HFAssisted(byte_pair, "hf_assisted", gamma=3, temperature=1.0)
    # 12 tokens at T=1 over 259 tokens: a repeat would mean the seed is ignored
    assert len(outputs_by_seed(method, [10, 20, 30], 12)) == 6


# -- distributions --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature, top_p, n", [(1.0, 1.0, 1000), (0.7, 0.8, 800)])
def test_generations_are_distributed_as_the_targets(temperature, top_p, n):
    """Whole generations (at most 3 tokens, EOS in the vocabulary) against the target's exact distribution over all
    156 possible ones. The vocabulary (6) is below HF's top_k default (50), so this checks the assisted sampling
    itself, not the settings (see the next test)."""
    pair = small_vocab_pair()
    target = exact_sequence_distribution(pair.target, temperature, top_p, PROMPT, MAX_NEW, {EOS})
    draft = exact_sequence_distribution(pair.draft, temperature, top_p, PROMPT, MAX_NEW, {EOS})
    method = HFAssisted(pair, "hf_assisted", gamma=2, temperature=temperature, top_p=top_p)
    counts, gens = sample_generations(method, PROMPT, MAX_NEW, {EOS}, n)
    assert sum(c for seq, c in counts.items() if len(seq) < MAX_NEW) > 50  # EOS ended some generations early
    assert sum(g.draft_forwards for g in gens) > 0  # the assistant was used
    assert goodness_of_fit(counts, target) > ALPHA
    assert goodness_of_fit(counts, draft) < 1e-6  # power: the draft's own distribution is rejected


def first_tokens(method, prompt, n):
    counts = Counter()
    for seed in range(n):
        method.reset(seed)
        counts[(method.generate(prompt, 2, set()).tokens[0],)] += 1
    return counts


@pytest.mark.parametrize("method_class", [
    SpeculativeDecoding,
    HFAssisted,
])
def test_first_token_covers_the_whole_vocabulary(byte_pair, method_class):
    """400 first tokens after a prompt on the byte-level pair (259 tokens, fairly flat at T=1: 18.5% of the
    target's mass lies outside its 50 likeliest tokens here) against the target's exact first-token distribution."""
    prompt = [5, 6, 7, 8]
    with torch.inference_mode():
        p = reference_probs(byte_pair.target(torch.tensor([prompt])).logits[0, -1], 1.0, 1.0)
    top50 = set(sorted(range(len(p)), key=lambda v: -p[v])[:50])
    outside_mass = 1.0 - sum(p[v] for v in top50)
    assert 0.15 < outside_mass < 0.25  # the premise of the test (about 74 of 400 expected outside, sd 7.8)
    counts = first_tokens(method_class(byte_pair, "m", gamma=3, temperature=1.0), prompt, 400)
    outside = sum(c for (token,), c in counts.items() if token not in top50)
    assert outside > 40, f"only {outside} of 400 first tokens outside the target's top 50 (about 74 expected)"
    assert goodness_of_fit(counts, {(v,): pv for v, pv in enumerate(p)}) > ALPHA
