"""SAM Decoding (Hu et al. 2024, "SAM Decoding: Speculative Decoding via Suffix Automaton"; Spec-Bench's
SAM-Decoding[EAGLE-2] row): retrieval drafts from suffix automata, optionally combined with another proposer.

The paper keeps two suffix automata (decoding/suffix_automaton.py): a dynamic one over the prompt and the generated
text, extended with every committed token (O(1) amortized each), and a static one over a text corpus built offline.
Each step it follows both with the newly committed tokens to keep the longest suffix of the sequence that occurs
earlier (the match), and drafts the tokens after the match's first occurrence (``min_endpos``; a shorter suffix's
when the first occurrence is followed by too few tokens: ``to_anc``). The static match counts ``len_bias`` tokens
less (a corpus match is less likely to be what this text says next than one in its own context). When the longer
match has at least ``len_threshold`` tokens the automaton's draft is verified, otherwise an auxiliary proposer's
(Token Recycling, EAGLE, EAGLE-2): SAM[EAGLE-2] is the leaderboard row.

What we do: the same, as a proposer on the one loop. ``method.fallback`` is any other method on the loop
(``SpeculativeDecoding``, ``FeatureHeadMethod`` for EAGLE-2, ...), built with the same pair and sampling; null is
SAM alone (a step below the threshold proposes nothing: a plain target step). ``method.corpus`` is a JSON file of
token-id lists (already tokenized with the pair's tokenizer) for the static automaton; null (default): none.

Where we differ: the draft is cut before the first EOS and to the budget's room. The fallback proposer observes
every step, including those the automaton drafted (its caches and features stay in step: a draft model's cache
is cropped to the committed tokens and catches up on the next step it drafts; an EAGLE head's features are
appended); an adaptive SL policy in a fallback therefore also learns from the steps SAM drafted. The paper's
SAM-alone variant still drafts with a match shorter than the threshold; here ``min_match_length: 1`` does that.

Exactness: the automaton's draft is a chain of point masses (probs None), exact at T=0 (greedy path) and at T>0
(rejection sampling with point-mass q); a fallback's proposal goes to the verifier unchanged, its q included.
Counters in ``extra``: steps, steps_sam, steps_fallback, and per step the match length ``match_length`` (the
dynamic automaton's, or the static one's less ``corpus_bias`` where that is longer) and ``source`` (sam, fallback,
or none: nothing drafted), plus the fallback's own counters under ``fallback``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..decoding.loop import speculative_generate
from ..decoding.proposal import Proposal, Proposer, Step, StepContext
from ..decoding.dynamic_tree import HeadTree
from ..decoding.suffix_automaton import Match, SuffixAutomaton
from ..errors import ConfigError, positive_int, require
from .base import NoTimeline, ProposerMethod


class SamProposer:
    """Proposer: the automata's draft when the match is long enough, else the fallback's (module docstring)."""

    def __init__(self, max_draft: int, min_match_length: int, static: SuffixAutomaton | None = None,
                 corpus_bias: int = 0, fallback: Proposer | None = None, alpha: float | None = None):
        self.sam = SuffixAutomaton()  # the dynamic automaton: prompt + generated tokens
        self.static, self.corpus_bias = static, corpus_bias
        self.static_match = Match()  # the committed sequence against the static automaton (unused without one)
        self.max_draft, self.min_match_length, self.alpha = max_draft, min_match_length, alpha
        self.fallback = fallback
        self.draft = getattr(fallback, "draft", None)  # the fallback's draft CachedLM: its forwards are counted
        self.head_log = getattr(fallback, "head_log", None)  # so are a fallback head's (EAGLE-2's)
        self.topk = getattr(fallback, "topk", 0)  # Token Recycling learns from every verify step's top-k rows
        self.stats = {"steps": 0, "steps_sam": 0, "steps_fallback": 0}
        self.match_length: list[int] = []
        self.source: list[str] = []  # per step: sam | fallback | none (no draft)

    def _read(self, tokens: list[int]) -> None:
        """Follow both automata with the committed tokens not read yet (the dynamic one also appends them)."""
        for token in tokens[len(self.sam.tokens):]:
            self.sam.extend(token)
            if self.static is not None:
                self.static_match = self.static.read(self.static_match, token)

    def sam_draft(self, context: StepContext) -> tuple[int, list[int]]:
        """(match length m, draft): the longer match's continuation (the static one's length less corpus_bias), of
        ``max_draft`` tokens, or with ``alpha`` min(max_draft, ⌊α·m⌋) (the paper's SAM-alone length: its
        min(n_predicts, 1 + ⌊α·m⌋) counts the last committed token too), cut before the first EOS and to the room."""
        self._read(context.tokens)
        length, source, match = self.sam.match.length, self.sam, self.sam.match
        if self.static is not None and self.static_match.length - self.corpus_bias > length:
            length, source, match = self.static_match.length - self.corpus_bias, self.static, self.static_match
        want = min(self.max_draft, context.room)
        if self.alpha is not None:
            want = min(want, int(max(length, 0) * self.alpha))
        draft = source.continuation(match, want)
        cut = next((i for i, token in enumerate(draft) if token in context.eos_ids), len(draft))
        return length, draft[:cut]

    def propose(self, context: StepContext) -> Proposal:
        length, draft = self.sam_draft(context)
        self.stats["steps"] += 1
        self.match_length.append(length)
        if draft and length >= self.min_match_length:
            self.stats["steps_sam"] += 1
            self.source.append("sam")
            return Proposal.chain(draft)  # point masses
        if self.fallback is None:
            self.source.append("none")
            return Proposal()
        self.stats["steps_fallback"] += 1
        self.source.append("fallback")
        return self.fallback.propose(context)

    def observe(self, step: Step) -> None:
        if self.fallback is not None:  # every step: its draft cache / features follow the committed tokens
            self.fallback.observe(step)

    def extra(self) -> dict:
        out: dict[str, Any] = {**self.stats, "match_length": self.match_length, "source": self.source}
        if self.fallback is not None:
            out["fallback"] = self.fallback.extra()
        return out


def load_corpus(path: str) -> list[list[int]]:
    """``method.corpus``: a JSON file holding a list of token-id lists (tokenized with the pair's tokenizer)."""
    file = Path(path).expanduser()
    require(file.is_file(), "method.corpus", f"no such file: {file} (a JSON list of token-id lists, or null)")
    try:
        sequences = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"method.corpus: cannot read {file} as JSON ({exc})") from None
    require(isinstance(sequences, list) and all(
        isinstance(s, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in s)
        for s in sequences), "method.corpus", f"{file} must hold a list of lists of token ids (integers >= 0)")
    return sequences


