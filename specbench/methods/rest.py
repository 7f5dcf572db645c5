"""REST (He et al. 2024, "REST: Retrieval-Based Speculative Decoding"): no draft model; drafts are retrieved from
a datastore built offline and verified as a token tree in one target forward.

The paper: a datastore D = {(c_i, t_i)} of contexts and continuations, indexed by a suffix array over a corpus
(DraftRetriever). Each step the longest suffix of the committed context that occurs in D (exact match, trying
suffix lengths from long to short) retrieves the continuations S of its occurrences; a trie is built over S with
each node weighted by how many continuations pass through it, the most frequent prefixes (the top-c nodes) are
kept, and that sub-trie is verified by tree attention.

What we do: the same, on one suffix array over ShareGPT answers tokenized with the target's tokenizer
(specbench/retrieval/). Suffix lengths L = ``max_context`` .. ``min_context`` are tried longest first; the first L
whose occurrences are followed by at least one token wins; up to ``max_candidates`` of its occurrences give
continuations of ``draft_length`` tokens (cut at a document's end, after the first EOS and to the room the budget
leaves). The trie's nodes are ranked by count (ties: shallower first, then first seen) and the top ``max_nodes``
kept: since a node's count never exceeds its parent's, the kept set is always a subtree hanging from x0.

Of a suffix with more occurrences than ``max_candidates``, REST's retriever takes the first ones in suffix-array
order (``retrieve: first``, the default, with its 5000 candidates and 64 nodes: the published run); ``spaced``
takes occurrences evenly spaced over the range instead, which is sorted by continuation, so the sample's counts are
proportional to the continuations' frequencies (method=rest_cpu: 512 of them, 16 nodes, sized for a CPU verify).
Where we differ: DraftRetriever keeps one suffix array per 512M-token chunk and joins entries with no separator
(a match may run across two answers); ours is one array with a separator between answers, and a continuation
stops at its answer's end. Its tree keeps the 64 most frequent prefixes and then trims paths until their distinct
tokens fit; ours keeps the top ``max_nodes`` nodes by count, always a subtree.

The tree is a proposal of point masses (what is retrieved depends only on the committed tokens): output identical
to greedy at T = 0, exact tree rejection sampling above it. Raw counters in ``extra``: steps, steps_with_match, and
per step ``match_length`` (L, 0: none), ``retrieved`` (continuations) and ``tree_nodes``.
"""
from __future__ import annotations

from ..decoding.proposal import Proposal, Step, StepContext
from ..errors import positive_int, require
from ..retrieval.datastore import Datastore, check_tokenizer, location, read_manifest
from .base import ProposerMethod

RETRIEVE = ("first", "spaced")  # which occurrences of a suffix with more than max_candidates (Datastore.continuations)


def top_nodes(paths: list[list[int]], max_nodes: int) -> list[list[int]]:
    """The trie of ``paths`` cut to its ``max_nodes`` most frequent nodes (count: paths through the node; ties:
    shallower, then first seen), as the root-to-leaf token paths of the kept subtree, most frequent first."""
    child: dict[tuple[int, int], int] = {}  # (parent node, token) -> node; -1: the root x0
    parent, token, depth, count = [], [], [], []  # per node, numbered in the order first seen
    for path in paths:
        node = -1
        for t in path:
            nxt = child.get((node, t))
            if nxt is None:
                nxt = child[(node, t)] = len(count)
                parent.append(node)
                token.append(t)
                depth.append(depth[node] + 1 if node >= 0 else 1)
                count.append(0)
            count[nxt] += 1
            node = nxt
    kept = sorted(range(len(count)), key=lambda n: (-count[n], depth[n], n))[:max_nodes]
    inner = {parent[n] for n in kept}  # closed under parents: a parent counts >= its child and is shallower
    leaves = []
    for n in kept:
        if n not in inner:
            path = []
            while n >= 0:
                path.append(token[n])
                n = parent[n]
            leaves.append(path[::-1])
    return leaves


def cut_at_eos(path: list[int], eos_ids: set[int]) -> list[int]:
    """Nothing under an EOS: the path up to and including its first EOS."""
    end = next((i + 1 for i, token in enumerate(path) if token in eos_ids), len(path))
    return path[:end]


