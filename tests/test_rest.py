"""REST: the suffix array against brute force, retrieval of continuations, the trie's top nodes, the datastore's
checks (missing, another tokenizer, edited arrays, bad settings), output identical to greedy at T = 0 and
distributed as the target's at T > 0, the record naming the datastore's sha256, and the build command end to end."""
from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.run.components import method_as_recorded
from specbench.decoding import loop
from specbench.decoding.proposal import StepContext
from specbench.decoding.sampling import Sampler
from specbench.errors import ConfigError
from specbench.methods.rest import Rest, RetrievalProposer, top_nodes
from specbench.models.tiny import build_tiny_pair, byte_tokenizer
from specbench.retrieval import datastore
from specbench.retrieval.__main__ import run as build_datastore
from specbench.retrieval.datastore import Datastore, tokenizer_identity
from specbench.retrieval.suffix_array import SEPARATOR, occurrences, suffix_array

from .distribution_helpers import EOS as SMALL_EOS
from .distribution_helpers import one_thread  # noqa: F401  (autouse fixture: one torch thread)
from .distribution_helpers import (IdsOnlyTokenizer, exact_sequence_distribution, goodness_of_fit,
                                   sample_generations, small_vocab_pair)
from .forked import run_module
from .test_counters import check_counters
from .test_equivalence import greedy_reference, pair_for
from .limits import generous

ROOT = Path(__file__).resolve().parents[1]


def concatenated(documents) -> np.ndarray:
    return np.array([t for doc in documents for t in list(doc) + [SEPARATOR]], dtype=np.int32)


def write_store(directory: Path, documents, tokenizer) -> Path:
    tokens = concatenated(documents)
    datastore.write(directory, tokens, suffix_array(tokens), {"tokenizer": tokenizer_identity(tokenizer)})
    return directory


def load_store(directory: Path) -> Datastore:
    return Datastore.load(directory, datastore.read_manifest(directory))


# -- the suffix array ------------------------------------------------------------------------------------------------

