"""``method=medusa`` / ``method=hydra``: K decoding heads on the target's last hidden state (Medusa, Cai et al. 2024;
Hydra, Ankner et al. 2024; the heads: models/heads/medusa.py) drafting a candidate tree the target verifies in one
forward on the shared loop.

Per step, after the committed tokens ..x_t, x0 (x0 = x_{t+1}, the target's own token from the last verify), the
heads read h_t, the target's feature at the last token it verified (``Step.features``' last row: the target runs
as a FeatureLM), and head k ranks x_{t+k+1}, the token at depth k of the tree hung after x0:

- the root's children are head 1's top-K tokens, scored by log p_1;
- at depth d = 2..D the K best expandable nodes of depth d-1 (by the cumulative log-probability of their path, the
  log of the product of head probabilities Medusa orders its candidates by; EOS nodes are never expanded) get head
  d's top-K as children. Medusa's head d reads only h_t, so every node's children are the same tokens (a
  Cartesian-product tree, computed once per step); Hydra's head d also reads e(x0), e(d_1)..e(d_{d-1}) of the node's
  own path, one batched head forward per depth;
- the ``max_nodes`` best candidates by score form the tree (a child never outscores its parent, so every chosen
  node's ancestors are chosen; ties go to the shallower, earlier node).

Medusa ships a static sparse tree calibrated on held-out accuracies per head (mc_sim_7b_63: 63 nodes, 4 heads,
top-10 each); ``method.tree`` takes such a tree (rank paths: the node at p + [r] is head len(p)+1's r-th token;
conf/method/medusa_spec_bench.yaml holds mc_sim_7b_63). Without one (the default, sized for a CPU) we grow the
product tree by probability per step (EAGLE-2's beam + rerank, decoding/dynamic_tree.py), with no calibration data.
Candidates are point masses (the heads' top-K given the context), so verification is greedy-exact at T=0 and exact in
distribution above it by tree rejection sampling (Medusa's "typical acceptance" is not lossless and is not done).
The first step proposes nothing (the prefill gives x0 and h_t). Counters in ``extra``: per step ``tree_nodes``,
``tree_depth``; ``head_forwards`` (batched head evaluations: one per depth).
"""
from __future__ import annotations

import torch

from ..analysis.costs import MEASURED_UP_TO
from ..decoding.generation import ForwardLog
from ..decoding.loop import speculative_generate
from ..decoding.proposal import Proposal, Step, StepContext
from ..decoding.rank_tree import by_depth, parse_tree
from ..backends.staging import read_scores_and_ids, to_device
from ..errors import ConfigError, positive_int, require
from ..models.heads.draft_head import TargetParts
from ..models.heads.artifact import head_source
from ..models.heads.medusa import KINDS, MedusaHeads, load_medusa
from .base import NoTimeline, ProposerMethod