class SamDecoding(ProposerMethod):
    """``method=sam_decoding``: knobs ``max_draft`` (most tokens drafted per step), ``min_match_length`` (the paper's
    len_threshold: shortest match whose draft is used), ``fallback`` (null, or another method's config: its
    proposals below the threshold), ``corpus`` (null, or a JSON file of token-id lists for the static automaton) and
    ``corpus_bias`` (the paper's len_bias: a static match counts that many tokens less), ``alpha`` (null: always
    ``max_draft`` tokens; a number α: min(max_draft, ⌊α·m⌋) after an m-token match, the paper's SAM alone)."""

    def __init__(self, pair, name: str = "sam_decoding", max_draft: int = 10, min_match_length: int = 1,
                 fallback: Any = None, corpus: str | None = None, corpus_bias: int = 4, alpha: float | None = None,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        super().__init__(pair, name, temperature, top_p, seed)
        self.max_draft = positive_int(max_draft, "method.max_draft", "most tokens drafted per step")
        self.min_match_length = positive_int(min_match_length, "method.min_match_length",
                                             "shortest match whose draft is used")
        require(isinstance(corpus_bias, int) and not isinstance(corpus_bias, bool) and corpus_bias >= 0,
                "method.corpus_bias", f"must be an integer >= 0, got {corpus_bias!r}")
        self.corpus_bias = corpus_bias
        require(alpha is None or (isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha > 0),
                "method.alpha", f"must be null or a number > 0 (draft length per matched token), got {alpha!r}")
        self.alpha = alpha
        self.static = None if corpus is None else SuffixAutomaton.of_sequences(load_corpus(corpus))
        self.fallback = build_fallback(fallback, pair, temperature, top_p, seed)
        require(not getattr(self.fallback, "tunes_length", False), "method.fallback",
                "a proposal length of auto is not tuned inside sam_decoding; give the fallback a number")
        self.needs_draft = getattr(self.fallback, "needs_draft", False)  # autotune prices the draft's forwards
        if self.static is not None:  # a ConfigOnlyPair without a vocabulary stops the early build here
            largest = max((max(s) for s in self.static.sequences if s), default=-1)
            require(largest < pair.vocab_size, "method.corpus", f"holds token id {largest}, but the pair's "
                    f"vocabulary has {pair.vocab_size}: tokenize the corpus with the pair's tokenizer")

    def reset(self, seed: int = 0) -> None:
        super().reset(seed)  # the one sampler of the loop (the fallback's proposer draws with it too)
        if self.fallback is not None:
            self.fallback.reset(seed)

    @property
    def carries_state(self) -> bool:  # the automaton is per prompt; a fallback's persistent SL carries
        return self.fallback is not None and self.fallback.carries_state

    def carried_state(self):
        return self.fallback.carried_state()

    def restore_state(self, state) -> None:
        if self.fallback is not None:
            self.fallback.restore_state(state)

    def prepare(self, prompt_ids, max_new_tokens: int, eos_ids: set[int]) -> None:
        if self.fallback is not None:  # an oracle fallback learns the target's output here (untimed)
            self.fallback.prepare(prompt_ids, max_new_tokens, eos_ids)

    def step_blocks(self) -> dict[str, int]:
        fallback = self.fallback.step_blocks().get("target", 0) if self.fallback is not None else 0
        return {"target": max(self.max_draft + 1, fallback)}

    def head_cost_probe(self):
        """A fallback head's forwards as the run's bound times them (EAGLE-2's: feature_head.py); None without."""
        probe = getattr(self.fallback, "head_cost_probe", None)
        return probe() if probe else None

    def make_proposer(self, prompt_ids) -> SamProposer:
        fallback = None if self.fallback is None else self.fallback.make_proposer(prompt_ids)
        return SamProposer(self.max_draft, self.min_match_length, self.static, self.corpus_bias, fallback,
                           self.alpha)

    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()):
        proposer = self.make_proposer(prompt_ids)
        if isinstance(proposer.fallback, HeadTree):  # an EAGLE head reads the target's features (feature_head.py)
            target = self.pair.lm("target", features=True)
        else:
            target = self.pair.lm("target")
        return speculative_generate(target, proposer, prompt_ids, max_new_tokens, eos_ids, self.sampler, timeline)


