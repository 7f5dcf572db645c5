"""The record schema: what one generation measured (``TurnRecord``) and one line of a run's JSONL file
(``RunRecord``), written and read back as these types (records/store.py stores the lines).

A record is one (prompt, repeat) of one run: its identity, the measured turn(s) combined (a multi-turn example's
times and counters summed, ids and steps concatenated, each turn kept in ``turns``), how it was measured (dtype,
env, model_info, the resolved config) and what the runner adds after the clocks stop (``pairing``, ``lossless``,
``score``). Counters are raw and match the emitted tokens: sum(accept_lengths) == new_tokens == len(output_ids).
Records written by earlier versions load too: a field they lack takes its default, a field this version does not
know is kept in ``other`` and written back unchanged.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

from ..decoding.generation import ROLES, Counters

# 2: pairing mode in the run key, resolved precision and threads in every record; pairing rounds; losslessness verdicts
SCHEMA_VERSION = 2


@dataclass
class TurnRecord(Counters):
    """One generation, as a backend measured it: its counters (``decoding/generation.Counters``, the same fields a
    method's ``Generation`` counted), the text, the clock (``wall_s``, ``prefill_s``, ``step_ms``) and the margins."""

    prompt_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    new_tokens: int = 0
    wall_s: float = 0.0
    prefill_s: float | None = None          # time to the first token
    target_forwards: int | None = None      # a record that does not say counts no forwards (not zero)
    draft_forwards: int | None = None       # None where the engine does not say (vLLM)
    step_ms: list[float] = field(default_factory=list)       # per step: ms from the turn's start to the step's end
    margins: list[float] = field(default_factory=list)       # per token (T = 0): l(token) - best other, own forward

    @classmethod
    def from_dict(cls, row: dict) -> TurnRecord:
        return cls(**{k: v for k, v in row.items() if k in TURN_FIELDS})

    def to_dict(self) -> dict:
        out = {f: getattr(self, f) for f in TURN_FIELDS if f not in TRANSIENT}
        for key in (*PER_FORWARD, *PER_STEP):  # an engine that does not record them (vLLM) writes none
            if not out[key]:
                del out[key]
        return out


TURN_FIELDS = tuple(f.name for f in fields(TurnRecord))
# one value per forward, {model: [...]}, recorded where the engine and model keep them (forward_sizes always is)
PER_FORWARD = ("forward_rows", "forward_contexts", "forward_ms")
# one value per step / per token, recorded where the engine keeps them (our loops; not vLLM, not hf_assisted's steps)
PER_STEP = ("step_ms", "margins")
TRANSIENT = ("evidence",)  # kept in memory for the losslessness check, never written
OPTIONAL = ("category", "turns", "batch", "pairing", "lossless", "score", "tuned", "serving")  # written only when set


@dataclass
class RunRecord(TurnRecord):
    """One line of a run's records: identity, the turns combined, how they were measured, the runner's verdicts."""

    schema: int = SCHEMA_VERSION
    run_key: str | None = None
    method: str | None = None
    pair: str | None = None
    data: str | None = None
    prompt_id: str = ""
    prompt_index: int | None = None
    category: str | None = None             # the prompt's category, where the dataset has them (data=spec_bench)
    repeat: int = 0
    max_new_tokens: int | None = None
    dtype: str | None = None
    env: dict = field(default_factory=dict)
    model_info: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    timestamp: float = 0.0
    turns: list[TurnRecord] | None = None   # each turn, when there are several
    batch: dict | None = None               # engine=vllm: the round's batch (id, size, position, wall_s, new_tokens);
    #                                         a served level's also server_counters (vLLM: its speculation totals)
    pairing: dict | None = None             # the runner's round: mode, round id, session, position, size
    lossless: dict | None = None            # the verdict against greedy's output (analysis/lossless.py)
    score: dict | None = None               # the dataset's task score
    tuned: dict | None = None               # a proposal length ``auto`` chose, and from what
    serving: dict | None = None             # a served request's timeline (records/requests.Timeline)
    other: dict = field(default_factory=dict)  # fields of another version of the schema, kept as they were

    @classmethod
    def from_dict(cls, row: dict) -> RunRecord:
        known = {f.name for f in fields(cls)} - {"other"}
        record = cls(**{k: v for k, v in row.items() if k in known},
                     other={k: v for k, v in row.items() if k not in known})
        if record.turns is not None:
            record.turns = [TurnRecord.from_dict(t) if isinstance(t, dict) else t for t in record.turns]
        return record

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("other", *TURN_FIELDS)}
        out.update(TurnRecord.to_dict(self))
        for key in OPTIONAL:
            if out[key] is None:
                del out[key]
        if self.turns is not None:
            out["turns"] = [t.to_dict() for t in self.turns]
        return {**out, **self.other}

    @property
    def turn_list(self) -> list[TurnRecord]:
        """The record's turns: ``turns`` for a conversation, else the record itself (its one turn)."""
        return self.turns or [self]

    @property
    def round(self) -> str | None:
        """The interleaved round it was measured in (None: timed on its own, ``runner.pairing=separate``)."""
        return (self.pairing or {}).get("round")


def build_record(spec, example, index: int, repeat: int, max_new_tokens: int, turns: list[TurnRecord],
                 **measured) -> RunRecord:
    """One record (``spec``: the runner.RunSpec, ``example``: the data.Example): identity, the turns combined (and
    kept when there are several), then what the engine says about how it measured (dtype, env, model_info,
    config; engine=vllm adds ``batch``)."""
    combined = combine_turns(turns)
    return RunRecord(
        **{f: getattr(combined, f) for f in TURN_FIELDS}, run_key=spec.key, method=spec.method, pair=spec.pair,
        data=spec.data, prompt_id=example.id, prompt_index=index, category=getattr(example, "category", None),
        repeat=repeat, max_new_tokens=max_new_tokens,
        **measured, timestamp=time.time(), turns=turns if len(turns) > 1 else None)


SUMMED = ("new_tokens", "wall_s", "prefill_s", "target_forwards", "draft_forwards", "drafted", "accepted")


def combine_turns(turns: list[TurnRecord]) -> TurnRecord:
    """One record's turn fields from its turns: counts and times summed, ids and steps concatenated.

    ``prompt_tokens`` is the first turn's; ``output_text`` joins the turns' texts with a blank line; ``step_ms``
    concatenates each turn's clock, which starts at 0 in every turn (``turns`` keeps them apart).
    """
    if len(turns) == 1:
        return turns[0]
    summed = {key: sum(getattr(t, key) for t in turns) if all(getattr(t, key) is not None for t in turns) else None
              for key in SUMMED}
    return TurnRecord(
        **summed,
        prompt_tokens=turns[0].prompt_tokens,
        output_ids=[i for t in turns for i in t.output_ids],
        output_text="\n\n".join(t.output_text for t in turns),
        accept_lengths=[n for t in turns for n in t.accept_lengths],
        proposed=[n for t in turns for n in t.proposed],
        accepted_steps=[n for t in turns for n in t.accepted_steps],
        **{key: [v for t in turns for v in getattr(t, key)] for key in (*PER_STEP, *TRANSIENT)},
        forward_sizes={model: [k for t in turns for k in t.forward_sizes.get(model, [])]
                       for model in ROLES if model != "head" or any(model in t.forward_sizes for t in turns)},
        **{key: {model: [v for t in turns for v in getattr(t, key)[model]] for model in ROLES
                 if all(model in getattr(t, key) for t in turns)} for key in PER_FORWARD},
        extra={},
    )