class RetrievalProposer:
    """Proposer: the top nodes of the trie of continuations retrieved for the context's longest matching suffix."""

    draft = None  # no draft model

    def __init__(self, store: Datastore, max_context: int, min_context: int, draft_length: int,
                 max_candidates: int, max_nodes: int, retrieve: str = "spaced"):
        self.store, self.max_context, self.min_context = store, max_context, min_context
        self.draft_length, self.max_candidates, self.max_nodes = draft_length, max_candidates, max_nodes
        self.retrieve = retrieve
        self.stats = {"steps": 0, "steps_with_match": 0}
        self.match_length: list[int] = []
        self.retrieved: list[int] = []
        self.tree_nodes: list[int] = []

    def propose(self, context: StepContext) -> Proposal:
        length = min(self.draft_length, context.room)
        size, found = self.store.continuations(context.tokens, self.max_context, self.min_context, length,
                                               self.max_candidates, self.retrieve)
        proposal = Proposal()
        proposal.add_paths(top_nodes([cut_at_eos(path, context.eos_ids) for path in found], self.max_nodes))
        self.stats["steps"] += 1
        self.stats["steps_with_match"] += size > 0
        self.match_length.append(size)
        self.retrieved.append(len(found))
        self.tree_nodes.append(len(proposal.tokens))
        return proposal

    def observe(self, step: Step) -> None:
        pass

    def extra(self) -> dict:
        return {**self.stats, "match_length": self.match_length, "retrieved": self.retrieved,
                "tree_nodes": self.tree_nodes}


class Rest(ProposerMethod):
    """``method=rest``: retrieval drafts from a datastore, tree-verified. Knobs: ``datastore`` (a name under
    ``datastores_dir``, or a path), ``max_context`` / ``min_context`` (suffix lengths tried), ``draft_length``
    (tokens per continuation), ``max_candidates`` (continuations retrieved), ``retrieve`` (which of more
    occurrences: ``first`` in suffix-array order, REST's, or ``spaced``), ``max_nodes`` (tree nodes kept)."""

    def __init__(self, pair, name: str = "rest", datastore: str = "sharegpt", datastores_dir: str | None = None,
                 max_context: int = 16, min_context: int = 2, draft_length: int = 10, max_candidates: int = 5000,
                 retrieve: str = "first", max_nodes: int = 64, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int = 0):
        super().__init__(pair, name, temperature, top_p, seed)
        self.max_context = positive_int(max_context, "method.max_context", "longest context suffix matched")
        self.min_context = positive_int(min_context, "method.min_context", "shortest context suffix matched")
        require(self.min_context <= self.max_context, "method.min_context",
                f"must be <= method.max_context ({self.max_context}), got {self.min_context}")
        self.draft_length = positive_int(draft_length, "method.draft_length", "tokens per retrieved continuation")
        self.max_candidates = positive_int(max_candidates, "method.max_candidates", "continuations retrieved per step")
        self.max_nodes = positive_int(max_nodes, "method.max_nodes", "most tree nodes per step")
        require(retrieve in RETRIEVE, "method.retrieve", f"{retrieve!r} is not one of {list(RETRIEVE)}")
        self.retrieve = retrieve
        require(isinstance(datastore, str) and datastore.strip() != "", "method.datastore",
                f"must name a datastore (a name under method.datastores_dir, or a path), got {datastore!r}")
        self.where = location(datastore, datastores_dir)
        manifest = read_manifest(self.where)  # missing: the error says how to build it
        tokenizer = pair.tokenizer  # a ConfigOnlyPair stops the early build here
        check_tokenizer(manifest, tokenizer, self.where)
        self.store = Datastore.load(self.where, manifest)

    def step_blocks(self) -> dict[str, int]:
        return {"target": self.max_nodes + 1}

    def make_proposer(self, prompt_ids) -> RetrievalProposer:
        return RetrievalProposer(self.store, self.max_context, self.min_context, self.draft_length,
                                 self.max_candidates, self.max_nodes, self.retrieve)
