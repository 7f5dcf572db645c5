"""method=swift (SWIFT, self-speculation by layer skipping): the layer-skipped model against reference computations
(the full model when nothing is skipped, a shallow model built by hand otherwise, the full model with zeroed output
projections for skipped sublayers; chunked, cropped and tree feeds), drafting from the target's cache against a
cache built by hand, the confidence-sized tree on scripted logits, output identical to greedy at T = 0 (with the
optimisation changing the set mid-generation), distributed as the target at T > 0, an own cache right after
rejections, warm start of the optimisation, and bad settings. The optimisation itself: test_swift_search.py."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import LlamaForCausalLM
from transformers.cache_utils import DynamicCache

from specbench.run.config_check import ConfigOnlyPair
from specbench.backends.torch.cached_lm import CachedLM
from specbench.decoding.loop import speculative_generate
from specbench.errors import ConfigError
from specbench.methods.base import NoTimeline
from specbench.methods.greedy import Greedy
from specbench.methods.swift import Swift
from specbench.methods.swift_draft import SkipDraftLM, SwiftProposer, tree_width
from specbench.methods.swift_search import SkipSet
from specbench.models.layer_skip import LayerSkipModel
from specbench.models.pair import ModelPair, prepare_for_inference
from specbench.backends.precision import resolve_precision
from specbench.models.tiny import build_tiny_pair, tiny_model

from .distribution_helpers import one_thread  # noqa: F401  (autouse fixture: one torch thread)
from .distribution_helpers import (EOS, MAX_NEW, PROMPT, IdsOnlyTokenizer, exact_sequence_distribution,
                                   goodness_of_fit, sample_generations)
from .test_counters import check_counters
from .test_equivalence import greedy_reference

PAIRS = {}


def deep_pair(layers: int = 4, seed: int = 0) -> ModelPair:
    """A tiny fp32 Llama target with ``layers`` decoder layers (the tests' usual tiny pair has 2), no draft."""
    if (layers, seed) not in PAIRS:
        PAIRS[layers, seed] = build_tiny_pair(name=f"tiny-llama-{layers}", layers=layers, seed=seed, load_draft=False)
    return PAIRS[layers, seed]


def silence(model, layers) -> None:
    """Make decoder layers ``layers`` identities (their attention output and MLP down projections write zeros to
    the residual stream): skipping exactly those leaves the logits unchanged."""
    with torch.no_grad():
        for i in layers:
            model.model.layers[i].self_attn.o_proj.weight.zero_()
            model.model.layers[i].mlp.down_proj.weight.zero_()


def shallow_by_hand(target, keep) -> LlamaForCausalLM:
    """A Llama of len(keep) layers holding copies of the target's kept layers: the reference for LayerSkipModel."""
    config = type(target.config).from_dict(target.config.to_dict())
    config.num_hidden_layers = len(keep)
    config._attn_implementation = target.config._attn_implementation
    model = LlamaForCausalLM(config).eval()
    state = {k: v for k, v in target.state_dict().items() if ".layers." not in k}
    for slot, i in enumerate(keep):
        prefix = f"model.layers.{i}."
        state.update({k.replace(prefix, f"model.layers.{slot}."): v for k, v in target.state_dict().items()
                      if k.startswith(prefix)})
    model.load_state_dict(state)
    return model


IDS = [5, 9, 40, 7, 7, 120, 33, 8, 19, 200, 5, 9]


# -- the layer-skipped model -----------------------------------------------------------------------------------------

def test_with_no_skipped_layer_it_is_the_full_model():
    target = deep_pair(4).target
    full = CachedLM(target).forward(IDS)
    assert torch.equal(CachedLM(LayerSkipModel(target, [])).forward(IDS), full)
    lm = CachedLM(LayerSkipModel(target, []))  # fed in chunks against its own cache
    chunks = torch.cat([lm.forward(IDS[:5]), lm.forward(IDS[5:6]), lm.forward(IDS[6:])])
    torch.testing.assert_close(chunks, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("skip", [[1], [0, 3], [1, 2], [3]])
def test_with_skipped_layers_it_is_a_shallow_model_built_by_hand(skip):
    target = deep_pair(4).target
    keep = [i for i in range(4) if i not in skip]
    want = shallow_by_hand(target, keep)(torch.tensor([IDS])).logits[0]
    lm = CachedLM(LayerSkipModel(target, skip))
    torch.testing.assert_close(lm.forward(IDS), want, atol=1e-5, rtol=1e-5)
    assert len(lm.cache.layers) == len(keep) and lm.length == len(IDS)  # its own cache: one entry per kept layer
    # crop after a rejection, then the next tokens: as if only the committed ones had been fed
    lm.crop(7)
    torch.testing.assert_close(lm.forward(IDS[7:]), want[7:], atol=1e-5, rtol=1e-5)
    # a tree fed after the prefix, then one path kept, equals the chain
    tree = CachedLM(LayerSkipModel(target, skip))
    tree.forward(IDS[:6])
    # nodes: 0 = IDS[6] (from x0), 1 = 99 (a rejected sibling of IDS[7]), 2 = IDS[7] (from 0), 3 = IDS[8] (from 2)
    rows = tree.forward([IDS[6], 99, IDS[7], IDS[8]], parents=[-1, 0, 0, 2])
    torch.testing.assert_close(rows[[0, 2, 3]], want[6:9], atol=1e-5, rtol=1e-5)
    tree.keep_positions(list(range(6)) + [6, 8, 9])
    torch.testing.assert_close(tree.forward(IDS[9:]), want[9:], atol=1e-5, rtol=1e-5)


def without_sublayers(target, attention=(), mlp=()) -> LlamaForCausalLM:
    """A copy of the target whose listed layers' attention (o_proj) or MLP (down_proj) writes zeros to the residual
    stream: the full model computing what skipping those sublayers computes, the reference for PartialLayer."""
    model = shallow_by_hand(target, list(range(target.config.num_hidden_layers)))
    with torch.no_grad():
        for i in attention:
            model.model.layers[i].self_attn.o_proj.weight.zero_()
        for i in mlp:
            model.model.layers[i].mlp.down_proj.weight.zero_()
    return model


@pytest.mark.parametrize("attention, mlp", [([1], []), ([], [2]), ([1, 2], [2, 3]), ([0], [0, 3]), ([3], [1])])
def test_with_skipped_sublayers_it_is_the_model_whose_sublayers_write_nothing(attention, mlp):
    target = deep_pair(4).target
    want = without_sublayers(target, attention, mlp)(torch.tensor([IDS])).logits[0]
    draft = LayerSkipModel(target, skip_attention=attention, skip_mlp=mlp)
    lm = CachedLM(draft)
    got = lm.forward(IDS)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, CachedLM(target).forward(IDS), atol=1e-3)  # something was skipped
    attending = [i for i in range(4) if i not in attention]
    assert len(lm.cache.layers) == len(attending)  # a cache slot for each layer whose attention runs
    assert draft.kept == [i for i in range(4) if not (i in attention and i in mlp)]
    lm.crop(7)  # crop after a rejection, then the next tokens
    torch.testing.assert_close(lm.forward(IDS[7:]), want[7:], atol=1e-5, rtol=1e-5)
    tree = CachedLM(LayerSkipModel(target, skip_attention=attention, skip_mlp=mlp))
    tree.forward(IDS[:6])
    rows = tree.forward([IDS[6], 99, IDS[7], IDS[8]], parents=[-1, 0, 0, 2])
    torch.testing.assert_close(rows[[0, 2, 3]], want[6:9], atol=1e-5, rtol=1e-5)


def test_skipping_both_sublayers_is_skipping_the_layer():
    target = deep_pair(4).target
    whole = CachedLM(LayerSkipModel(target, [1, 2])).forward(IDS)
    halves = LayerSkipModel(target, skip_attention=[1, 2], skip_mlp=[1, 2])
    assert halves.kept == [0, 3] and all(layer is target.model.layers[i] for layer, i in zip(halves.layers, [0, 3]))
    assert torch.equal(CachedLM(halves).forward(IDS), whole)
    mixed = LayerSkipModel(target, [1], skip_attention=[2], skip_mlp=[1])  # layer 1 whole, layer 2's attention
    assert mixed.kept == [0, 2, 3] and mixed.skip_attention == [2] and mixed.skip_mlp == []
    with pytest.raises(ConfigError, match="skips the attention of all 4 decoder layers"):
        LayerSkipModel(target, [0, 1], skip_attention=[2, 3])


def test_the_draft_shares_the_targets_weights_and_leaves_its_cache_alone():
    target = deep_pair(4).target
    draft = LayerSkipModel(target, [1, 2])
    assert draft.layers[1] is target.model.layers[3] and draft.lm_head is target.lm_head  # no copies
    lm, full = CachedLM(target), CachedLM(draft)
    before = lm.forward(IDS[:6])
    full.forward(IDS)
    torch.testing.assert_close(lm.forward(IDS[6:]), CachedLM(target).forward(IDS)[6:], atol=1e-5, rtol=1e-5)
    assert len(lm.cache.layers) == 4 and before.shape[0] == 6


# -- drafting from the target's cache ---------------------------------------------------------------------------------

def hand_built_prefix(target, ids, attending):
    """A DynamicCache holding the full target's keys and values of ``ids`` for the layers ``attending``, one slot
    each, put there with the cache's own ``update`` (not the views SkipDraftLM uses): the reference for drafting
    from the target's cache."""
    full = CachedLM(target)
    full.forward(ids)
    cache = DynamicCache()
    for slot, i in enumerate(attending):
        cache.update(full.cache.layers[i].keys.clone(), full.cache.layers[i].values.clone(), slot)
    return cache


@pytest.mark.parametrize("skip", [SkipSet((1,)), SkipSet((), (1, 2), (2,)), SkipSet((2,), (), (1,))])
def test_the_draft_reads_the_targets_cache_and_gives_it_back_unchanged(skip):
    target = deep_pair(4).target
    lm = CachedLM(target)
    lm.forward(IDS[:8])  # the committed tokens but x0 = IDS[8]
    before = [(layer.keys.clone(), layer.values.clone()) for layer in lm.cache.layers]
    draft = SkipDraftLM(lm, skip, shared=True)
    draft.begin()
    assert draft.length == 8
    got = torch.cat([draft.forward(IDS[8:9]), draft.forward(IDS[9:11])])  # x0, then two drafted tokens
    assert lm.cache.layers[draft.model.attending[0]].keys.shape[-2] == 11  # they went into the target's cache
    draft.end(8)
    assert lm.length == 8 and draft.cache is None
    for (keys, values), layer in zip(before, lm.cache.layers):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
    model = skip.model(target)
    want = model(torch.tensor([IDS[8:11]]), cache=hand_built_prefix(target, IDS[:8], model.attending)).logits[0]
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=1e-5)
    own = CachedLM(skip.model(target)).forward(IDS[:11])[8:]  # its own cache: its own keys for the prompt
    assert not torch.allclose(got, own, atol=1e-3)
    # the optimisation's scoring forward: after the first 5 positions, the target's cache untouched
    scored = draft.teacher_forced(skip, IDS[5:9], 5)
    want = model(torch.tensor([IDS[5:9]]), cache=hand_built_prefix(target, IDS[:5], model.attending)).logits[0]
    torch.testing.assert_close(scored, want.float(), atol=1e-5, rtol=1e-5)
    assert lm.length == 8 and draft.sizes[-1] == 4 and draft.contexts[-1] == 5


