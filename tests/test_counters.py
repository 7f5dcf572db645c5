"""Raw counters match the emitted tokens: ``sum(accept_lengths) == len(tokens)`` for every method, τ and
acceptance are not inflated by a last step that runs past an EOS or the budget, dynHeur's SL schedule is
transformers' own, and tree forwards compute only the logits verification reads."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.backends.torch.cached_lm import CachedLM
from specbench.methods.greedy import Greedy
from specbench.methods.hf_assisted import HFAssisted
from specbench.methods.lookahead import Lookahead
from specbench.methods.ouroboros import Ouroboros
from specbench.methods.prompt_lookup import PromptLookup
from specbench.methods.sam_decoding import SamDecoding
from specbench.methods.sl_policies import ConfidenceSL, HeuristicSL, OracleSL, PerplexitySL
from specbench.methods.specinfer import SpecInfer
from specbench.methods.speculative import SpeculativeDecoding

from .test_context_costs import chain_contexts
from .test_equivalence import cases, greedy_reference, pair_for

METHODS = {
    "speculative": lambda pair, g: SpeculativeDecoding(pair, "speculative", gamma=g),
    "dyn_heur": lambda pair, g: SpeculativeDecoding(pair, "dyn_heur", policy=HeuristicSL(initial=g)),
    "confidence": lambda pair, g: SpeculativeDecoding(pair, "confidence", policy=ConfidenceSL(0.3, sl_max=g)),
    "ppl": lambda pair, g: SpeculativeDecoding(pair, "ppl", policy=PerplexitySL(3.0, sl_max=g)),
    "oracle_sl": lambda pair, g: SpeculativeDecoding(pair, "oracle_sl", policy=OracleSL(g)),
    "hf_assisted": lambda pair, g: HFAssisted(pair, "hf_assisted", gamma=g),
    "lookahead": lambda pair, g: Lookahead(pair, window=3, ngram=g % 4 + 2, guesses=3),
    "ouroboros": lambda pair, g: Ouroboros(pair, gamma=g, window=4, beta=3, top_k=2, pool_from_prompt=True),
    "ouroboros_plain": lambda pair, g: Ouroboros(pair, gamma=g, window=4, beta=3, top_k=2, phrase_draft=False),
    "greedy": lambda pair, g: Greedy(pair, "greedy"),
    "prompt_lookup": lambda pair, g: PromptLookup(pair, max_ngram_size=g % 3 + 1, num_pred_tokens=g),
    "specinfer": lambda pair, g: SpecInfer(pair, widths=[3, 2] + [1] * (g - 1), max_nodes=2 * g + 4),
    "sam_decoding": lambda pair, g: SamDecoding(pair, max_draft=g),
    "sam_speculative": lambda pair, g: SamDecoding(pair, "sam_speculative", max_draft=g, min_match_length=2,
                                                   fallback=SpeculativeDecoding(pair, "speculative", gamma=g)),
}
ONE_FORWARD_PER_STEP = {"speculative", "dyn_heur", "confidence", "ppl", "oracle_sl", "hf_assisted", "lookahead",
                        "ouroboros", "ouroboros_plain", "greedy", "prompt_lookup", "specinfer", "sam_decoding",
                        "sam_speculative"}


def check_counters(gen, name: str, sampled: bool = False) -> None:
    """``sampled``: drawn above T = 0, where no token is claimed to be its row's argmax (no evidence kept)."""
    steps = gen.accept_lengths
    assert sum(steps) == len(gen.tokens), (name, steps, len(gen.tokens))
    assert all(n >= 1 for n in steps)
    assert gen.accepted <= gen.drafted
    # every step adds its accepted drafts, then (unless cut at an EOS / the budget) the target's own token
    assert sum(steps) - len(steps) <= gen.accepted <= sum(steps) - len(steps) + 1
    if name in ONE_FORWARD_PER_STEP:
        assert len(steps) == gen.target_forwards
    if sampled:
        assert gen.evidence == [], name
    elif name != "hf_assisted":  # at T = 0 every kept token carries the row it was taken from, its row's argmax
        assert [e.token for e in gen.evidence] == gen.tokens, name
        assert all(e.margin >= 0 and e.top_ids[0] == e.token or e.margin == 0 for e in gen.evidence), name


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases, name=st.sampled_from(sorted(METHODS)))
def test_counters_match_the_emitted_tokens(case, name):
    pair = pair_for(case["arch"], case["noise"])
    ref, eos = greedy_reference(pair, case["prompt"], case["max_new_tokens"], case["eos_pick"])
    method = METHODS[name](pair, case["gamma"])
    method.reset(0)
    method.prepare(case["prompt"], case["max_new_tokens"], eos)
    gen = method.generate(case["prompt"], case["max_new_tokens"], eos)
    assert gen.tokens == ref.tokens
    check_counters(gen, name)
    if name != "hf_assisted":  # its hooks see sizes only; every other method's forwards say where they ran
        assert gen.forward_contexts["target"] == chain_contexts(len(case["prompt"]), gen.accept_lengths), name


