"""Medusa / Hydra heads: the candidate tree on hand-built heads, greedy-exactness and exact sampling on the shared
loop with random (untrained) heads, artifacts (ours, Medusa's published format, the hub id offline) and the errors
around them. Training them on the heads pipeline: tests/test_head_training.py."""
from __future__ import annotations

import json
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.decoding.proposal import StepContext
from specbench.decoding.sampling import Sampler
from specbench.errors import ConfigError
from specbench.methods.feature_head import FeatureHeadMethod
from specbench.methods.greedy import Greedy
from specbench.methods.medusa import MedusaMethod, MedusaTree
from specbench.models.heads.draft_head import DraftHead, HeadConfig
from specbench.models.heads.artifact import save_head
from specbench.models.heads.medusa import (MedusaConfig, MedusaHeads, load_medusa, published_hydra, published_medusa,
                                           save_medusa)
from specbench.models.tiny import build_tiny_pair

from .conftest import TEST_DEVICE
from .test_feature_heads import tiny_pair
from .distribution_helpers import (EOS, MAX_NEW, exact_sequence_distribution, goodness_of_fit, sample_generations,
                                   small_vocab_pair)



def random_heads(pair, kind: str, directory, heads: int = 4, seed: int = 1, std: float = 0.1, **options) -> str:
    config = MedusaConfig.for_target(pair.target.config, kind, heads=heads, **options)
    save_medusa(directory, MedusaHeads(config).init_weights(seed=seed, std=std), {"test": True})
    return str(directory)


# -- the tree, on hand-built heads (no model) ---------------------------------------------------------------------

class FakeParts:
    """A target's embeddings (one-hot rows) and no lm_head of its own: the heads carry theirs (own_lm_head)."""

    def __init__(self, vocab: int, hidden: int):
        self.embed_weight = torch.eye(vocab, hidden)

    def embed(self, ids):
        return self.embed_weight[ids]

    def logits(self, u):
        raise AssertionError("heads with their own lm_head never read the target's")


def hand_heads(kind: str, lm_rows: list[list[float]], hydra_shift: float = 0.0) -> MedusaHeads:
    """Heads whose residual blocks are the identity (zero weights and biases) and whose lm_head k gives logits
    lm_rows[k-1] from the feature h = e_0: head k's log-probabilities are log_softmax(lm_rows[k-1]). Hydra: head k
    also adds hydra_shift · (the one-hot of its path's last token) to u, so its children depend on the path."""
    vocab, hidden = len(lm_rows[0]), len(lm_rows[0])
    heads = MedusaHeads(MedusaConfig(kind, hidden, vocab, heads=len(lm_rows), layers=1, own_lm_head=True))
    with torch.no_grad():
        for p in heads.parameters():
            p.zero_()
        for k, row in enumerate(lm_rows):
            heads.lm_heads[k].weight.copy_(torch.eye(vocab) * 0)
            heads.lm_heads[k].weight[:, 0] = torch.tensor(row)  # logits = row · h[0]
            heads.lm_heads[k].weight[:, 1:] = torch.eye(vocab)[:, 1:]  # + u[j] for j >= 1
            if kind == "hydra":  # u = h + shift · e(last path token)
                heads.grounded[k].res_connection.weight[:, :hidden] = torch.eye(hidden)
                heads.grounded[k].res_connection.weight[:, (k + 1) * hidden:] = hydra_shift * torch.eye(hidden)
    return heads


def propose(tree: MedusaTree, tokens, room=30, eos=()):
    tree.feature = torch.eye(tree.heads.cfg.hidden_size)[0]
    return tree.propose(StepContext(list(tokens), 0, room, set(eos), Sampler()))


def paths(proposal) -> set[tuple[int, ...]]:
    out = set()
    for node in range(len(proposal.tokens)):
        path = []
        while node >= 0:
            path.append(proposal.tokens[node])
            node = proposal.parents[node]
        out.add(tuple(path[::-1]))
    return out