def test_with_silenced_sublayers_the_shared_draft_is_the_target():
    """Skipping sublayers that write nothing leaves every hidden state as the target's, so a draft that reads the
    target's cache predicts exactly the target's tokens: every drafted chain token is accepted."""
    pair = build_tiny_pair(name="tiny-llama-6", layers=6, seed=3, load_draft=False)
    with torch.no_grad():
        for i in (1, 2):
            pair.target.model.layers[i].self_attn.o_proj.weight.zero_()
        for i in (3, 4):
            pair.target.model.layers[i].mlp.down_proj.weight.zero_()
    method = Swift(pair, gamma=3, stop_confidence=None, skip_attention=[1, 2], skip_mlp=[3, 4])
    gen = method.generate(IDS, 20, set())
    assert gen.accept_lengths == [1] + [4] * 4 + [3]  # the prefill, then γ + 1 a step, the last cut by the budget
    assert gen.extra["sl"] == [0, 3, 3, 3, 3, 2] and gen.extra["skip_source"] == "config"


def test_the_tree_is_the_top_k_at_each_depth_of_the_chain_sized_by_confidence():
    assert [tree_width(p, True) for p in (0.99, 0.95, 0.9, 0.8, 0.6, 0.5, 0.1)] == [3, 5, 5, 8, 8, 10, 10]
    assert [tree_width(p, False) for p in (0.99, 0.9, 0.6, 0.1)] == [1, 3, 5, 10]
    proposer = SwiftProposer(None, 0, 4, 0.8, True)
    proposal = proposer.proposal([([7, 3, 9], None), ([4, 5], None), ([6], None)])
    assert proposal.tokens == [7, 3, 9, 4, 5, 6] and proposal.parents == [-1, -1, -1, 0, 0, 3]
    assert proposer.chain_nodes == [0, 3, 5] and proposal.depth == 3 and proposal.probs is None


