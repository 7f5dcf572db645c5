"""What a decoding method returns, and the one token-accounting rule every method obeys."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Iterable

# the models whose forwards a generation records, each priced by its own cost table (analysis/costs.py): the target, a
# draft model, a draft head (EAGLE/GRIFFIN's decoder layer, Medusa/Hydra's heads: drafts made without a draft model)
ROLES = ("target", "draft", "head")


class ForwardLog:
    """Positions read per forward (``sizes``) of a model that is not a CachedLM (a draft head), each computing its
    draft distribution, so ``rows`` are the sizes: what ``Generation.count_forwards`` records under its role."""

    def __init__(self):
        self.sizes: list[int] = []

    @property
    def rows(self) -> list[int]:
        return self.sizes

    def add(self, fed: int) -> None:
        self.sizes.append(fed)


@dataclass(kw_only=True)
class Counters:
    """The raw counters of one generation, defined once: what a method's loop counts (``Generation``) is what its
    record keeps (records/schema.TurnRecord extends this with the text, the clock and the margins). Derived numbers
    (τ, speed-up) live in analysis/metrics.py."""

    target_forwards: int | None = 0  # calls of the target model, prefill included
    draft_forwards: int | None = 0  # calls of the draft model, prefill included (None: the engine does not say)
    drafted: int | None = 0  # draft tokens fed to the target for verification (what verification cost)
    accepted: int | None = 0  # of those, accepted by the verifier and kept in the output
    accept_lengths: list[int] = field(default_factory=list)  # per verification step: tokens it added (τ's numerator)
    proposed: list[int] = field(default_factory=list)  # per step: depth of the proposal (most tokens it could accept)
    accepted_steps: list[int] = field(default_factory=list)  # per step: of those, accepted and kept (α_k reads both)
    forward_sizes: dict = field(default_factory=dict)  # {"target": [tokens fed per call], "draft"|"head": [...]}
    forward_rows: dict = field(default_factory=dict)  # {"target": [rows of logits per call], ...} where known
    forward_contexts: dict = field(default_factory=dict)  # {"target": [positions cached before each call], ...}
    forward_ms: dict = field(default_factory=dict)  # {"target": [wall ms of each call], ...} where timed (a CPU)
    extra: dict = field(default_factory=dict)  # method-specific raw counters (sl, lcp, vllm_spec ...)
    # at T = 0, per kept token: the row of the target's forward it was taken from (evidence.TokenEvidence); in
    # memory only, for the losslessness check (the records keep the margins)
    evidence: list = field(default_factory=list, repr=False, compare=False)

    def counters(self) -> dict:
        """These counters by name (a record is built from a generation's: ``TurnRecord(**gen.counters(), ...)``)."""
        return {f.name: getattr(self, f.name) for f in fields(Counters)}


@dataclass
class Generation(Counters):
    """New tokens and the raw counters of one generation (``Counters``)."""

    tokens: list[int]  # new tokens only: cut after the first EOS, capped at max_new_tokens

    def add_step(self, out: list[int], emitted: list[int], accepted: int, max_new_tokens: int,
                 eos_ids: set[int], proposed: int | None = None) -> None:
        """Count one verification step that appends ``emitted`` (its ``accepted`` draft tokens, then the
        target's own token) to ``out`` (the step's tokens not yet added; no EOS in it, under budget).

        Only tokens the output keeps are counted: a step that runs past an EOS or the budget counts up to
        the EOS / the last token that fits, so ``sum(accept_lengths) == len(tokens)`` for every method and
        τ and acceptance are not inflated on a prompt's last step.

        proposed: the depth of the step's proposal (a chain's length, a tree's longest path), recorded for the
        per-position acceptance α_k; a cut step records at most the kept tokens (positions past an EOS were never
        offered to the output). None: the method does not know it (nothing recorded).
        """
        room = max_new_tokens - len(out)
        kept = 0
        for token in emitted[:room]:
            kept += 1
            if token in eos_ids:
                break
        self.accept_lengths.append(kept)
        self.accepted += min(accepted, kept)
        if proposed is not None:
            self.proposed.append(proposed if kept == len(emitted) else min(proposed, kept))
            self.accepted_steps.append(min(accepted, kept))

    def count_forwards(self, target, draft=None, head: ForwardLog | None = None) -> None:
        """Forward counts and the tokens fed per forward (the bound's cost model reads these), from the CachedLMs
        (or anything with ``sizes``) the method drove; ``head``: a draft head's forwards (recorded, priced by the
        run's bound, not counted in ``draft_forwards``). Rows of logits and the cache length before each forward
        (``contexts``: the bound prices a forward at its context) where the model keeps them, and each forward's wall
        ms where its wrapper timed them (``clock``: timing.ForwardClock, on the CPU)."""
        self.target_forwards = len(target.sizes)
        self.forward_sizes, self.forward_rows, self.forward_contexts, self.forward_ms = {}, {}, {}, {}
        for role, lm in zip(ROLES, (target, draft, head)):
            if lm is None:
                continue
            self.forward_sizes[role] = list(lm.sizes)
            clock = getattr(lm, "clock", None)
            for kept, values in ((self.forward_rows, getattr(lm, "rows", ())),
                                 (self.forward_contexts, getattr(lm, "contexts", ())),
                                 (self.forward_ms, clock.ms if clock is not None else ())):
                values = list(values)
                if len(values) == len(lm.sizes):  # hf_assisted's hooks see sizes only; a head keeps no contexts
                    kept[role] = values
        if draft is not None:
            self.draft_forwards = len(draft.sizes)


def finalize_tokens(tokens: Iterable[int], max_new_tokens: int, eos_ids: set[int]) -> list[int]:
    """Token accounting shared by all methods (docs/design.md, *Token accounting and the counters*).

    Keep tokens up to and including the first EOS, then cap at max_new_tokens. Methods that
    overshoot (a bonus token after EOS, a draft past the budget) are truncated here.
    """
    out: list[int] = []
    for tok in tokens:
        if len(out) >= max_new_tokens:
            break
        out.append(int(tok))
        if tok in eos_ids:
            break
    return out


def is_finished(tokens: list[int], max_new_tokens: int, eos_ids: set[int]) -> bool:
    """True once the budget is spent or an EOS was emitted."""
    return len(tokens) >= max_new_tokens or any(t in eos_ids for t in tokens)