def test_medusa_tree_is_the_product_tree_cut_by_the_product_of_head_probabilities():
    # head 1: tokens 1, 2 (then the rest); head 2: tokens 3, 4
    heads = hand_heads("medusa", [[0, 3.0, 2.0, 0, 0, 0], [0, 0, 0, 3.0, 2.5, 0]])
    fresh = MedusaTree(heads, FakeParts(6, 6), top_k=2, depth=2, max_nodes=6)
    assert fresh.propose(StepContext([5], 0, 30, set(), Sampler())).tokens == []  # no feature yet: the prefill
    full = propose(MedusaTree(heads, FakeParts(6, 6), top_k=2, depth=2, max_nodes=6), [5])
    assert paths(full) == {(1,), (2,), (1, 3), (1, 4), (2, 3), (2, 4)}
    # cut to 4 by cumulative log-probability: (1), (2), (1, 3) then (1, 4) vs (2, 3): p1(1)p2(4) vs p1(2)p2(3)
    p1 = torch.log_softmax(torch.tensor([0, 3.0, 2.0, 0, 0, 0]), 0)
    p2 = torch.log_softmax(torch.tensor([0, 0, 0, 3.0, 2.5, 0]), 0)
    fourth = (1, 4) if p1[1] + p2[4] > p1[2] + p2[3] else (2, 3)
    cut = propose(MedusaTree(heads, FakeParts(6, 6), top_k=2, depth=2, max_nodes=4), [5])
    assert paths(cut) == {(1,), (2,), (1, 3), fourth} and cut.tokens == [1, 3, 2, 4]  # best first, ancestors first
    assert propose(MedusaTree(heads, FakeParts(6, 6), top_k=2, depth=2, max_nodes=6), [5], room=1).depth == 1
    no_eos = propose(MedusaTree(heads, FakeParts(6, 6), top_k=2, depth=2, max_nodes=6), [5], eos={1})
    assert paths(no_eos) == {(1,), (2,), (2, 3), (2, 4)}  # an EOS node is never expanded


def test_hydra_children_come_from_each_nodes_own_path():
    # head k reads its path's last token (x0 for head 1) and adds 5 to that token's logit
    heads = hand_heads("hydra", [[0, 3.0, 2.0, 0, 0, 0], [0, 0, 0, 1.0, 0.5, 0]], hydra_shift=5.0)
    tree = MedusaTree(heads, FakeParts(6, 6), top_k=2, depth=2, max_nodes=10)
    proposal = propose(tree, [5])
    # x0 = 5: head 1 reads e(5), shifting logit 5 up by 5: its top-2 are 5 and 1
    assert [proposal.tokens[c] for c in proposal.children()[-1]] == [5, 1]
    kids = {proposal.tokens[n]: sorted(proposal.tokens[c] for c in proposal.children().get(n, []))
            for n in proposal.children()[-1]}
    assert kids == {5: [3, 5], 1: [1, 3]}  # each node's own last token is pushed up among its children
    assert tree.head_forwards == 2  # one batched forward per depth


def test_a_static_tree_takes_each_heads_ranks_at_its_depth():
    """Medusa's sparse tree (method.tree): the node at rank path p + [r] is head len(p)+1's r-th token, whatever
    the parent (Medusa's heads read h_t alone); a path under an EOS is left out, and the room cuts the depth."""
    heads = hand_heads("medusa", [[0, 3.0, 2.0, 0, 0, 0], [0, 0, 0, 3.0, 2.5, 0]])  # head 1: 1, 2; head 2: 3, 4
    template = [[0], [1], [0, 0], [0, 1], [1, 0]]
    tree = MedusaTree(heads, FakeParts(6, 6), top_k=2, depth=2, max_nodes=5, template=template)
    proposal = propose(tree, [5])
    assert list(zip(proposal.tokens, proposal.parents)) == [(1, -1), (2, -1), (3, 0), (4, 0), (3, 1)]
    assert tree.head_forwards == 2  # one head evaluation per depth
    assert paths(propose(MedusaTree(heads, FakeParts(6, 6), 2, 2, 5, template), [5], eos={1})) == {(1,), (2,), (2, 3)}
    assert paths(propose(MedusaTree(heads, FakeParts(6, 6), 2, 2, 5, template), [5], room=1)) == {(1,), (2,)}
    hydra = hand_heads("hydra", [[0, 3.0, 2.0, 0, 0, 0], [0, 0, 0, 1.0, 0.5, 0]], hydra_shift=5.0)
    proposal = propose(MedusaTree(hydra, FakeParts(6, 6), 2, 2, 5, template), [5])
    # Hydra's heads read the path: head 1 after x0 = 5 ranks 5, 1; head 2 after (5) ranks 5, 3, after (1) ranks 1, 3
    assert paths(proposal) == {(5,), (1,), (5, 5), (5, 3), (1, 1)}