class MedusaTree:
    """Proposer: the heads' candidate tree (module docstring). top_k = K children, depth = D heads, max_nodes."""

    draft = None  # no draft model: head evaluations are in ``head_log`` (priced by the bound) and ``extra``

    def __init__(self, heads: MedusaHeads, parts: TargetParts, top_k: int, depth: int, max_nodes: int,
                 template: list[list[int]] | None = None):
        """template: Medusa's static sparse tree (rank paths in BFS order, rank_tree.parse_tree); None: the tree grown
        by probability each step (module docstring)."""
        self.heads, self.parts = heads, parts
        self.top_k, self.depth, self.max_nodes = top_k, min(depth, heads.cfg.heads), max_nodes
        self.levels = by_depth(template)  # levels[d-1]: the template's depth-d paths ([]: no template)
        self.dtype = next(heads.parameters()).dtype
        self.feature: torch.Tensor | None = None  # (H,) h_t: the target's feature at the last token it verified
        self.tree_nodes: list[int] = []
        self.tree_depth: list[int] = []
        self.head_log = ForwardLog()  # per head evaluation: the rows of h it reads (each a distribution over V)

    @property
    def head_forwards(self) -> int:
        return len(self.head_log.sizes)

    def _logp(self, k: int, h: torch.Tensor, path_ids: list[list[int]] | None = None) -> torch.Tensor:
        """Head k's log-probabilities (n, V) float32 for n rows of h (n, H); path_ids: each row's x0, d_1..d_{k-1}."""
        self.head_log.add(h.shape[0])
        embeds = None
        if path_ids is not None:
            embeds = self.parts.embed(to_device(torch.tensor(path_ids), h.device)).to(self.dtype)  # (n, k, H)
        u = self.heads.hidden(k, h, embeds)
        return torch.log_softmax(self.heads.logits(k, u, self.parts.logits).float(), dim=-1)

    @torch.inference_mode()
    def propose(self, context: StepContext) -> Proposal:
        proposal = Proposal()
        depth_cap = min(self.depth, context.room)
        if self.feature is not None and depth_cap > 0:
            (self._fill if self.levels else self._grow)(proposal, context, depth_cap)
        self.tree_nodes.append(len(proposal.tokens))
        self.tree_depth.append(proposal.depth)
        return proposal

    def _grow(self, proposal: Proposal, context: StepContext, depth_cap: int) -> None:
        hydra = self.heads.cfg.kind == "hydra"
        h = self.feature[None].to(self.dtype)  # (1, H)
        x0, k = context.tokens[-1], self.top_k
        pool: list[tuple[float, int, int, int]] = []  # candidates: (score, depth, parent candidate, token)
        frontier = [-1]  # -1: the root (x0)
        path_of = {-1: [x0]}  # x0, d_1.. of a frontier node's path: what Hydra's next head reads

        for depth in range(1, depth_cap + 1):
            if hydra:
                logp = self._logp(depth, h.expand(len(frontier), -1), [path_of[c] for c in frontier])
            else:  # head d reads h_t alone: the same children under every frontier node
                logp = self._logp(depth, h).expand(len(frontier), -1)
            top = logp.topk(min(k, logp.shape[-1]), dim=-1)
            values, ids = read_scores_and_ids(top.values, top.indices)  # the depth's one read
            children = []
            for row, parent in enumerate(frontier):
                base = pool[parent][0] if parent >= 0 else 0.0
                for value, token in zip(values[row], ids[row]):
                    children.append(len(pool))
                    pool.append((base + value, depth, parent, token))
            expandable = [c for c in children if pool[c][3] not in context.eos_ids]
            frontier = sorted(expandable, key=lambda c: (-pool[c][0], c))[:k]
            if not frontier:
                break
            for c in frontier:
                path_of[c] = path_of[pool[c][2]] + [pool[c][3]]
        chosen = sorted(range(len(pool)), key=lambda c: (-pool[c][0], pool[c][1], c))
        node_of: dict[int, int] = {-1: -1}
        for c in chosen:
            if len(proposal.tokens) >= self.max_nodes:
                break
            if pool[c][2] in node_of:  # ancestors first (scores never rise along a path)
                node_of[c] = len(proposal.tokens)
                proposal.tokens.append(pool[c][3])
                proposal.parents.append(node_of[pool[c][2]])

    def _fill(self, proposal: Proposal, context: StepContext, depth_cap: int) -> None:
        """The static template: the node at rank path p + [r] is the r-th token of head len(p) + 1's distribution
        (Medusa's heads read h_t alone, so one ranking per head serves every node of its depth, and every head's
        ranking is read at once; Hydra's read the node's path: one batched forward and one read per depth over the
        nodes with children). Nothing hangs under an EOS."""
        hydra = self.heads.cfg.kind == "hydra"
        h = self.feature[None].to(self.dtype)  # (1, H)
        levels = self.levels[:depth_cap]
        if not hydra:  # head d's ranking for every level, (width_d,) each: one read
            logps = [self._logp(len(level[0]), h)[0] for level in levels]  # (V,) each
            widths = [min(max(q[-1] for q in level) + 1, logps[0].shape[-1]) for level in levels]
            tops = torch.stack([logp.topk(max(widths)).indices for logp in logps]).tolist()
            rankings = [row[:width] for row, width in zip(tops, widths)]
        node_of: dict[tuple, int] = {(): -1}  # template path -> proposal node (-1: x0)
        path_of: dict[tuple, list[int]] = {(): [context.tokens[-1]]}  # x0, d_1.. of a node's path (Hydra reads it)
        for index, level in enumerate(levels):
            depth = len(level[0])
            parents = [p for p in dict.fromkeys(q[:-1] for q in level)
                       if p in node_of and (not p or proposal.tokens[node_of[p]] not in context.eos_ids)]
            if not parents:
                break
            if hydra:
                logp = self._logp(depth, h.expand(len(parents), -1), [path_of[p] for p in parents])
                width = min(max(q[-1] for q in level) + 1, logp.shape[-1])
                ranked = dict(zip(parents, logp.topk(width, dim=-1).indices.tolist()))  # parent path -> tokens by rank
            else:  # the same ranking under every parent
                ranked = dict.fromkeys(parents, rankings[index])
            for path in level:
                row = ranked.get(path[:-1])
                if row is None or path[-1] >= len(row):
                    continue
                node_of[path] = len(proposal.tokens)
                path_of[path] = path_of[path[:-1]] + [row[path[-1]]]
                proposal.tokens.append(row[path[-1]])
                proposal.parents.append(node_of[path[:-1]])

    def observe(self, step: Step) -> None:
        if step.features is None:
            raise RuntimeError("MedusaTree needs the target's features: verify with a decoding.cached_lm.FeatureLM")
        self.feature = step.features[-1]  # h at the last verified token: lm_head of it gave the new x0

    def extra(self) -> dict:
        return {"tree_nodes": self.tree_nodes, "tree_depth": self.tree_depth, "head_forwards": self.head_forwards}