documents_st = st.lists(st.lists(st.integers(0, 3), max_size=12), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(documents=documents_st, pattern=st.lists(st.integers(0, 3), min_size=1, max_size=4))
def test_the_suffix_array_sorts_every_suffix_and_finds_every_occurrence(documents, pattern):
    tokens = concatenated(documents)
    as_list = tokens.tolist()
    sa = suffix_array(tokens)
    assert sa.dtype == np.int32
    assert sa.tolist() == sorted(range(len(as_list)), key=lambda i: as_list[i:])  # brute force: sort the suffixes
    lo, hi = occurrences(tokens, sa, pattern)
    where = [i for i in range(len(as_list)) if as_list[i:i + len(pattern)] == pattern]
    assert sorted(sa[lo:hi].tolist()) == where


def test_the_suffix_array_of_long_repeats_and_nothing():
    tokens = np.array([5] * 1000 + [SEPARATOR], np.int32)  # the worst case for doubling: every prefix repeats
    assert suffix_array(tokens).tolist() == [1000] + list(range(999, -1, -1))
    assert suffix_array(np.zeros(0, np.int32)).tolist() == []


# -- retrieval and the trie -----------------------------------------------------------------------------------------

def test_the_longest_matching_suffix_retrieves_its_continuations(tmp_path):
    store = load_store(write_store(tmp_path, [[1, 2, 3, 4, 5], [9, 2, 3, 7], [2, 3, 6, 6, 6], [8, 3]],
                                   byte_tokenizer()))
    # (1, 2, 3) occurs once: its continuation; the shorter (2, 3) is not used
    assert store.continuations([0, 1, 2, 3], 4, 1, 3, 100) == (3, [[4, 5]])
    # (0, 2, 3) nowhere, (2, 3) three times: all three continuations, each cut at its document's end
    size, found = store.continuations([0, 2, 3], 4, 1, 2, 100)
    assert size == 2 and sorted(found) == [[4, 5], [6, 6], [7]]
    # a suffix only at a document's end has no continuation: shorter suffixes are tried ([8, 3] ends there)
    assert store.continuations([8, 3], 2, 1, 2, 100)[0] == 1
    assert store.continuations([8, 3], 2, 2, 2, 100) == (0, [])  # min_context 2: nothing shorter is tried
    assert store.continuations([42, 43], 4, 1, 5, 100) == (0, [])  # no match
    assert store.continuations([2, 3], 4, 1, 0, 100) == (0, [])  # no room


def test_many_occurrences_are_sampled_evenly_in_proportion(tmp_path):
    documents = [[1, 2, 7]] * 300 + [[1, 2, 8]] * 100
    store = load_store(write_store(tmp_path, documents, byte_tokenizer()))
    size, found = store.continuations([1, 2], 2, 1, 1, 40)
    assert size == 2 and len(found) == 40
    assert found.count([7]) == 30 and found.count([8]) == 10


def test_first_retrieves_the_first_occurrences_in_suffix_array_order_as_rest_does(tmp_path):
    """DraftRetriever's Reader::search takes the first k positions of the suffix-array range: the suffixes sorted by
    what follows, so the smallest continuations come first, whatever their frequency."""
    documents = [[1, 2, 8]] * 100 + [[1, 2, 7]] * 300 + [[1, 2, 9]] * 5
    store = load_store(write_store(tmp_path, documents, byte_tokenizer()))
    assert store.continuations([1, 2], 2, 1, 1, 40, "first") == (2, [[7]] * 40)
    size, found = store.continuations([1, 2], 2, 1, 1, 402, "first")
    assert found == [[7]] * 300 + [[8]] * 100 + [[9]] * 2
    assert sorted(store.continuations([1, 2], 2, 1, 1, 5000, "first")[1]) == sorted([[d[2]] for d in documents])


def test_the_trie_keeps_its_most_frequent_nodes():
    paths = [[1, 2, 3], [1, 2, 4], [1, 2, 3], [5, 6], [1, 7]]
    # counts: 1:4, (1,2):3, (1,2,3):2, 5:1, (1,2,4):1, (5,6):1, (1,7):1
    assert top_nodes(paths, 1) == [[1]]
    assert top_nodes(paths, 3) == [[1, 2, 3]]
    assert top_nodes(paths, 4) == [[1, 2, 3], [5]]  # ties at count 1: the shallower node first
    assert sorted(top_nodes(paths, 100)) == [[1, 2, 3], [1, 2, 4], [1, 7], [5, 6]]
    assert top_nodes([], 4) == []


@settings(max_examples=200, deadline=None)
@given(paths=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), max_size=12), max_nodes=st.integers(1, 10))
def test_the_kept_nodes_are_a_subtree_of_the_most_frequent(paths, max_nodes):
    count = {}
    for path in paths:
        for depth in range(1, len(path) + 1):
            count[tuple(path[:depth])] = count.get(tuple(path[:depth]), 0) + 1
    kept = {tuple(leaf[:depth]) for leaf in top_nodes(paths, max_nodes) for depth in range(1, len(leaf) + 1)}
    assert len(kept) == min(max_nodes, len(count))  # closed under prefixes by construction, and no larger
    dropped = set(count) - kept
    assert all(count[k] >= count[d] for k in kept for d in dropped)


def propose(store, tokens, room=100, eos=(), **knobs):
    settings_ = {"max_context": 4, "min_context": 1, "draft_length": 4, "max_candidates": 100, "max_nodes": 8}
    proposer = RetrievalProposer(store, **{**settings_, **knobs})
    proposal = proposer.propose(StepContext(list(tokens), 0, room, set(eos), Sampler()))
    assert proposal.probs is None  # point masses
    return proposal, proposer.extra()


def test_the_proposal_is_a_trie_cut_to_the_room_with_nothing_under_an_eos(tmp_path):
    store = load_store(write_store(tmp_path, [[1, 2, 3, 4, 5], [1, 2, 3, 9], [1, 2, 6, 7]], byte_tokenizer()))
    proposal, extra = propose(store, [1, 2])
    # counts 3: 2, the rest 1 (shallower first, then first seen); leaves in that order: (3, 9), (6, 7), (3, 4, 5)
    assert (proposal.tokens, proposal.parents) == ([3, 9, 6, 7, 4, 5], [-1, 0, -1, 2, 0, 4])
    assert extra["match_length"] == [2] and extra["retrieved"] == [3] and extra["tree_nodes"] == [6]
    proposal, _ = propose(store, [1, 2], room=1)
    assert proposal.tokens == [3, 6] and proposal.depth == 1
    proposal, _ = propose(store, [1, 2], eos={3})
    assert (proposal.tokens, proposal.parents) == ([3, 6, 7], [-1, -1, 1])  # the EOS is a leaf
    proposal, _ = propose(store, [1, 2], max_nodes=2)
    assert (proposal.tokens, proposal.parents) == ([3, 6], [-1, -1])  # 3: twice, then 6: once, at depth 1
    proposal, extra = propose(store, [8, 8])
    assert proposal.tokens == [] and extra["steps_with_match"] == 0