# -- on the loop, with random heads --------------------------------------------------------------------------------

cases = st.fixed_dictionaries({
    "kind": st.sampled_from(["medusa", "hydra"]),
    "seed": st.integers(0, 3),
    "std": st.sampled_from([0.05, 0.5]),
    "prompt": st.lists(st.integers(3, 258), min_size=1, max_size=10),
    "top_k": st.integers(1, 4), "depth": st.integers(1, 4), "max_nodes": st.integers(1, 16),
    "max_new_tokens": st.integers(1, 30), "eos_pick": st.one_of(st.none(), st.integers(0, 29)),
    "tree": st.one_of(st.none(), st.sampled_from([[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]], [3, 2, 1, 1]])),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(case=cases)
def test_medusa_and_hydra_equal_greedy(case, tmp_path_factory):
    pair = tiny_pair()
    free = Greedy(pair, "greedy").generate(case["prompt"], case["max_new_tokens"], set()).tokens
    eos = {free[case["eos_pick"] % len(free)]} if case["eos_pick"] is not None else set()
    ref = Greedy(pair, "greedy").generate(case["prompt"], case["max_new_tokens"], eos)
    directory = random_heads(pair, case["kind"], tmp_path_factory.mktemp("heads"), seed=case["seed"], std=case["std"])
    method = MedusaMethod(pair, case["kind"], kind=case["kind"], head=directory, top_k=case["top_k"],
                          depth=case["depth"], max_nodes=case["max_nodes"], tree=case["tree"])
    gen = method.generate(case["prompt"], case["max_new_tokens"], eos)
    assert gen.tokens == ref.tokens
    assert sum(gen.accept_lengths) == len(gen.tokens) and gen.target_forwards == len(gen.accept_lengths)
    assert all(n <= method.max_nodes for n in gen.extra["tree_nodes"])
    assert all(d <= method.depth for d in gen.extra["tree_depth"]) and gen.drafted == sum(gen.extra["tree_nodes"])


def test_a_tree_holding_every_token_is_accepted_every_step(tmp_path):
    """Whatever the heads (here untrained ones), a depth-1 tree of the whole vocabulary holds the target's next
    token: τ = 2 on every step after the prefill (the features each step reads are the right ones)."""
    # a static cache (a GPU's default execution) needs a bucket for the 1 + V-node block
    pair = build_tiny_pair(name="tiny-llama", device=TEST_DEVICE, buckets=[1, 2, 4, 8, 16, 32, 64, 128, 512])
    config = MedusaConfig.for_target(pair.target.config, "medusa", heads=1)
    save_medusa(tmp_path, MedusaHeads(config), {"test": True})
    method = MedusaMethod(pair, "medusa", head=str(tmp_path), top_k=pair.vocab_size, depth=1,
                          max_nodes=pair.vocab_size)
    gen = method.generate([5, 6, 7, 8], 20, set())
    assert gen.accept_lengths[0] == 1 and all(n == 2 for n in gen.accept_lengths[1:-1])


@pytest.mark.parametrize("kind, temperature, top_p", [("medusa", 1.0, 1.0), ("hydra", 0.9, 0.95)])
def test_sampled_generations_are_distributed_as_the_targets(tmp_path, kind, temperature, top_p):
    pair = small_vocab_pair()
    random_heads(pair, kind, tmp_path, heads=2, std=0.3)
    method = MedusaMethod(pair, kind, kind=kind, head=str(tmp_path), top_k=2, depth=2, max_nodes=4,
                          temperature=temperature, top_p=top_p)
    prompt = [1, 2, 4]
    counts, gens = sample_generations(method, prompt, MAX_NEW, {EOS}, 1500)
    assert sum(g.drafted for g in gens) > 1000 and sum(g.accepted for g in gens) > 100
    target = exact_sequence_distribution(pair.target, temperature, top_p, prompt, MAX_NEW, {EOS})
    assert goodness_of_fit(counts, target) > 1e-3
    # the test has power: the same samples are far from the target's distribution at another temperature
    other = exact_sequence_distribution(pair.target, temperature / 3, top_p, prompt, MAX_NEW, {EOS})
    assert goodness_of_fit(counts, other) < 1e-6


# -- artifacts and bad input -----------------------------------------------------------------------------------------

def test_artifacts_round_trip_and_record_their_hash(tmp_path):
    pair = tiny_pair()
    random_heads(pair, "hydra", tmp_path, heads=3)
    artifact = load_medusa(str(tmp_path), "hydra")
    assert artifact.config.heads == 3 and len(artifact.sha256) == 64
    method = MedusaMethod(pair, "hydra", kind="hydra", head=str(tmp_path), depth=3)
    assert method.identity == {"kind": "hydra", "source": str(tmp_path), "sha256": artifact.sha256}


class Unloaded:  # reading the target would raise: the checks must come first
    name, draft, backend = "tiny", None, "transformers"  # what a ConfigOnlyPair has too

    def __getattr__(self, attr):
        raise AssertionError(f"read {attr}")


@pytest.mark.parametrize("settings_, message", [
    ({"kind": "eagle"}, "method.kind: must be one of ['medusa', 'hydra'], got 'eagle'"),
    ({"top_k": 0}, "method.top_k: "), ({"depth": -1}, "method.depth: "), ({"max_nodes": "x"}, "method.max_nodes: "),
    ({"head": None}, "method.head: needs the medusa heads to draft with"),
    ({"head": "/nowhere/medusa"}, "method.head: no trained head at /nowhere/medusa"),
])
def test_bad_settings_are_refused_before_the_pair_is_read(settings_, message):
    with pytest.raises(ConfigError) as caught:
        MedusaMethod(Unloaded(), "medusa", **{"head": "/nowhere/x", **settings_})
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_heads_for_another_target_kind_or_depth_are_refused(tmp_path):
    other = build_tiny_pair(name="wide", hidden_size=96)
    random_heads(other, "medusa", tmp_path / "wide")
    with pytest.raises(ConfigError, match=r"^method\.head: .* was made for another target \(hidden_size 96 but the "
                                          r"target's is 64\); train one for this target"):
        MedusaMethod(tiny_pair(), "medusa", head=str(tmp_path / "wide"))
    random_heads(tiny_pair(), "medusa", tmp_path / "m", heads=2)
    with pytest.raises(ConfigError, match=r"^method\.head: .* is a medusa head; method hydra needs a hydra head"):
        MedusaMethod(tiny_pair(), "hydra", kind="hydra", head=str(tmp_path / "m"), depth=2)
    with pytest.raises(ConfigError, match=r"^method\.depth: depth 4 but .* has 2 heads \(K\); depth may be 1\.\.2$"):
        MedusaMethod(tiny_pair(), "medusa", head=str(tmp_path / "m"), depth=4)
    with pytest.raises(ConfigError, match=r"^method\.tree: depth 3 but .* has 2 heads \(K\)"):
        MedusaMethod(tiny_pair(), "medusa", head=str(tmp_path / "m"), tree=[2, 1, 1])
    with pytest.raises(ConfigError, match=r"^method\.head: .* is a medusa head, not a feature-level"):
        FeatureHeadMethod(tiny_pair(), "eagle", head=str(tmp_path / "m"))
    save_head(tmp_path / "e", DraftHead(HeadConfig.for_target(tiny_pair().target.config, "eagle")), None, {})
    with pytest.raises(ConfigError, match=r"^method\.head: .* is a eagle head; method medusa needs a medusa head"):
        MedusaMethod(tiny_pair(), "medusa", head=str(tmp_path / "e"))


def write_published_medusa(directory, heads: MedusaHeads, suffix: str = "safetensors") -> None:
    """Medusa's release layout: config.json (medusa_num_heads, medusa_num_layers, base_model_name_or_path) and
    medusa_lm_head.<suffix> holding ``{k}.{j}.linear.*`` (ResBlocks) and ``{k}.{L}.weight`` (each head's lm_head)."""
    directory.mkdir(parents=True, exist_ok=True)
    L = heads.cfg.layers
    state = {}
    for k in range(heads.cfg.heads):
        for j in range(L):
            state[f"{k}.{j}.linear.weight"] = heads.blocks[k][j].linear.weight.detach().clone()
            state[f"{k}.{j}.linear.bias"] = heads.blocks[k][j].linear.bias.detach().clone()
        state[f"{k}.{L}.weight"] = heads.lm_heads[k].weight.detach().clone()
    if suffix == "safetensors":
        from safetensors.torch import save_file
        save_file(state, str(directory / "medusa_lm_head.safetensors"))
    else:
        torch.save(state, directory / "medusa_lm_head.pt")
    (directory / "config.json").write_text(json.dumps({"medusa_num_heads": heads.cfg.heads, "medusa_num_layers": L,
                                                       "base_model_name_or_path": "tiny-llama"}))


@pytest.mark.parametrize("suffix", ["safetensors", "pt"])
def test_a_published_medusa_head_loads_into_our_heads_and_drafts(tmp_path, suffix):
    pair = tiny_pair()
    config = MedusaConfig.for_target(pair.target.config, "medusa", heads=3, layers=2, own_lm_head=True)
    heads = MedusaHeads(config).init_weights(seed=3, std=0.1)
    write_published_medusa(tmp_path / "medusa-tiny", heads, suffix)
    artifact = published_medusa(tmp_path / "medusa-tiny", "someone/medusa-tiny")
    assert (artifact.config.heads, artifact.config.layers, artifact.config.own_lm_head) == (3, 2, True)
    built = artifact.build()
    for name, value in heads.state_dict().items():
        assert torch.equal(built.state_dict()[name], value), name
    method = MedusaMethod(pair, "medusa", head="someone/medusa-tiny", depth=3)  # found in the hub cache below
    prompt = [5, 9, 14, 200, 31]
    assert method.generate(prompt, 16, set()).tokens == Greedy(pair, "g").generate(prompt, 16, set()).tokens
    assert method.identity["source"] == "someone/medusa-tiny" and method.heads.cfg.own_lm_head


def write_published_hydra(directory, heads: MedusaHeads, arch: str = "mlp", grounded: bool = True) -> None:
    """Hydra's release layout (zankner/Hydra): config.json (hydra_num_heads, hydra_num_layers, hydra_head_arch,
    grounded_heads) and hydra_lm_head.pt holding HydraMLP's state: ``hydra_mlp.{k}.0.{linear,res_connection}.*``
    (the grounded block), ``hydra_mlp.{k}.{j}.linear.*`` (j >= 1), ``hydra_lm_head.{k}.{weight,bias}``, and the
    target's embeddings under ``input_embed_fn`` (HydraMLP keeps them as a submodule)."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {"input_embed_fn.weight": torch.zeros(3, heads.cfg.hidden_size)}
    for k in range(heads.cfg.heads):
        for part in ("weight", "bias"):
            state[f"hydra_mlp.{k}.0.linear.{part}"] = getattr(heads.grounded[k].linear, part).detach().clone()
            state[f"hydra_mlp.{k}.0.res_connection.{part}"] = getattr(heads.grounded[k].res_connection, part).detach()
            for j in range(1, heads.cfg.layers):
                state[f"hydra_mlp.{k}.{j}.linear.{part}"] = getattr(heads.blocks[k][j - 1].linear, part).detach()
            state[f"hydra_lm_head.{k}.{part}"] = getattr(heads.lm_heads[k], part).detach().clone()
    torch.save(state, directory / "hydra_lm_head.pt")
    (directory / "config.json").write_text(json.dumps({
        "hydra_num_heads": heads.cfg.heads, "hydra_num_layers": heads.cfg.layers, "hydra_head_arch": arch,
        "grounded_heads": grounded, "hidden_state_offset": 0, "base_model_name_or_path": "tiny-llama"}))


def test_a_published_hydra_head_loads_into_our_heads_and_drafts(tmp_path):
    pair = tiny_pair()
    config = MedusaConfig.for_target(pair.target.config, "hydra", heads=3, layers=2, own_lm_head=True,
                                     lm_head_bias=True)
    heads = MedusaHeads(config).init_weights(seed=4, std=0.1)
    write_published_hydra(tmp_path / "hydra-tiny", heads)
    artifact = published_hydra(tmp_path / "hydra-tiny", "someone/hydra-tiny")
    assert (artifact.config.heads, artifact.config.layers, artifact.config.lm_head_bias) == (3, 2, True)
    built = artifact.build()
    for name, value in heads.state_dict().items():
        assert torch.equal(built.state_dict()[name], value), name
    method = MedusaMethod(pair, "hydra", kind="hydra", head="someone/hydra-tiny", depth=3)  # the hub cache below
    prompt = [5, 9, 14, 200, 31]
    assert method.generate(prompt, 16, set()).tokens == Greedy(pair, "g").generate(prompt, 16, set()).tokens
    assert method.identity["source"] == "someone/hydra-tiny" and method.heads.cfg.kind == "hydra"


@pytest.mark.parametrize("arch, grounded, message", [
    ("prefix-mlp", True, r"hydra_head_arch 'prefix-mlp' \(Hydra\+\+'s\); only the paper's MLP heads"),
    ("mlp", False, r"grounded_heads false: its heads read h_t alone")])
def test_hydra_heads_of_another_architecture_are_refused_by_name(tmp_path, arch, grounded, message):
    pair = tiny_pair()
    config = MedusaConfig.for_target(pair.target.config, "hydra", heads=2, own_lm_head=True, lm_head_bias=True)
    write_published_hydra(tmp_path, MedusaHeads(config), arch=arch, grounded=grounded)
    with pytest.raises(ConfigError, match=r"^method\.head: x/hydra has " + message):
        published_hydra(tmp_path, "x/hydra")


@pytest.fixture(autouse=True)
def hub_cache(tmp_path, monkeypatch, request):
    """A hub cache of our own (tests never reach the hub); the published-format tests put their snapshot there."""
    cache = tmp_path / "hub"
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    for kind in ("medusa", "hydra"):
        if f"published_{kind}_head_loads" in request.node.name:
            repo = cache / f"models--someone--{kind}-tiny"
            (repo / "refs").mkdir(parents=True)
            (repo / "refs" / "main").write_text("a" * 40)
            snapshot = repo / "snapshots" / ("a" * 40)
            snapshot.parent.mkdir(parents=True)
            os.symlink(tmp_path / f"{kind}-tiny", snapshot)
    return cache


def test_a_published_head_id_offline_names_the_switch():
    with pytest.raises(ConfigError, match=r"^method\.head: FasterDecoding/medusa-vicuna-7b-v1\.3 is not in the local "
                                          r"Hugging Face cache.*method\.local_files_only=false"):
        load_medusa("FasterDecoding/medusa-vicuna-7b-v1.3", "medusa")
    with pytest.raises(ConfigError, match=r"^method\.head: ankner/hydra-vicuna-7b-v1\.3 is not in the local "):
        load_medusa("ankner/hydra-vicuna-7b-v1.3", "hydra")


def test_a_directory_that_is_not_a_medusa_head_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConfigError, match=r"not a Medusa head \(expected config\.json and medusa_lm_head"):
        published_medusa(tmp_path, "x/y")
    (tmp_path / "medusa_lm_head.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"config\.json has no medusa_num_heads"):
        published_medusa(tmp_path, "x/y")
