"""The whole speculative loop at temperature > 0 (methods/speculative.py + decoding/loop.py + verify.py tree sampling +
decoding/sampling.py), on tiny fp32 models:

(a) whole generations are distributed as the target's own autoregressive samples (exact, by enumeration);
(b) after rejections, both KV caches hold exactly the committed tokens: every distribution the loop used equals a
    fresh full forward on the committed sequence, and so do the caches left at the end;
(c) a seed fixes the output and every counter; different seeds give different outputs.

Statistical tests use fixed seeds (generation i is sampled after ``reset(i)``), so they are deterministic; the
rejection threshold p < 1e-3 is the false-failure rate each would have under a correct sampler with fresh seeds.
"""
import pytest
import torch

from specbench.backends.torch.cached_lm import CachedLM
from specbench.decoding.sampling import Sampler
from specbench.decoding import loop
from specbench.methods.speculative import SpeculativeDecoding
from specbench.models.tiny import build_tiny_pair

from .distribution_helpers import one_thread  # noqa: F401  (autouse fixture: one torch thread)
from .distribution_helpers import (EOS, MAX_NEW, PROMPT, exact_sequence_distribution, goodness_of_fit, outputs_by_seed,
                                   sample_generations, small_vocab_pair)

ALPHA = 1e-3  # false-failure rate of each distribution test (chi-square p-value threshold)


@pytest.fixture(scope="module")
def small_pair():
    return small_vocab_pair()


# -- (a) the distribution of whole generations ----------------------------------------------------------------------

@pytest.mark.parametrize("gamma, temperature, top_p", [(2, 1.0, 1.0), (1, 0.7, 0.8)])
def test_generations_are_distributed_as_the_targets(small_pair, gamma, temperature, top_p):
    """3000 generations of at most 3 tokens over a 6-token vocabulary (EOS included, so drafts contain EOS) against
    the target's exact distribution over all 156 possible generations. γ=2 drafts both remaining positions at once
    (bonus token path); γ=1 verifies one draft token per step (more steps, more cache crops) with nucleus
    truncation on both models."""
    target = exact_sequence_distribution(small_pair.target, temperature, top_p, PROMPT, MAX_NEW, {EOS})
    draft = exact_sequence_distribution(small_pair.draft, temperature, top_p, PROMPT, MAX_NEW, {EOS})
    assert sum(target.values()) == pytest.approx(1.0, abs=1e-5)
    method = SpeculativeDecoding(small_pair, "speculative", gamma=gamma, temperature=temperature, top_p=top_p)
    counts, gens = sample_generations(method, PROMPT, MAX_NEW, {EOS}, 3000)
    # the cases the test is about occurred: rejections (with a correction token), early EOS, full-length outputs
    drafted, accepted = sum(g.drafted for g in gens), sum(g.accepted for g in gens)
    assert 0.5 * drafted < accepted < 0.95 * drafted
    assert sum(c for seq, c in counts.items() if len(seq) < MAX_NEW) > 100
    assert goodness_of_fit(counts, target) > ALPHA
    # and the test has power: the same samples are far from the draft's own distribution
    assert goodness_of_fit(counts, draft) < 1e-6


def test_distribution_test_detects_a_verifier_without_the_residual(small_pair, monkeypatch):
    """Power check of the test above against a realistic bug: at a rejection, sampling the correction from p
    instead of norm(max(0, p - q)). 1500 generations suffice to reject it (p ~ 1e-20 here)."""
    def no_residual(proposal, target_probs, sampler):  # a chain: node i hangs from i - 1
        draft, draft_probs = proposal.tokens, proposal.probs
        for i, token in enumerate(draft):
            if sampler.uniform() * float(draft_probs[i, token]) < float(target_probs[i, token]):
                continue
            return list(range(i)), sampler.sample(target_probs[i])
        return list(range(len(draft))), sampler.sample(target_probs[len(draft)])

    monkeypatch.setattr(loop, "verify_tree_sampling", no_residual)
    target = exact_sequence_distribution(small_pair.target, 1.0, 1.0, PROMPT, MAX_NEW, {EOS})
    counts, _ = sample_generations(SpeculativeDecoding(small_pair, "speculative", gamma=2, temperature=1.0),
                                   PROMPT, MAX_NEW, {EOS}, 1500)
    assert goodness_of_fit(counts, target) < ALPHA


# -- (b) the KV caches after rejections -----------------------------------------------------------------------------

PAIRS = {}


def noisy_pair(arch):
    """Byte-level tiny pair with a noisy draft (noise 0.5: about half the draft tokens rejected at T=1)."""
    if arch not in PAIRS:
        PAIRS[arch] = build_tiny_pair(name=f"tiny-{arch}", arch=arch, draft_noise=0.5)
    return PAIRS[arch]