class ScriptedDraft:
    """A draft whose logits at each depth are given (one row per forward): what the proposer drafts from them."""

    def __init__(self, rows):
        self.rows, self.shared, self.length, self.fed = list(rows), False, 0, []

    def begin(self):
        pass

    def end(self, committed):
        pass

    def forward(self, ids, keep_last=None):
        self.fed.append(list(ids))
        self.length += len(ids)
        return self.rows.pop(0)[None]


def logits_with(probabilities) -> torch.Tensor:
    """(V,) logits whose softmax is ``probabilities`` (ids 0..)."""
    return torch.log(torch.tensor(probabilities, dtype=torch.float32))


def test_drafting_stops_after_the_first_unsure_token_and_sizes_each_depth():
    from specbench.decoding.proposal import StepContext
    from specbench.decoding.sampling import Sampler

    vocab = 16
    def peaked(token, p):  # token gets p, the rest share 1 - p in decreasing order after it
        rest = [(1 - p) * (0.5 ** (i + 1)) for i in range(vocab - 1)]
        rest[-1] += (1 - p) - sum(rest)
        probs = rest[:token] + [p] + rest[token:]
        return logits_with(probs)

    rows = [peaked(2, 0.97), peaked(5, 0.9), peaked(1, 0.6), peaked(4, 0.99)]
    draft = ScriptedDraft(rows)
    proposer = SwiftProposer(draft, 3, 25, 0.8, True)
    context = StepContext([9, 9, 9, 9], 1, 10, set(), Sampler())
    proposal = proposer.propose(context)
    assert draft.fed == [[9, 9, 9, 9], [2], [5]]  # the third token (0.6) is drafted, then it stops
    assert [proposal.parents.count(p) for p in (-1, 0, 3)] == [3, 5, 8]
    assert proposal.tokens[:3][0] == 2 and proposal.tokens[3] == 5 and proposal.tokens[8] == 1
    assert proposal.depth == 3
    chain = SwiftProposer(ScriptedDraft(rows), 3, 2, None, False).propose(context)  # γ 2, no stop, no tree
    assert chain.tokens == [2, 5] and chain.is_chain
    eos = StepContext([9, 9, 9, 9], 1, 10, {5}, Sampler())  # nothing is drafted after an EOS
    draft = ScriptedDraft(rows)
    assert SwiftProposer(draft, 3, 25, None, False).propose(eos).tokens == [2, 5] and len(draft.fed) == 2


