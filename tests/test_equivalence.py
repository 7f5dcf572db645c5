"""Property tests: at temperature 0 every method emits exactly greedy's tokens (tiny fp32 models).

Random prompts, γ and budgets; EOS ids are picked from tokens greedy actually emits, so EOS lands
inside drafts, and budgets small enough to end in the middle of a draft.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.methods.greedy import Greedy
from specbench.methods.hf_assisted import HFAssisted
from specbench.methods.speculative import SpeculativeDecoding
from specbench.models.tiny import build_tiny_pair

from .conftest import TEST_DEVICE

PAIRS = {}
DEVICE = TEST_DEVICE  # SPECBENCH_TEST_DEVICE, e.g. cuda, to check the GPU code path


def pair_for(arch: str, noise: float):
    key = (arch, noise)
    if key not in PAIRS:
        PAIRS[key] = build_tiny_pair(name=f"tiny-{arch}", arch=arch, draft_noise=noise, device=DEVICE)
    return PAIRS[key]


cases = st.fixed_dictionaries({
    "arch": st.sampled_from(["llama", "gpt2"]),
    "noise": st.sampled_from([0.0, 0.02, 0.05, 0.2]),  # 0: the draft always agrees; 0.2: it rarely does
    "prompt": st.lists(st.integers(3, 258), min_size=1, max_size=12),
    "gamma": st.integers(1, 7),
    "max_new_tokens": st.integers(1, 40),
    "eos_pick": st.one_of(st.none(), st.integers(0, 39)),
})

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def greedy_reference(pair, prompt, max_new_tokens, eos_pick):
    """Greedy output and the EOS set for this case (an EOS taken from greedy's own output)."""
    free = Greedy(pair, "greedy").generate(prompt, max_new_tokens, set()).tokens
    eos = {free[eos_pick % len(free)]} if eos_pick is not None else set()
    return Greedy(pair, "greedy").generate(prompt, max_new_tokens, eos), eos


def generate_and_compare(method_class, name, case):
    """Run one method on a case and assert its tokens equal greedy's; returns the Generation."""
    pair = pair_for(case["arch"], case["noise"])
    ref, eos = greedy_reference(pair, case["prompt"], case["max_new_tokens"], case["eos_pick"])
    gen = method_class(pair, name, gamma=case["gamma"]).generate(case["prompt"], case["max_new_tokens"], eos)
    assert gen.tokens == ref.tokens
    return gen


@SETTINGS
@given(case=cases)
def test_speculative_equals_greedy(case):
    gen = generate_and_compare(SpeculativeDecoding, "speculative", case)
    # raw counters are consistent with the tokens
    assert gen.accepted <= gen.drafted
    assert gen.target_forwards == len(gen.accept_lengths)
    assert sum(gen.accept_lengths) == len(gen.tokens)  # a last step cut at EOS/budget counts what it kept
    assert all(1 <= n <= case["gamma"] + 1 for n in gen.accept_lengths)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases)
def test_hf_assisted_equals_greedy(case):
    generate_and_compare(HFAssisted, "hf_assisted", case)


def test_full_acceptance_emits_gamma_plus_one_per_step():
    pair = pair_for("llama", 0.0)
    gen = SpeculativeDecoding(pair, "speculative", gamma=4).generate([5, 6, 7], 30, set())
    assert len(gen.tokens) == 30
    assert gen.accept_lengths == [5] * 6  # 6 steps x (4 accepted + bonus); the first also reads the prompt
    assert gen.accepted == gen.drafted == 24 and gen.target_forwards == 6 and gen.draft_forwards == 24


def test_budget_of_one_token_needs_no_draft():
    pair = pair_for("gpt2", 0.05)
    gen = SpeculativeDecoding(pair, "speculative", gamma=5).generate([5, 6, 7], 1, set())
    assert len(gen.tokens) == 1 and gen.drafted == 0 and gen.target_forwards == 1


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_greedy_counts_one_forward_per_token(arch):
    pair = pair_for(arch, 0.05)
    gen = Greedy(pair, "greedy").generate([9, 10, 11], 17, set())
    assert len(gen.tokens) == 17 and gen.target_forwards == 17 and gen.accept_lengths == [1] * 17
