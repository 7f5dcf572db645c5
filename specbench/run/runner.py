"""The runner: rounds, pairing, resume, locking, the losslessness check, scoring and writing — for every engine.

An engine gives the runner a **round backend** (``RoundBackend`` below): it prepares (untimed: caches sized, lengths
tuned, warm-up) and generates one round's prompts for one entry, timing only the generation. Everything else happens
here, outside the timed regions: scoring, the losslessness check, pairing stamps, writing, logging. engine=hf's
backend (engines/loops.py) runs our decoding loops one prompt at a time; engine=vllm's (engines/vllm_rounds.py)
runs ``runner.batch_size`` prompts a round through a vLLM engine. One record per (prompt, repeat) is appended as
soon as its round ends (records/store.py), so a crash loses no finished round and a re-run resumes.

Pairing (docs/design.md, *Speed-up: paired, interleaved baselines*). On a shared machine the load drifts over
minutes, so a baseline timed minutes apart from the method measures the load, not the method. ``run`` takes
several entries: the first is the baseline, and each round (one prompt and repeat; a batch of them for a batched
backend) times the baseline and every entry still missing a record of it back to back, in the same process on the
same loaded weights, the order rotated from round to round. The round's records share a round id (a batched
backend's: ``<round>:<position in the batch>``, pairing each request with the baseline's request on the same
prompt), and speed-up is computed from these pairs (analysis/metrics.py). A baseline record serves only the entries of
its own round: another process, or another run in this one, measures its own baseline again.
"""
from __future__ import annotations

import sys
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from ..data import Example
from ..analysis.metrics import first_repeat, one_per_prompt
from ..records.store import RecordStore, slug
from ..records.schema import RunRecord

SESSION = uuid.uuid4().hex[:12]  # this process


@dataclass
class RunSpec:
    """Identity and storage of one run: a (pair, data, method, settings) combination."""

    key: str
    method: str
    pair: str
    data: str
    records_dir: Path

    @property
    def store(self) -> RecordStore:
        name = f"{slug(self.method)}-{self.key}.jsonl"
        return RecordStore(self.records_dir / slug(self.pair) / slug(self.data) / name)

    def records_for(self, examples: list[Example]) -> list[RunRecord]:
        """This run's stored records for the given prompts (the store may hold more prompts)."""
        wanted = {ex.id for ex in examples}
        return [RunRecord.from_dict(row) for row in self.store.load()
                if row.get("run_key") == self.key and row.get("prompt_id") in wanted]

    @property
    def summary_path(self) -> Path:
        return self.store.path.with_suffix(".summary.json")

    @property
    def error_path(self) -> Path:
        """Written when the run fails before finishing (e.g. a dataset that needs the hub), so a report can
        say why a cell is empty; removed by the next successful run."""
        return self.store.path.with_suffix(".error.json")


@dataclass
class Entry:
    """What one run decodes with (engine=hf: a DecodingMethod; engine=vllm: a started engine session), and
    where its records go."""

    method: Any
    spec: RunSpec


@dataclass
class Measurement:
    record: RunRecord
    prompts: list[list[int]]  # each turn's prompt ids (kept for the losslessness check, not written)


Round = list[tuple[int, Example]]  # (index in the dataset, example): one prompt, or a batch of them


class RoundBackend(Protocol):
    """What an engine gives the runner. ``batch_size``: prompts a round holds; ``batched``: whether a round is one
    batch (its records carry ``batch`` and pair by position) rather than one prompt."""

    batch_size: int
    batched: bool

    def prepare(self, entries: list[Entry], needed: list[int], examples: list[Example], rounds: list[Round],
                warmup_example: Example, previous: list[list[RunRecord]]) -> None:
        """Untimed, before the first round: whatever the entries ``needed`` must do before being timed on
        ``rounds`` of ``examples`` (the dataset, in order): size caches, tune lengths from their ``previous``
        records, warm up."""

    def generate(self, entry: Entry, prompts: Round, repeat: int) -> list[Measurement]:
        """One entry's generations on one round's prompts, timing the generations only: a record per prompt."""

    def lossless(self, entry: Entry, baseline: Entry) -> Any:
        """What classifies ``entry``'s outputs against ``baseline``'s on the same prompt (``classify(prompt,
        greedy_turn, method_turn)``: analysis/lossless.LosslessCheck on their pair, engine=vllm's own), or None:
        not checked (sampled outputs; another dtype or execution mode than the baseline's, whose tokens may
        differ at near-ties without a bug)."""