# -- exactness ------------------------------------------------------------------------------------------------------

cases = st.fixed_dictionaries({
    "layers": st.sampled_from([3, 4]),
    "skip": st.one_of(st.none(), st.sets(st.integers(0, 3), min_size=1, max_size=2)),
    "skip_attention": st.sets(st.integers(0, 3), max_size=2),
    "skip_mlp": st.sets(st.integers(0, 3), max_size=3),
    "prompt": st.lists(st.integers(3, 258), min_size=1, max_size=12),
    "gamma": st.integers(1, 6),
    "stop_confidence": st.one_of(st.none(), st.sampled_from([0.05, 0.2, 0.8])),
    "tree": st.booleans(),
    "fixed": st.booleans(),  # a configured skip set (the ones above), or none: the optimisation
    "draft_cache": st.sampled_from(["target", "own"]),
    "context_window": st.integers(1, 4),
    "bayes_interval": st.sampled_from([0, 2]),
    "opt_interval": st.integers(1, 3),
    "search_space": st.sampled_from(["sublayers", "layers"]),
    "max_new_tokens": st.integers(1, 40),
    "eos_pick": st.one_of(st.none(), st.integers(0, 39)),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases)
def test_swift_equals_greedy(case):
    """Every setting, a fixed skip set or the optimisation changing it mid-generation: greedy's tokens."""
    pair = deep_pair(case["layers"])
    skip = sorted(i for i in case["skip"] or () if i < case["layers"]) or None
    attention = sorted(i for i in case["skip_attention"] if i < case["layers"] and i not in (skip or ()))
    attention = attention[:case["layers"] - len(skip or ()) - 1]  # an attention sublayer always runs
    mlp = sorted(i for i in case["skip_mlp"] if i < case["layers"])
    if not case["fixed"]:  # the optimisation's case: no set configured
        skip, attention, mlp = None, [], []
    configured = bool(skip or attention or mlp)
    draft_cache = case["draft_cache"] if configured else "target"  # own: a fixed set only
    ref, eos = greedy_reference(pair, case["prompt"], case["max_new_tokens"], case["eos_pick"])
    method = Swift(pair, gamma=case["gamma"], skip_layers=skip, skip_attention=attention or None,
                   skip_mlp=mlp or None, stop_confidence=case["stop_confidence"], tree=case["tree"],
                   draft_cache=draft_cache, context_window=case["context_window"],
                   bayes_interval=case["bayes_interval"], opt_interval=case["opt_interval"],
                   search_space=case["search_space"] if case["layers"] > 3 else "sublayers")
    gen = method.generate(case["prompt"], case["max_new_tokens"], eos)
    assert gen.tokens == ref.tokens
    check_counters(gen, "swift")
    assert gen.target_forwards == len(gen.accept_lengths) == len(gen.extra["sl"]) == len(gen.extra["nodes"])
    assert all(n <= case["gamma"] + 1 for n in gen.accept_lengths)
    assert all(d <= case["gamma"] for d in gen.extra["sl"])
    assert gen.extra["skip_source"] == ("config" if configured else "initial")
    if draft_cache == "target":  # the prefill drafts nothing
        assert gen.extra["sl"][0] == 0 and gen.accept_lengths[0] == 1
    if configured:  # the configured set, normalised (both halves of a layer: a whole layer)
        want = {"skip_layers": sorted(set(skip or ()) | (set(attention) & set(mlp))),
                "skip_attention": sorted(set(attention) - set(mlp) - set(skip or ())),
                "skip_mlp": sorted(set(mlp) - set(attention) - set(skip or ()))}
        assert {k: gen.extra.get(k, []) for k in want} == want
    else:  # the optimisation ran after every opt_interval-th verification once more than W + 1 tokens were committed
        steps = gen.extra.get("optimisation", {}).get("step", [])
        assert len(steps) == gen.extra["optimisation_state"]["iterations"]
        accepted, window = gen.accept_lengths, case["context_window"]
        # verification j (after the prefill, step 0) leaves sum(accepted[:j + 1]) tokens, the last one x0 of the
        # next step; the last step's count may be cut by the budget or an EOS, so it is left out of the comparison
        due = [j - 1 for j in range(1, len(accepted) - 1)
               if sum(accepted[:j + 1]) - 1 > window + 1 and (j - 1) % case["opt_interval"] == 0]
        ran = [s for s in steps if s < len(accepted) - 2]
        assert ran == due[:len(ran)] and (gen.extra["optimisation_state"]["stopped"] or len(ran) == len(due))
        forwards = [(n, c) for n, c in zip(gen.forward_sizes["draft"], gen.forward_contexts["draft"])
                    if n == case["context_window"] + 1 and c == len(case["prompt"])]
        assert len(forwards) >= len(steps)  # each scored by one forward after the prompt


def small_vocab_target(layers: int = 3, seed: int = 0) -> ModelPair:
    """distribution_helpers' 6-token vocabulary, with ``layers`` decoder layers and no draft model."""
    tok = IdsOnlyTokenizer(6, EOS)
    precision = resolve_precision("float32", "cpu", "auto")
    target = prepare_for_inference(tiny_model("llama", 6, 16, layers, seed, 0.3, tok), "cpu", precision)
    return ModelPair(name="tiny-v6-deep", target=target, draft=None, tokenizer=tok, eos_ids={EOS},
                     precision=precision)


@pytest.mark.parametrize("draft_cache", ["target", "own"])
def test_sampling_is_distributed_as_the_target(draft_cache):
    """3000 generations of at most 3 tokens against the target's exact distribution over all of them, drafted by the
    target less its layer 1 (a tree of siblings drawn without replacement; a chain is the tree of one sibling a
    depth): from the target's cache, whose prefill drafts nothing, so its trees are one deep; from its own, trees
    two deep, siblings under a sampled chain token. Power: the same samples are far from the draft's."""
    pair = small_vocab_target()
    target = exact_sequence_distribution(pair.target, 1.0, 1.0, PROMPT, MAX_NEW, {EOS})
    draft = exact_sequence_distribution(LayerSkipModel(pair.target, [1]), 1.0, 1.0, PROMPT, MAX_NEW, {EOS})
    method = Swift(pair, gamma=2, skip_layers=[1], stop_confidence=None, draft_cache=draft_cache, temperature=1.0)
    counts, gens = sample_generations(method, PROMPT, MAX_NEW, {EOS}, 3000)
    drafted, accepted = sum(g.drafted for g in gens), sum(g.accepted for g in gens)
    assert 0.1 * drafted < accepted < 0.95 * drafted  # rejections happen, and so do acceptances
    assert goodness_of_fit(counts, target) > 1e-3
    assert goodness_of_fit(counts, draft) < 1e-6
    method.reset(5)
    assert method.generate(PROMPT, MAX_NEW, {EOS}).tokens == list(gens[5].tokens)  # seeded: reproducible


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_own_cache_holds_the_committed_tokens_after_rejections(temperature):
    pair = deep_pair(4)
    method = Swift(pair, gamma=4, skip_layers=[1, 2], draft_cache="own", temperature=temperature, seed=1)
    target = pair.lm("target")
    proposer = SwiftProposer(SkipDraftLM(target, SkipSet((1, 2)), False), len(IDS), 4, 0.8, True)
    gen = speculative_generate(target, proposer, IDS, 30, set(), method.sampler, NoTimeline())
    assert gen.accepted < gen.drafted  # rejections happened
    tokens = IDS + gen.tokens
    draft = proposer.draft
    assert draft.length <= len(tokens) - 1
    rest = draft.forward(tokens[draft.length:])  # whatever it has not read yet
    fresh = CachedLM(LayerSkipModel(pair.target, [1, 2])).forward(tokens)
    torch.testing.assert_close(rest, fresh[-rest.shape[0]:], atol=1e-5, rtol=1e-5)


# -- warm start -----------------------------------------------------------------------------------------------------

def test_the_optimisation_carries_to_the_next_prompt_and_a_configured_set_carries_nothing():
    pair = deep_pair(4)
    method = Swift(pair, gamma=2, context_window=2, bayes_interval=2)
    assert method.carries_state and method.carried_state() is None
    first = method.generate(IDS, 12, set())
    assert first.extra["skip_source"] == "initial" and first.extra["skip_layers"] == [1]  # SWIFT's start: layer 1
    state = method.carried_state()
    done = first.extra["optimisation_state"]["iterations"]
    assert done == len(first.extra["optimisation"]["step"]) > 0 and state["iterations"] == done
    method.carried_state()["points"].append([9.0])  # a copy
    assert len(method.carried_state()["points"]) == done == len(state["points"])
    second = method.generate(IDS[:4], 12, set())
    assert second.extra["skip_source"] == "optimised" and second.extra["optimisation_state"]["iterations"] > done
    method.restore_state(state)  # the state before the second prompt: the same candidates again
    again = method.generate(IDS[:4], 12, set())
    assert again.extra["optimisation"] == second.extra["optimisation"] and again.tokens == second.tokens
    method.restore_state(None)  # a new method's start
    assert method.generate(IDS, 12, set()).extra == first.extra
    assert not Swift(pair, skip_layers=[1]).carries_state
    assert not Swift(pair, skip_mlp=[1], draft_cache="own").carries_state


# -- bad settings -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("settings_, message", [
    ({"gamma": 0}, "method.gamma: must be a positive integer"),
    ({"stop_confidence": 1.5}, "method.stop_confidence: must be a probability in [0, 1] or null, got 1.5"),
    ({"tree": "yes"}, "method.tree: must be true (SWIFT's top-k tree) or false, got 'yes'"),
    ({"draft_cache": "shared"}, "method.draft_cache: must be one of ['target', 'own'], got 'shared'"),
    ({"draft_cache": "own"}, "method.draft_cache: own needs a fixed skip set"),
    ({"skip_layers": [4]}, "method.skip_layers: the target has 4 decoder layers (0..3); no layer [4]"),
    ({"skip_layers": [-1, 1]}, "method.skip_layers: the target has 4 decoder layers (0..3); no layer [-1]"),
    ({"skip_layers": [0, 1, 2, 3]}, "method.skip_layers: skips all 4 decoder layers; at least one must run"),
    ({"skip_layers": []}, "method.skip_layers: is empty"),
    ({"skip_layers": [1, 1]}, "method.skip_layers: names a layer twice"),
    ({"skip_layers": ["a"]}, "method.skip_layers: must be a list of layer indices"),
    ({"skip_attention": [4]}, "method.skip_attention: the target has 4 decoder layers (0..3); no layer [4]"),
    ({"skip_mlp": [1, 1]}, "method.skip_mlp: names a layer twice"),
    ({"skip_mlp": [True]}, "method.skip_mlp: must be a list of layer indices"),
    ({"skip_attention": [0, 1, 2, 3]}, "method.skip_attention: skips the attention of all 4 decoder layers"),
    ({"skip_layers": [0], "skip_attention": [1, 2, 3]},
     "method.skip_attention: with method.skip_layers it skips the attention of all 4 decoder layers"),
    ({"skip_ratio": 1.0}, "method.skip_ratio: must be in (0, 1)"),
    ({"search_space": "heads"}, "method.search_space: must be one of ['sublayers', 'layers'], got 'heads'"),
    ({"search_space": "layers", "layers": 3}, "method.search_space: layers on a target of 3 decoder layers leaves 1 "
                                              "unit to choose from"),
    ({"context_window": 0}, "method.context_window: must be a positive integer"),
    ({"opt_interval": 0}, "method.opt_interval: must be a positive integer"),
    ({"bayes_interval": -1}, "method.bayes_interval: must be an integer >= 0"),
    ({"max_opt_iter": 0}, "method.max_opt_iter: must be a positive integer"),
    ({"max_tolerance_iter": 1.5}, "method.max_tolerance_iter: must be a positive integer"),
    ({"max_score": None}, "method.max_score: must be a matchness in [0, 1], got null"),
    ({"max_score": 2}, "method.max_score: must be a probability in [0, 1] or null, got 2"),
])
def test_swift_rejects_bad_settings(settings_, message):
    settings_ = dict(settings_)
    pair = deep_pair(settings_.pop("layers", 4))
    with pytest.raises(ConfigError) as caught:
        Swift(pair, **settings_)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_skip_set_past_a_tiny_pairs_layers_is_refused_before_loading():
    stand_in = ConfigOnlyPair({"_target_": "specbench.models.tiny.build_tiny_pair", "name": "tiny-llama",
                               "layers": 2, "backend": "transformers"})
    with pytest.raises(ConfigError, match=r"method.skip_layers: the target has 2 decoder layers \(0..1\); no layer"):
        Swift(stand_in, skip_layers=[2])
    with pytest.raises(ConfigError, match=r"method.skip_mlp: the target has 2 decoder layers \(0..1\); no layer"):
        Swift(stand_in, skip_mlp=[2])
    static = ConfigOnlyPair({"_target_": "specbench.models.tiny.build_tiny_pair", "name": "tiny-llama",
                             "layers": 2, "backend": "transformers", "execution": "static"})
    with pytest.raises(ConfigError, match=r"method.draft_cache: target reads the target's dynamic KV cache; "
                                          r"model.execution=static"):
        Swift(static)