def build_fallback(fallback, pair, temperature: float, top_p: float, seed: int) -> ProposerMethod | None:
    """The fallback method: None, a built ProposerMethod, or its config (a ``_target_`` mapping, built here with
    the same pair and sampling)."""
    if fallback is None or isinstance(fallback, ProposerMethod):
        return fallback
    if isinstance(fallback, dict) or hasattr(fallback, "keys"):
        from ..instantiate import build  # the same builder as every method config (ConfigErrors surfaced)
        from omegaconf import OmegaConf

        node = fallback if not isinstance(fallback, dict) else OmegaConf.create(fallback)
        require("_target_" in node, "method.fallback", "must be null or a method config with a _target_")
        try:
            built = build(node, "method.fallback", pair=pair, temperature=temperature, top_p=top_p, seed=seed)
        except ConfigError as exc:  # the fallback's own checks name its keys as method.<key>: name them where they are
            text = str(exc)
            raise ConfigError("method.fallback." + text[len("method."):] if text.startswith("method.") and
                              not text.startswith("method.fallback.") else text) from None
        require(isinstance(built, ProposerMethod), "method.fallback",
                f"must be a method on the speculative loop (a ProposerMethod), got {type(built).__name__}")
        return built
    raise ConfigError(f"method.fallback: must be null or a method config with a _target_, got {fallback!r}")