# -- the method on tiny pairs ----------------------------------------------------------------------------------------

FIXED_PROMPTS = [[5, 6, 7, 8, 9], [40, 41, 42], [100, 3, 100, 3], [200]]


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    """A datastore of the tiny Llama's and GPT-2's own greedy continuations of a few prompts (so retrieved drafts get
    accepted), a few random documents and EOS-bearing ones."""
    documents = []
    for arch in ("llama", "gpt2"):
        pair = pair_for(arch, 0.05)
        for prompt in FIXED_PROMPTS:
            free, _ = greedy_reference(pair, prompt, 40, None)
            documents.append(prompt + free.tokens)
            documents.append(prompt + free.tokens[:7] + [2] + free.tokens[7:12])  # an EOS (2) inside a draft
    rng = random.Random(0)
    documents += [[rng.randint(3, 258) for _ in range(30)] for _ in range(20)]
    return write_store(tmp_path_factory.mktemp("rest") / "tiny", documents, byte_tokenizer())


cases = st.fixed_dictionaries({
    "arch": st.sampled_from(["llama", "gpt2"]),
    "prompt": st.one_of(st.sampled_from(FIXED_PROMPTS), st.lists(st.integers(3, 258), min_size=1, max_size=10)),
    "max_context": st.integers(1, 6),
    "min_context": st.integers(1, 6),
    "draft_length": st.integers(1, 8),
    "max_candidates": st.integers(1, 20),
    "max_nodes": st.integers(1, 12),
    "retrieve": st.sampled_from(["first", "spaced"]),
    "max_new_tokens": st.integers(1, 40),
    "eos_pick": st.one_of(st.none(), st.integers(0, 39)),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(case=cases)
def test_rest_equals_greedy(tiny_store, case):
    pair = pair_for(case["arch"], 0.05)
    ref, eos = greedy_reference(pair, case["prompt"], case["max_new_tokens"], case["eos_pick"])
    method = Rest(pair, datastore=str(tiny_store), max_context=max(case["max_context"], case["min_context"]),
                  min_context=case["min_context"], draft_length=case["draft_length"],
                  max_candidates=case["max_candidates"], max_nodes=case["max_nodes"], retrieve=case["retrieve"])
    gen = method.generate(case["prompt"], case["max_new_tokens"], eos)
    assert gen.tokens == ref.tokens
    check_counters(gen, "rest")
    assert gen.draft_forwards == 0 and "draft" not in gen.forward_sizes
    assert max(gen.extra["tree_nodes"]) <= case["max_nodes"]
    assert gen.extra["steps"] == len(gen.accept_lengths)


def test_rest_accepts_retrieved_drafts(tiny_store):
    pair = pair_for("llama", 0.05)
    ref, _ = greedy_reference(pair, FIXED_PROMPTS[0], 40, None)
    gen = Rest(pair, datastore=str(tiny_store)).generate(FIXED_PROMPTS[0], 40, set())
    assert gen.tokens == ref.tokens
    assert gen.target_forwards <= 10  # the datastore holds this very continuation: ~draft_length tokens a step


def test_rest_samples_above_temperature_zero(tiny_store):
    pair = pair_for("gpt2", 0.05)
    method = Rest(pair, datastore=str(tiny_store), temperature=0.8, seed=3)
    gen = method.generate(FIXED_PROMPTS[1], 25, set())
    check_counters(gen, "rest", sampled=True)
    method.reset(3)
    assert method.generate(FIXED_PROMPTS[1], 25, set()).tokens == gen.tokens  # seeded: reproducible


def test_rest_on_a_static_cache_equals_greedy(tiny_store):
    """Trees of retrieved continuations on a preallocated, bucket-padded KV cache (model.execution=static)."""
    static = build_tiny_pair(name="tiny-llama", arch="llama", draft_noise=0.05, execution="static")
    for prompt in FIXED_PROMPTS:
        ref, _ = greedy_reference(static, prompt, 30, None)
        gen = Rest(static, datastore=str(tiny_store), max_nodes=7).generate(prompt, 30, set())
        assert gen.tokens == ref.tokens
        assert gen.accepted > 0


def test_rest_on_llamacpp_equals_its_greedy_up_to_its_noise(tiny_store):
    """model.backend=llamacpp (tiny_llama's weights as a GGUF file): never a MISMATCH against the same backend's
    greedy (identical, or a near-tie within llama.cpp's batched-vs-one-row noise), and drafts are accepted."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (make llamacpp)")
    import torch

    from specbench.analysis.lossless import MISMATCH, LosslessCheck
    from specbench.methods.greedy import Greedy
    from specbench.models.gguf_pair import build_tiny_gguf_pair

    pair = build_tiny_gguf_pair(draft_noise=0.05, backend="llamacpp")
    check = LosslessCheck(pair, threads=torch.get_num_threads())
    accepted = 0
    for prompt in FIXED_PROMPTS:
        reference = Greedy(pair, "greedy").generate(prompt, 30, set())
        gen = Rest(pair, datastore=str(tiny_store), max_nodes=7).generate(prompt, 30, set())
        check_counters(gen, "rest")
        assert check.classify(prompt, reference, gen)["verdict"] != MISMATCH
        accepted += gen.accepted
    assert accepted > 0


class VocabTokenizer(IdsOnlyTokenizer):
    def get_vocab(self) -> dict:
        return {f"<{i}>": i for i in range(self.size)}


WALK = [1, 2, 4, 0, 5, 1, 3, 2, 0, 4, 5, 2, 1, 0, 3, 4, 1, 4]


@pytest.fixture(scope="module")
def small_rest(tmp_path_factory):
    """The 6-token pair and a datastore of random walks over its tokens: every suffix has branching continuations."""
    pair = small_vocab_pair()
    pair = replace(pair, tokenizer=VocabTokenizer(len(pair.tokenizer), SMALL_EOS))
    rng = random.Random(1)
    documents = [[rng.randrange(6) for _ in range(12)] for _ in range(60)] + [WALK]
    return pair, write_store(tmp_path_factory.mktemp("rest") / "small", documents, pair.tokenizer)


@pytest.mark.parametrize("temperature, top_p, flaw", [(1.0, 1.0, False), (0.9, 0.95, False), (1.0, 1.0, True)])
def test_rest_generations_are_distributed_as_the_targets(small_rest, monkeypatch, temperature, top_p, flaw):
    """2000 generations of at most 3 tokens against the target's exact distribution; the power check: a verifier
    that leaves rejected candidates in the residual is caught by the same test."""
    from .test_tree_sampling import flawed_verifier

    pair, store = small_rest
    if flaw:
        monkeypatch.setattr(loop, "verify_tree_sampling", flawed_verifier("keep_rejected"))
    method = Rest(pair, datastore=str(store), max_context=3, min_context=1, draft_length=3, max_nodes=6,
                  temperature=temperature, top_p=top_p)
    counts, gens = sample_generations(method, WALK, 3, {SMALL_EOS}, 2000)
    assert sum(g.drafted for g in gens) > 2000 and sum(g.accepted for g in gens) > 200
    assert max(max(g.extra["tree_nodes"]) for g in gens) > 3  # trees, not chains
    target = exact_sequence_distribution(pair.target, temperature, top_p, WALK, 3, {SMALL_EOS})
    p_value = goodness_of_fit(counts, target)
    assert (p_value < 1e-3) if flaw else (p_value > 1e-3), p_value


# -- bad input and records -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("settings_, message", [
    ({"max_context": 0}, "method.max_context: must be a positive integer"),
    ({"min_context": 0}, "method.min_context: must be a positive integer"),
    ({"min_context": 5, "max_context": 4}, "method.min_context: must be <= method.max_context (4)"),
    ({"draft_length": 0}, "method.draft_length: must be a positive integer"),
    ({"max_candidates": True}, "method.max_candidates: must be a positive integer"),
    ({"max_nodes": -1}, "method.max_nodes: must be a positive integer"),
    ({"retrieve": "random"}, "method.retrieve: 'random' is not one of ['first', 'spaced']"),
    ({"datastore": ""}, "method.datastore: must name a datastore"),
])
def test_rest_rejects_bad_settings(tiny_store, settings_, message):
    with pytest.raises(ConfigError) as caught:
        Rest(pair_for("llama", 0.05), **{"datastore": str(tiny_store), **settings_})
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_missing_datastore_says_how_to_build_it(tmp_path):
    with pytest.raises(ConfigError) as caught:
        Rest(pair_for("llama", 0.05), datastore="sharegpt", datastores_dir=str(tmp_path))
    message = str(caught.value)
    assert message.startswith(f"method.datastore: no datastore at {tmp_path / 'sharegpt'}")
    assert "python -m specbench.retrieval model=" in message and "\n" not in message


def test_a_datastore_of_another_tokenizer_is_refused(tmp_path):
    write_store(tmp_path, [[1, 2, 3]], VocabTokenizer(259, 2))  # as many tokens as the byte tokenizer, other ones
    with pytest.raises(ConfigError) as caught:
        Rest(pair_for("llama", 0.05), datastore=str(tmp_path))
    assert str(caught.value).startswith(f"method.datastore: {tmp_path} was built with another tokenizer")


def test_an_edited_datastore_is_refused(tmp_path):
    write_store(tmp_path, [[1, 2, 3]], byte_tokenizer())
    np.save(tmp_path / datastore.TOKENS, np.array([1, 2, 4, SEPARATOR], np.int32))
    with pytest.raises(ConfigError, match="does not match the sha256"):
        Rest(pair_for("llama", 0.05), datastore=str(tmp_path))


def test_records_name_the_datastores_sha256(tmp_path):
    manifest = datastore.write(tmp_path / "tiny-llama" / "small", concatenated([[1, 2]]), suffix_array(
        concatenated([[1, 2]])), {"tokenizer": tokenizer_identity(byte_tokenizer())})
    method = {"_target_": "specbench.methods.rest.Rest", "name": "rest", "datastore": "small",
              "datastores_dir": str(tmp_path / "tiny-llama")}
    assert method_as_recorded(method)["datastore_sha256"] == manifest["sha256"]
    assert "datastore_sha256" not in method_as_recorded({**method, "datastore": "missing"})


# -- the build command -----------------------------------------------------------------------------------------------

def test_the_build_command_writes_a_datastore_the_method_reads(tmp_path):
    corpus = tmp_path / "corpus.json"
    conversations = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "abcab"},
                                        {"from": "human", "value": "more"}, {"from": "gpt", "value": "abd"}]},
                     {"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "zz"}]},
                     {"conversations": [{"from": "gpt", "value": "never read"}]}]
    corpus.write_text(json.dumps(conversations))
    done = run_module("specbench.retrieval", "model=tiny_llama", f"paths.root={tmp_path}", f"datastore.corpus={corpus}",
                      "datastore.limit=2", "datastore.name=small", timeout=generous(120))
    assert done.returncode == 0, done.stderr
    where = tmp_path / "datastores" / "tiny-llama" / "small"
    manifest = json.loads((where / datastore.MANIFEST).read_text())
    assert (manifest["conversations"], manifest["documents"], manifest["tokens"]) == (2, 3, 10)
    assert manifest["tokenizer"] == tokenizer_identity(byte_tokenizer())
    assert manifest["corpus"]["file"] == "corpus.json" and manifest["corpus"]["limit"] == 2
    ids = byte_tokenizer()("ab", add_special_tokens=False)["input_ids"]
    method = Rest(pair_for("llama", 0.05), datastore="small", datastores_dir=str(where.parent), min_context=1)
    assert sorted(method.store.continuations(ids, 4, 1, 2, 10)[1]) == sorted(
        [byte_tokenizer()(s, add_special_tokens=False)["input_ids"] for s in ("ca", "d")])
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="datastore", overrides=["model=tiny_llama", f"paths.root={tmp_path}",
                                                          "datastore.limit=0"])
    with pytest.raises(ConfigError, match=r"^datastore\.limit: must be a positive integer \(conversations read\)"):
        build_datastore(cfg)


def brute_force_continuations(documents, context, max_context, min_context, length):
    tokens = concatenated(documents).tolist()
    for size in range(min(max_context, len(context)), min_context - 1, -1):
        suffix = list(context[len(context) - size:])
        found = []
        for i in range(len(tokens) - size + 1):
            if tokens[i:i + size] == suffix:
                after = tokens[i + size:i + size + length]
                after = after[:after.index(SEPARATOR)] if SEPARATOR in after else after
                if after:
                    found.append(after)
        if found:
            return size, sorted(found)
    return 0, []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(documents=documents_st, context=st.lists(st.integers(0, 3), min_size=1, max_size=8),
       sizes=st.tuples(st.integers(1, 4), st.integers(0, 4)), length=st.integers(0, 5))
def test_retrieval_finds_what_a_scan_of_the_corpus_finds(tmp_path_factory, documents, context, sizes, length):
    store = load_store(write_store(tmp_path_factory.mktemp("scan"), documents, byte_tokenizer()))
    min_context, max_context = sizes[0], sizes[0] + sizes[1]
    size, found = store.continuations(context, max_context, min_context, length, 10_000)  # every occurrence
    assert (size, sorted(found)) == brute_force_continuations(documents, context, max_context, min_context, length)