class MedusaMethod(ProposerMethod):
    """Knobs: ``kind`` medusa | hydra (the heads it needs), ``head`` (a head trained here by name, a directory, or a
    published Medusa head's Hugging Face id), ``top_k`` K (children per expanded node, frontier width), ``depth`` D
    (heads used per step, at most the head's K), ``max_nodes`` (tree budget); ``tree``: Medusa's static sparse tree
    (rank paths, e.g. its mc_sim_7b_63) in place of the grown one, its depth and size replacing ``depth`` and
    ``max_nodes`` (``top_k`` unused)."""

    backends = ("transformers",)
    backend_reason = "its heads read the target's hidden states and lm_head, which llama.cpp does not expose here"

    def __init__(self, pair, name: str = "medusa", kind: str = "medusa", head: str | None = None,
                 heads_dir: str | None = None, top_k: int = 4, depth: int = 4, max_nodes: int = 10,
                 tree: list | None = None, local_files_only: bool = True, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0):
        super().__init__(pair, name, temperature, top_p, seed)
        require(kind in KINDS, "method.kind", f"must be one of {list(KINDS)}, got {kind!r}")
        self.kind = kind
        self.top_k = positive_int(top_k, "method.top_k", "children per expanded node, K")
        self.depth = positive_int(depth, "method.depth", "heads used per step: the tree's depth D")
        self.max_nodes = positive_int(max_nodes, "method.max_nodes", "most tree nodes per step")
        self.template = None if tree is None else parse_tree(tree)
        if self.template is not None:  # the static tree sets the depth (heads used) and the node count
            self.depth, self.max_nodes = max(map(len, self.template)), len(self.template)
        head = head_source(head, heads_dir, f"needs the {kind} heads to draft with: the name of a head `python -m "
                           f"specbench.training.heads head={kind}` trained, a directory, or a published Medusa head's "
                           "Hugging Face id")
        self.head_source, self.local_files_only = head, local_files_only
        self.check_blocks()
        target = pair.target  # a ConfigOnlyPair stops the early build here: the rest needs the loaded pair
        self.artifact = load_medusa(head, kind, local_files_only)
        self.artifact.check_target(target.config)
        if self.depth > self.artifact.config.heads:
            key = "method.tree" if self.template is not None else "method.depth"
            raise ConfigError(f"{key}: depth {self.depth} but {self.artifact.source} has {self.artifact.config.heads} "
                              f"heads (K); depth may be 1..{self.artifact.config.heads}")
        dtype, kernel = next(target.parameters()).dtype, pair.precision.linear_kernel
        self.heads = self.artifact.build(dtype=dtype, device=pair.device)
        self.parts = TargetParts.of(target, None, dtype, kernel)

    @property
    def identity(self) -> dict:
        """What a run records about the heads (their hash decides the run key through the method config)."""
        return self.artifact.identity

    def step_blocks(self) -> dict[str, int]:
        return {"target": self.max_nodes + 1}

    def make_proposer(self, prompt_ids) -> MedusaTree:
        return MedusaTree(self.heads, self.parts, self.top_k, self.depth, self.max_nodes, self.template)

    def head_cost_probe(self) -> "MedusaCostProbe":
        """The heads' evaluations as the run's bound times them (costs.run_bound)."""
        return MedusaCostProbe(self.make_proposer([]), self.pair.target.config.hidden_size, self.pair.device)

    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()):
        target = self.pair.lm("target", features=True)
        return speculative_generate(target, self.make_proposer(prompt_ids), prompt_ids, max_new_tokens, eos_ids,
                                    self.sampler, timeline)


class MedusaCostProbe:
    """One head evaluation on k rows of h_t (Hydra's also reading each row's x0), driven as ``costs.time_blocks``
    drives a model, to price a run's head evaluations: head 1 stands for every head (each ends in the lm_head over
    the whole vocabulary, most of its cost). Nothing is cached (``crop`` has nothing to drop) and no context is
    read, so a block longer than ``costs.MEASURED_UP_TO`` (time_blocks' first read, of the prompt) is cut to that."""

    def __init__(self, tree: MedusaTree, hidden_size: int, device):
        self.tree, self.hidden_size, self.device = tree, hidden_size, device

    @torch.inference_mode()
    def forward(self, tokens: list[int], keep_last: int = 1) -> torch.Tensor:
        tokens = list(tokens)[-MEASURED_UP_TO:]
        h = torch.zeros(len(tokens), self.hidden_size, dtype=self.tree.dtype, device=self.device)
        paths = [[t] for t in tokens] if self.tree.heads.cfg.kind == "hydra" else None
        return self.tree._logp(1, h, paths)

    def crop(self, length: int) -> None:
        pass
