"""``method=eagle`` / ``griffin`` / ``eagle3``: a feature-level draft head (EAGLE's, GRIFFIN's or EAGLE-3's,
models/heads/draft_head.py)
drafting EAGLE-2 dynamic trees (decoding/dynamic_tree.py) that the target verifies on the shared loop; with
``method.tree`` (rank paths or per-depth widths) the static tree of EAGLE-1 instead (``method=eagle1``).

The target runs as a FeatureLM (its forwards also keep its last hidden states, the features the head reads).
No draft model: ``model`` may be a pair without one. The head comes from ``method.head``: the name of a head
``python -m specbench.training.heads`` trained (our EAGLE / GRIFFIN heads, under ``method.heads_dir``:
models/heads/names.py), a directory, or a published EAGLE-format head's Hugging Face id; a head made for another
target (hidden size or vocabulary) is refused when the pair loads, a missing one before.

EAGLE-3 (kind eagle3) reads the inputs of three of the target's decoder layers instead of its last hidden state
(FeatureLM's ``layers``; in static and graphs execution taps inside the static forward: static_lm.StaticModel).
"""
from __future__ import annotations

from ..decoding.dynamic_tree import HeadTree
from ..models.heads.runner import EagerHeadRunner, HeadCostProbe, StaticHead, StaticHeadRunner
from ..decoding.loop import speculative_generate
from ..decoding.rank_tree import parse_tree
from ..errors import require
from ..backends.torch.cpu_linear import apply_linear_kernel
from ..models.heads.draft_head import KINDS, HeadConfig, TargetParts, eagle3_layers
from ..models.heads.artifact import head_source, load_head
from ..errors import positive_int
from .base import NoTimeline, ProposerMethod


class FeatureHeadMethod(ProposerMethod):
    """Knobs (EAGLE-2's names): ``top_k`` K (children per expanded node and frontier width), ``depth`` D (head
    forwards per step), ``max_nodes`` (tree budget: total_token). ``kind``: eagle | griffin | eagle3, the head it
    needs. ``tree``: EAGLE-1's static tree (decoding/rank_tree.py) in place of the dynamic one; its depth and node
    count replace ``depth`` and ``max_nodes`` (``top_k`` is unused)."""

    backends = ("transformers",)
    backend_reason = "its head reads the target's hidden states and lm_head, which llama.cpp does not expose here"

    def __init__(self, pair, name: str = "eagle", kind: str = "eagle", head: str | None = None,
                 heads_dir: str | None = None, top_k: int = 8, depth: int = 5, max_nodes: int = 24,
                 tree=None, local_files_only: bool = True, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        super().__init__(pair, name, temperature, top_p, seed)
        require(kind in KINDS, "method.kind", f"must be one of {list(KINDS)}, got {kind!r}")
        self.kind = kind
        self.top_k = positive_int(top_k, "method.top_k", "children per expanded node, K")
        self.depth = positive_int(depth, "method.depth", "tree depth D: head forwards per step")
        self.max_nodes = positive_int(max_nodes, "method.max_nodes", "most tree nodes per step")
        self.template = None if tree is None else parse_tree(tree)
        if self.template is not None:  # EAGLE-1: the static tree sets the step's shape
            self.depth, self.max_nodes = max(map(len, self.template)), len(self.template)
        head = head_source(head, heads_dir, f"needs the {kind} head to draft with: the name of a head "
                           f"`python -m specbench.training.heads head=<name>` trained (make heads: {kind}), a "
                           "directory, or a published head's Hugging Face id")
        self.head_source, self.local_files_only = head, local_files_only
        self.check_blocks()  # here: a ConfigOnlyPair stops the early build at the next line
        target = pair.target  # a ConfigOnlyPair stops the early build here: the rest needs the loaded pair
        self.artifact = load_head(head, kind, local_files_only)
        if kind == "eagle3" and self.artifact.provenance.get("feature_layers") == "target's":  # 2, L/2, L-3
            self.artifact.config.feature_layers = eagle3_layers(target.config.num_hidden_layers)
        HeadConfig.for_target(target.config, kind)  # a target no head can draft for (GPT-2) is named first
        self.artifact.check_target(target.config)
        dtype, kernel = next(target.parameters()).dtype, pair.precision.linear_kernel
        self.head = apply_linear_kernel(self.artifact.build(dtype=dtype, device=pair.device), kernel)
        self.parts = TargetParts.of(target, self.artifact.draft_ids, dtype, kernel,  # it places draft_ids
                                    lm_head=self.artifact.lm_head)

    @property
    def identity(self) -> dict:
        """What a run records about the head (its hash decides the run key through the method config)."""
        return self.artifact.identity

    def step_blocks(self) -> dict[str, int]:
        return {"target": self.max_nodes + 1}

    def make_proposer(self, prompt_ids) -> HeadTree:
        return HeadTree(self.head_runner(), self.parts, self.top_k, self.depth, self.max_nodes,
                        fuse=self.head.fuse_layers, template=self.template)

    def head_runner(self):
        """The head's forwards in the pair's execution mode (models/heads/runner.py)."""
        if not self.pair.execution.static:
            return EagerHeadRunner(self.head, self.parts)
        static = self.pair.static_for(f"head:{self.name}:{id(self.head)}", lambda **settings: StaticHead(
            self.head, self.parts, label=f"{self.pair.name} {self.kind} head", **settings))
        return StaticHeadRunner(static)

    def head_cost_probe(self) -> HeadCostProbe:
        """The head's forwards as the run's bound times them (costs.run_bound), in the pair's execution mode."""
        return HeadCostProbe(self.head_runner(), self.pair.target.config.hidden_size,
                             next(self.head.parameters()).dtype, self.pair.device)

    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()):
        layers = self.artifact.config.feature_layers
        target = self.pair.lm("target", features=True, layers=layers or ())  # EAGLE-3: its layer taps
        return speculative_generate(target, self.make_proposer(prompt_ids), prompt_ids, max_new_tokens, eos_ids,
                                    self.sampler, timeline)