def test_targets_it_cannot_run_are_refused():
    with pytest.raises(ConfigError, match="knows the Llama/Qwen2 layout"):
        Swift(build_tiny_pair(name="tiny-gpt2", arch="gpt2", layers=2, load_draft=False))
    with pytest.raises(ConfigError, match="1 decoder layer; skipping needs 2 or more"):
        Swift(deep_pair(1))

    class LlamaCppStandIn:
        name, draft, backend = "embedded", None, "llamacpp"

    with pytest.raises(ConfigError, match=r"method=swift: does not run on model.backend=llamacpp .*"
                                          r"set model.backend=transformers"):
        Swift(LlamaCppStandIn())


def test_greedy_reference_sanity():
    """The deep tiny pair's greedy output is what the property test compares with (a fixed case)."""
    pair = deep_pair(4)
    ref = Greedy(pair, "greedy").generate(IDS, 10, set())
    assert Swift(pair, skip_layers=[2], gamma=3).generate(IDS, 10, set()).tokens == ref.tokens


def test_the_bound_prices_the_draft_forwards_with_the_layer_skipped_target(monkeypatch):
    """The pair has no draft model: the run's bound (costs.run_bound) must price swift's draft forwards with the
    model that ran them, or they would cost nothing and the bound would be too high."""
    from specbench.analysis import costs
    from specbench.records.schema import RunRecord

    pair = deep_pair(4)
    method = Swift(pair, skip_layers=[1, 2])
    measured = []

    def fake_costs(model, prompt, sizes, repeats=3):
        measured.append(model)
        return costs.ForwardCosts({k: 10.0 + k for k in sizes}, 0.0)

    monkeypatch.setattr(costs, "measure_forward_costs", fake_costs)
    run = [RunRecord(prompt_id="p", repeat=0, forward_sizes={"target": [5, 3], "draft": [5, 1, 1]})]
    base = [RunRecord(prompt_id="p", repeat=0, forward_sizes={"target": [5, 1, 1, 1]})]
    priced = costs.run_bound(pair, run, base, IDS, draft=method.self_draft())
    assert isinstance(measured[1], LayerSkipModel) and measured[1].kept == [0, 3]
    assert priced["draft_ms"] is not None
    free = costs.run_bound(pair, run, base, IDS)  # what the bound was without it: the draft's forwards free
    assert free["draft_ms"] is None and priced["bound"] < free["bound"]
    assert Swift(pair).self_draft().kept == [0, 2, 3]  # before any optimisation: SWIFT's start