@torch.inference_mode()
def fresh_probs(model, sampler, ids: list[int], rows: int) -> torch.Tensor:
    """The processed next-token distributions after each of the last ``rows`` positions of ``ids``, from one
    full forward with no cache."""
    return sampler.probs(model(torch.tensor([ids])).logits[0, -rows:].float())


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.8, 0.9)])
def test_caches_hold_the_committed_sequence_after_rejections(arch, temperature, top_p, monkeypatch):
    """Record what every verification step was given (draft tokens, q from the draft's cache, p from the target's)
    and the CachedLMs the loop drove; then check each step's q and p against fresh full forwards on the committed
    sequence (a cache still holding a rejected token, or cropped one position off, changes them), the counters
    against the steps, and the caches left after generate against a fresh forward."""
    pair = noisy_pair(arch)
    steps, lms = [], []
    real_verify = loop.verify_tree_sampling

    def recording_verify(proposal, target_probs, sampler):
        path, nxt = real_verify(proposal, target_probs, sampler)
        draft, draft_probs = proposal.tokens, proposal.probs
        steps.append((list(draft), None if draft_probs is None else draft_probs.clone(), target_probs.clone(),
                      len(path), nxt))
        return path, nxt

    real_init = CachedLM.__init__

    def recording_init(self, *args, **kwargs):  # every CachedLM the loop builds, however it builds it
        real_init(self, *args, **kwargs)
        lms.append(self)

    monkeypatch.setattr(loop, "verify_tree_sampling", recording_verify)
    monkeypatch.setattr(CachedLM, "__init__", recording_init)
    prompt, budget, gamma = [17, 42, 99, 100, 5], 40, 4
    method = SpeculativeDecoding(pair, "speculative", gamma=gamma, temperature=temperature, top_p=top_p)
    method.reset(7)
    gen = method.generate(prompt, budget, set())
    sampler = Sampler(temperature, top_p)

    # rejections happened, and steps ran after them (so post-rejection cache states were used)
    assert gen.accepted < gen.drafted
    assert any(n < len(draft) for draft, _, _, n, _ in steps[:-1])

    committed = list(prompt)
    for draft, q, p, n, nxt in steps:
        length = len(committed)
        assert p.shape[0] == len(draft) + 1
        want_p = fresh_probs(pair.target, sampler, committed + draft, len(draft) + 1)
        assert torch.allclose(p, want_p, atol=1e-5), f"target distributions wrong at the step after {length} tokens"
        if draft:
            assert q.shape[0] == len(draft)
            want_q = fresh_probs(pair.draft, sampler, committed + draft[:-1], len(draft))
            assert torch.allclose(q, want_q, atol=1e-5), f"draft distributions wrong at the step after {length} tokens"
        committed += draft[:n] + [nxt]

    # counters are those of the recorded steps (no EOS, and the last step is sized to the budget: nothing is cut)
    assert gen.tokens == committed[len(prompt):] and len(gen.tokens) == budget
    assert gen.drafted == sum(len(d) for d, *_ in steps) == gen.draft_forwards
    assert gen.accepted == sum(n for *_, n, _ in steps)
    assert gen.accept_lengths == [n + 1 for *_, n, _ in steps]
    assert gen.target_forwards == len(steps)

    # the caches left behind: the target's holds all but the last committed token, the draft's a prefix of them,
    # and continuing from either gives what a fresh forward on the committed sequence gives
    target_lm, draft_lm = (next(lm for lm in lms if lm.model is m) for m in (pair.target, pair.draft))
    assert target_lm.length == len(committed) - 1
    assert len(committed) - 1 - (gamma + 1) <= draft_lm.length <= len(committed) - 1
    for lm, model in ((target_lm, pair.target), (draft_lm, pair.draft)):
        continued = sampler.probs(lm.forward(committed[lm.length:])[-1:])
        assert torch.allclose(continued, fresh_probs(model, sampler, committed, 1), atol=1e-5)


# -- (c) seeds ------------------------------------------------------------------------------------------------------

def outcome(gen):
    return (gen.tokens, gen.accept_lengths, gen.drafted, gen.accepted, gen.target_forwards, gen.draft_forwards,
            gen.forward_sizes, gen.extra)


def test_same_seed_same_output_and_counters_whatever_came_before():
    pair = noisy_pair("llama")
    prompt, other = [10, 20, 30], [200, 201]
    method = SpeculativeDecoding(pair, "speculative", gamma=3, temperature=1.0, top_p=0.95)
    method.reset(5)
    first = outcome(method.generate(prompt, 24, set()))
    assert first[3] < first[2], "a draft token was rejected: the correction path is part of what must repeat"
    method.reset(9)
    method.generate(other, 17, set())  # another prompt and seed in between: no state may leak
    torch.manual_seed(1234)  # nor may the global RNG matter
    method.reset(5)
    assert outcome(method.generate(prompt, 24, set())) == first
    torch.manual_seed(4321)
    fresh = SpeculativeDecoding(pair, "speculative", gamma=3, temperature=1.0, top_p=0.95, seed=5)  # no reset
    assert outcome(fresh.generate(prompt, 24, set())) == first


def test_different_seeds_give_different_outputs():
    pair = noisy_pair("llama")
    method = SpeculativeDecoding(pair, "speculative", gamma=3, temperature=1.0)
    # 16 tokens at T=1 over 259 tokens: a repeat would mean the seed is ignored
    assert len(outputs_by_seed(method, [10, 20, 30], 16)) == 6
