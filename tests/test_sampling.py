"""Sampling: nucleus processing on hand-built logits, and a statistical test that speculative
sampling (rejection sampling) reproduces the target distribution exactly."""
import math

import pytest
import torch
from scipy.stats import chisquare

from specbench.decoding.sampling import Sampler
from specbench.decoding.proposal import Proposal
from specbench.decoding.verify import verify_tree_sampling


def verify_rejection(draft, draft_probs, target_probs, sampler):
    """Speculative sampling of a chain: (draft tokens accepted, the target's next token)."""
    path, nxt = verify_tree_sampling(Proposal.chain(draft, draft_probs), target_probs, sampler)
    return len(path), nxt


def test_top_p_keeps_smallest_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    out = Sampler(temperature=1.0, top_p=0.8).probs(logits)
    assert torch.allclose(out, torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-6)
    out = Sampler(temperature=1.0, top_p=0.81).probs(logits)
    assert torch.allclose(out, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95, atol=1e-6)


def test_temperature_sharpens():
    logits = torch.tensor([[1.0, 0.0]])
    p1 = Sampler(temperature=1.0).probs(logits)[0, 0]
    p05 = Sampler(temperature=0.5).probs(logits)[0, 0]
    assert p05 > p1
    assert math.isclose(float(p1), 1 / (1 + math.exp(-1)), rel_tol=1e-6)


def test_bad_sampling_settings_rejected():
    with pytest.raises(ValueError, match="temperature"):
        Sampler(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        Sampler(temperature=1, top_p=0)


@pytest.mark.parametrize("gamma", [1, 3])
def test_rejection_sampling_preserves_target_distribution(gamma):
    """With position-independent p and q, every emitted token must be ~ p, whatever the draft does."""
    vocab = 6
    p = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.07, 0.03])
    q = torch.tensor([0.05, 0.10, 0.40, 0.05, 0.30, 0.10])  # a poor draft: mass in the wrong places
    sampler = Sampler(temperature=1.0, seed=1234)
    draft_probs = q.expand(gamma, vocab)
    target_probs = p.expand(gamma + 1, vocab)
    first_counts = torch.zeros(vocab)
    second_counts = torch.zeros(vocab)
    trials = 20000
    for _ in range(trials):
        draft = [sampler.sample(q) for _ in range(gamma)]
        n, nxt = verify_rejection(draft, draft_probs, target_probs, sampler)
        emitted = draft[:n] + [nxt]
        first_counts[emitted[0]] += 1
        if len(emitted) > 1:
            second_counts[emitted[1]] += 1
    assert chisquare(first_counts.numpy(), (p * trials).numpy()).pvalue > 1e-3
    if gamma > 1:
        total = second_counts.sum()
        assert chisquare(second_counts.numpy(), (p * total).numpy()).pvalue > 1e-3
    # the test has power: the draft distribution itself is rejected
    assert chisquare(first_counts.numpy(), (q * trials).numpy()).pvalue < 1e-6


def test_rejection_sampling_accepts_everything_when_draft_equals_target():
    p = torch.tensor([0.5, 0.25, 0.25])
    sampler = Sampler(temperature=1.0, seed=0)
    for _ in range(200):
        draft = [sampler.sample(p) for _ in range(3)]
        n, _ = verify_rejection(draft, p.expand(3, 3), p.expand(4, 3), sampler)
        assert n == 3