class Runner:
    def __init__(self, backend: RoundBackend, repeats: int = 1, progress: bool = True, scorer=None, tracker=None):
        """After the clocks stop, each measured entry's output is classified against its baseline's of the same
        round (or ``reference``) where the backend gives a check for the two (``RoundBackend.lossless``).
        tracker: logs each record of the measured entries."""
        self.backend, self.repeats, self.progress = backend, repeats, progress
        self.scorer, self.tracker = scorer, tracker

    def run(self, entries: list[Entry], examples: list[Example], warmup_example: Example,
            reference: list[RunRecord] | None = None, order_offset: int = 0,
            baselines: list[int] | None = None) -> list[list[RunRecord]]:
        """Measure every entry on every (example, repeat) it has no record for; return each entry's records.

        One entry: timed on its own. Several: ``entries[0]`` is the baseline, timed in every round next to the
        entries that need that round; its returned records are those paired with the others' returned records.
        reference: baseline records to classify single-entry outputs against (``runner.pairing=separate``).
        order_offset: added to the rotation of the order within rounds (make bench counts prompts across datasets).
        baselines: per entry, the index of the entry its outputs are checked against (itself: a baseline, not
        checked); default ``entries[0]`` for every other entry. make bench times several baselines in one round
        (each backend's and execution mode's greedy, each method checked against its own).
        Holds the writer lock of every store whose records decide what is left to do (the methods', or the only
        entry's) throughout, so a parallel job needing the same run waits, then resumes. A paired baseline's
        store is locked only around each append: jobs of other methods sharing it run on in parallel.
        """
        owned = entries[1:] or entries[:1]
        with ExitStack() as stack:
            for store in sorted({e.spec.store.path: e.spec.store for e in owned}.values(), key=lambda s: str(s.path)):
                stack.enter_context(store.lock())
            return self._run(entries, examples, warmup_example, reference, order_offset,
                             baselines or [0] * len(entries))

    def _run(self, entries, examples, warmup_example, reference, order_offset, baselines):
        units = list(range(1, len(entries))) or [0]  # entries whose records decide what is left to do
        previous = [e.spec.records_for(examples) for e in entries]
        if len(entries) == 1:  # a run on its own is timed alone: a baseline file's lines from other methods'
            previous[0] = [r for r in previous[0] if r.round is None]  # rounds are not its timings
        done = {j: {(r.prompt_id, r.repeat) for r in previous[j]} for j in units}
        rounds = self.rounds(examples, units, done)
        kept = sum(len(done[j]) for j in units)
        if kept:
            print(f"[specbench] {'+'.join(e.spec.method for e in entries)}: resuming, {kept} record(s) kept, "
                  f"{sum(len(r[1]) for r in rounds)} to run", file=sys.stderr)
        records = [list(p) for p in previous]
        if rounds:
            needed = sorted({0, *(j for _, _, need in rounds for j in need)})
            self.backend.prepare(entries, needed, examples, [prompts for _, prompts, _ in rounds], warmup_example,
                                 records)
            bar = tqdm(total=sum(len(r[1]) for r in rounds), desc="+".join(e.spec.method for e in entries),
                       unit="prompt", disable=not self.progress, file=sys.stderr)
            for repeat, prompts, need in rounds:
                members = [0, *need] if len(entries) > 1 else [0]
                for j, recs in self.round(entries, members, prompts, repeat, reference, order_offset,
                                          baselines).items():
                    records[j] += recs
                bar.update(len(prompts))
            bar.close()
        if len(entries) > 1:  # the baseline records that belong to the returned rounds
            paired = {r.round for j in units for r in records[j]}
            records[0] = [r for r in records[0] if r.round in paired]
        else:  # a run on its own: one record per (prompt, repeat), each timed alone
            records[0] = one_per_prompt(records[0])
        return records

    def rounds(self, examples, units, done) -> list[tuple[int, Round, list[int]]]:
        """(repeat, prompts, entries that need them) per round: the prompts some entry has no record of, in
        dataset order, ``batch_size`` a round; each round needed by the entries missing any of its records."""
        out = []
        for repeat in range(self.repeats):
            missing = [(i, ex) for i, ex in enumerate(examples) if any((ex.id, repeat) not in done[j] for j in units)]
            for k in range(0, len(missing), self.backend.batch_size):
                prompts = missing[k:k + self.backend.batch_size]
                out.append((repeat, prompts, [j for j in units if any((ex.id, repeat) not in done[j]
                                                                      for _, ex in prompts)]))
        return out

    def round(self, entries, members: list[int], prompts: Round, repeat: int, reference,
              order_offset: int, baselines: list[int]) -> dict[int, list[RunRecord]]:
        """Time ``members`` back to back on one round, in an order rotated by the round's place in the dataset and
        the repeat (so a prompt's order changes from repeat to repeat); then score, check, label and write their
        records (the baseline's first). Nothing but the timed generations happens between the members' timings."""
        shift = (prompts[0][0] // self.backend.batch_size + repeat + order_offset) % len(members)
        order = members[shift:] + members[:shift]
        measured = {j: self.backend.generate(entries[j], prompts, repeat) for j in order}
        for j in order:  # outside every timed region, after the round's last clock stopped
            for (_, example), m in zip(prompts, measured[j]):
                score_record(self.scorer, example, m.record)
        round_id = uuid.uuid4().hex[:12] if len(members) > 1 else None
        for position, j in enumerate(order):
            for k, m in enumerate(measured[j]):
                m.record.pairing = {"mode": "interleaved" if round_id else "separate",
                                    "round": f"{round_id}:{k}" if round_id and self.backend.batched else round_id,
                                    "session": SESSION, "position": position, "size": len(order)}
        for j in members:  # each against its baseline in this round; timed alone, against ``reference``
            if not round_id:
                self.check(entries[j], entries[j], prompts, measured[j], None, reference)
            elif baselines[j] != j and baselines[j] in measured:
                self.check(entries[j], entries[baselines[j]], prompts, measured[j], measured[baselines[j]], None)
        for m in (m for j in members for m in measured[j]):  # the rows' top-K served the check: not kept
            for turn in {id(t): t for t in (m.record, *m.record.turn_list)}.values():
                turn.evidence = []
        out = {}
        for j in sorted(members):  # the baseline (0) first: a method record never points at a missing round
            recs = [m.record for m in measured[j]]
            store = entries[j].spec.store
            with ExitStack() as stack:
                if j == 0 and round_id:  # shared with other methods' jobs: held for these appends only
                    stack.enter_context(store.lock())
                for record in recs:
                    store.append(record.to_dict())
            if self.tracker is not None and (j > 0 or len(entries) == 1):
                for record in recs:
                    self.tracker.log_record(record)
            out[j] = recs
        return out

    def check(self, entry: Entry, baseline_entry: Entry, prompts: Round, measured: list[Measurement],
              baseline: list[Measurement] | None, reference: list[RunRecord] | None) -> None:
        """Each record's losslessness verdict against ``baseline_entry``'s record of its round, or (timed alone)
        the first repeat of its prompt in ``reference`` (records of ``entry``'s own baseline, same decoder);
        none where the backend has no check for the two."""
        check = self.backend.lossless(entry, baseline_entry)
        if check is None:
            return
        for k, ((_, example), m) in enumerate(zip(prompts, measured)):
            against = baseline[k].record if baseline else first_repeat(reference or [], example.id)
            if against is not None:
                m.record.lossless = classify_record(check, m.prompts, m.record, against)


def prompt_of(messages: list[dict], conversation: bool):
    """What a turn encodes: a single-turn example its prompt text; a multi-turn one the whole conversation so far."""
    return messages if conversation else messages[-1]["content"]


def score_record(scorer, example: Example, record: RunRecord) -> None:
    """The dataset's task score into the record (over its turns' texts); never raises (failures are recorded)."""
    if scorer is not None:
        record.score = scorer.score(example, [t.output_text for t in record.turn_list])


def classify_record(lossless, prompts: list[list[int]], record: RunRecord, baseline: RunRecord) -> dict:
    """Losslessness of one record against greedy's on the same prompt: the first turn that differs decides;
    ``index`` counts over the concatenated turns (as the record's output_ids). A failure of the check itself
    is recorded as verdict ``error`` (counted as unclassified), never lost with the round's timings.
    ``lossless``: anything with ``classify(prompt, greedy_turn, method_turn)`` (lossless.LosslessCheck, or an
    engine's own) over schema.TurnRecords."""
    reference = {"against": baseline.round, "against_repeat": baseline.repeat}
    offset, worst = 0, None  # worst: the identical turns' largest row disagreement (lossless_rows.agreement)
    try:
        for turn, (prompt, theirs, mine) in enumerate(zip(prompts, baseline.turn_list, record.turn_list)):
            result = lossless.classify(prompt, theirs, mine)
            if result["verdict"] != "identical":
                for where in (result, *(result.get(k) for k in ("own_forward", "agreement", "continuation"))):
                    if where and "index" in where:
                        where["index"] += offset
                if "divergence" in result:
                    result["divergence"] += offset
                return {**result, **reference, **({"turn": turn} if len(record.turn_list) > 1 else {})}
            agreed = result.get("agreement")
            if agreed and (worst is None or agreed["ratio"] > worst["ratio"]):
                worst = {**agreed, "index": agreed["index"] + offset}
            offset += len(mine.output_ids)
    except Exception as exc:  # noqa: BLE001 — the timings of the round are kept whatever happens here
        return {"verdict": "error", "reason": f"{type(exc).__name__}: {exc}", **reference}
    return {"verdict": "identical", **({"agreement": worst} if worst else {}), **reference}