def test_a_lookahead_step_past_the_budget_counts_only_the_kept_token():
    pair = pair_for("llama", 0.0)
    prompt = [5, 6, 7]
    greedy = Greedy(pair, "greedy").generate(prompt, 12, set()).tokens
    method = Lookahead(pair, window=3, ngram=4, guesses=3)
    method.pool.insert([prompt[-1], *greedy[:3]])  # a guess the target accepts in full
    gen = method.generate(prompt, 1, set())
    assert gen.tokens == greedy[:1]
    assert gen.accept_lengths == [1] and gen.accepted == 0  # was [4] and 3: τ 4 on a one-token budget
    assert gen.drafted == 0  # guesses longer than the budget can use are not even verified


def distinct_start(pair, max_new_tokens: int = 12) -> tuple[list[int], list[int]]:
    """(prompt, greedy output) for a prompt whose greedy output starts with three distinct tokens."""
    for start in range(3, 200):
        prompt = [start, start + 1, start + 2]
        greedy = Greedy(pair, "greedy").generate(prompt, max_new_tokens, set()).tokens
        if len(set(greedy[:3])) == 3:
            return prompt, greedy
    raise AssertionError("no prompt in range gives three distinct first tokens")


@pytest.mark.parametrize("name", ["speculative", "ouroboros_plain"])
def test_an_eos_inside_the_draft_ends_the_count(name):
    pair = pair_for("llama", 0.0)  # the draft is the target: every draft token is accepted
    prompt, greedy = distinct_start(pair)
    eos = {greedy[2]}
    gen = METHODS[name](pair, 5).generate(prompt, 12, eos)
    assert gen.tokens == greedy[:3]
    assert gen.accept_lengths == [3] and gen.accepted == 3  # the EOS is an accepted draft; no bonus after it


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases)
def test_dyn_heur_follows_transformers_heuristic_schedule(case):
    """transformers' ``num_assistant_tokens_schedule='heuristic'`` is the reference: replaying the matches it kept
    at each step into our HeuristicSL must give the number of candidates it drafted at the next step (capped by
    the budget, as both cap it). The replay, not a side-by-side run: near-ties can make the two loops accept
    differently (a 2-token verify and a 1-token draft forward round differently), which is not the rule."""
    pair = pair_for(case["arch"], case["noise"])
    ref, eos = greedy_reference(pair, case["prompt"], case["max_new_tokens"], case["eos_pick"])
    fed = []  # the ids of every target call: the candidates are its last ``drafted`` ones
    hook = pair.target.register_forward_pre_hook(
        lambda module, args, kwargs: fed.append(kwargs["input_ids"][0].tolist()), with_kwargs=True)
    try:
        theirs = HFAssisted(pair, "hf_heuristic", gamma=case["gamma"], schedule="heuristic").generate(
            case["prompt"], case["max_new_tokens"], eos)
    finally:
        hook.remove()
    assert theirs.tokens == ref.tokens and theirs.extra["sl"], "per-step counts read off transformers' calls"
    ours, emitted = HeuristicSL(initial=case["gamma"], persistent=False), 0
    for drafted, kept, ids in zip(theirs.extra["sl"], theirs.accept_lengths, fed):
        planned = min(ours.draft_length(), case["max_new_tokens"] - emitted - 1)
        ended_at_eos = drafted > 0 and ids[-1] in eos  # the draft stops at an EOS, in both loops
        assert drafted == planned or (drafted < planned and ended_at_eos), (drafted, planned)
        ours.observe(kept - 1, drafted)  # transformers' num_matches: valid tokens (cut at EOS) minus one
        emitted += kept
    ours_run = SpeculativeDecoding(pair, "dyn_heur", policy=HeuristicSL(initial=case["gamma"], persistent=False))
    assert ours_run.generate(case["prompt"], case["max_new_tokens"], eos).tokens == ref.tokens


def test_heuristic_counts_an_empty_draft_as_fully_accepted():
    policy = HeuristicSL(initial=3)
    policy.observe(0, 0)  # one token of budget left: nothing drafted (transformers: 0 matches == 0 candidates)
    assert policy.draft_length() == 5


@pytest.mark.parametrize("name", ["lookahead", "ouroboros"])
def test_tree_forwards_compute_logits_from_the_root_only(name, monkeypatch):
    """The first step feeds the whole prompt with the tree; only the rows from its last token on are needed."""
    rows = []
    forward = CachedLM.forward

    def recording(self, ids, keep_last=None, parents=None):
        logits = forward(self, ids, keep_last=keep_last, parents=parents)
        if parents is not None:
            rows.append((len(ids), logits.shape[0]))
        return logits

    monkeypatch.setattr(CachedLM, "forward", recording)
    pair = pair_for("llama", 0.05)
    prompt = list(range(10, 50))
    METHODS[name](pair, 4).generate(prompt, 6, set())
    fed, kept = rows[0]
    assert fed > len(prompt) and kept == fed - len(prompt) + 1
