"""The runner: warm-up, timing, paired rounds, one record per (prompt, repeat) appended as it finishes, resume.

Everything outside ``method.generate`` (tokenisation, decoding to text, scoring, the losslessness check,
writing) happens outside the timed region. Methods are reset before every prompt (cold start), not
between the turns of one conversation. A multi-turn example (MT-Bench) generates turn by turn, each turn's
prompt holding the earlier answers; its record sums time and counters over turns and keeps each turn in
``turns``.

Pairing (docs/design.md, *Speed-up: paired, interleaved baselines*). On a shared machine the load drifts over
minutes, so a baseline timed minutes apart from the method measures the load, not the method. ``run`` takes
several entries: the first is the baseline, and each (prompt, repeat) is one **round** in which the baseline
and every entry still missing that record are timed back to back, in the same process on the same loaded
weights, the order rotated from round to round. The round's records share a round id, and speed-up is
computed from these pairs (metrics.py). A baseline record serves only the entries of its own round: another
process, or another run in this one, measures its own baseline again.

Warm start (``Runner.state_before``): a method that carries state from prompt to prompt starts prompt i from
the state measured prompts 0..i-1 left, in dataset order, whatever the warm-up, the repeats or a resume did.
"""
from __future__ import annotations

import sys
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .data import Example
from .environment import environment
from .methods.base import DecodingMethod
from .models import ModelPair
from .metrics import first_repeat, one_per_prompt
from .records import SCHEMA_VERSION, RecordStore, round_of, slug
from .timing import Stopwatch

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

    def records_for(self, examples: list[Example]) -> list[dict]:
        """This run's stored records for the given prompts (the store may hold more prompts)."""
        wanted = {ex.id for ex in examples}
        return [r for r in self.store.load() if r.get("run_key") == self.key and r["prompt_id"] in wanted]

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
    """A method in a run, and where its records go."""

    method: DecodingMethod
    spec: RunSpec


@dataclass
class Measurement:
    record: dict
    prompts: list[list[int]]  # each turn's prompt ids (kept for the losslessness check, not written)


class Runner:
    def __init__(self, pair: ModelPair, max_new_tokens: int, warmup: int = 1, warmup_max_new_tokens: int = 16,
                 repeats: int = 1, seed: int = 0, progress: bool = True, config: dict | None = None,
                 tracker=None, scorer=None, chat: bool | None = None, lossless=None, threads: int | None = None):
        """lossless: a lossless.LosslessCheck (temperature 0): each measured entry's output is classified
        against the baseline's of the same round (or ``reference``) after the clocks stop."""
        self.pair, self.max_new_tokens = pair, max_new_tokens
        self.scorer, self.chat, self.lossless = scorer, chat, lossless
        self.warmup, self.warmup_max_new_tokens = warmup, warmup_max_new_tokens
        self.repeats, self.seed, self.progress = repeats, seed, progress
        self.config = config or {}
        self.tracker = tracker
        self.stopwatch = Stopwatch(pair.device)
        self.order_offset = 0
        self.examples: list[Example] = []  # the dataset being run, in order (warm-start replays read it)
        self.states: dict[tuple[int, str], dict[int, object]] = {}  # (method, run) -> {i: state before prompt i}
        self.env = {**environment(pair.device), "threads": threads}

    def run(self, entries: list[Entry], examples: list[Example], warmup_example: Example,
            reference: list[dict] | None = None, order_offset: int = 0) -> list[list[dict]]:
        """Measure every entry on every (example, repeat) it has no record for; return each entry's records.

        One entry: timed on its own. Several: ``entries[0]`` is the baseline, timed in every round next to the
        entries that need that round; its returned records are those paired with the others' returned records.
        reference: baseline records to classify single-entry outputs against (``runner.pairing=separate``).
        order_offset: added to the rotation of the order within rounds (make bench counts prompts across datasets).
        Holds the writer lock of every store whose records decide what is left to do (the methods', or the only
        entry's) throughout, so a parallel job needing the same run waits, then resumes. A paired baseline's
        store is locked only around each append: jobs of other methods sharing it run on in parallel.
        """
        self.order_offset = order_offset
        owned = entries[1:] or entries[:1]
        with ExitStack() as stack:
            for store in sorted({e.spec.store.path: e.spec.store for e in owned}.values(), key=lambda s: str(s.path)):
                stack.enter_context(store.lock())
            return self._run(entries, examples, warmup_example, reference)

    def _run(self, entries, examples, warmup_example, reference):
        self.examples = examples
        others = entries[1:]
        previous = [e.spec.records_for(examples) for e in entries]
        units = list(range(1, len(entries))) or [0]  # entries whose records decide what is left to do
        done = {i: {(r["prompt_id"], r["repeat"]) for r in previous[i]} for i in units}
        todo = [(rep, i, ex, [j for j in units if (ex.id, rep) not in done[j]])
                for rep in range(self.repeats) for i, ex in enumerate(examples)]
        todo = [t for t in todo if t[3]]
        kept = sum(len(done[i]) for i in units)
        if kept:
            print(f"[specbench] {'+'.join(e.spec.method for e in entries)}: resuming, {kept} record(s) kept, "
                  f"{len(todo)} to run", file=sys.stderr)
        records = [list(p) for p in previous]
        if todo:
            needed = {0, *(j for t in todo for j in t[3])}
            static = {id(e.method.pair): e.method.pair for e in entries if e.method.pair.sized_to_the_run}
            if static:  # size every static cache / llama.cpp context before anything is timed (no regrowth)
                longest = self.longest_sequence([warmup_example] + [t[2] for t in todo])
                for pair in static.values():
                    pair.reserve(longest)
            for j in sorted(needed):
                self.tune(entries[j].method, records[j], warmup_example)
                self.warm_up(entries[j].method, warmup_example)
            bar = tqdm(total=len(todo), desc="+".join(e.spec.method for e in entries), unit="prompt",
                       disable=not self.progress, file=sys.stderr)
            for repeat, index, example, need in todo:
                members = [0, *need] if others else [0]
                for j, record in self.round(entries, members, example, index, repeat, reference).items():
                    records[j].append(record)
                bar.update(1)
            bar.close()
        if others:  # the baseline records that belong to the returned rounds
            rounds = {round_of(r) for j in units for r in records[j]}
            records[0] = [r for r in records[0] if round_of(r) in rounds]
        else:  # a baseline run on its own: one record per (prompt, repeat), though its file holds paired ones too
            records[0] = one_per_prompt(records[0])
        return records

    def round(self, entries, members: list[int], example: Example, index: int, repeat: int,
              reference) -> dict[int, dict]:
        """Time ``members`` back to back on one (example, repeat), in an order rotated by prompt and repeat (so a
        prompt's order changes from repeat to repeat); then score, check, label and write their records (the
        baseline's first). Nothing but the timed generations happens between the members' timings."""
        shift = (index + repeat + self.order_offset) % len(members)
        order = members[shift:] + members[:shift]
        measured = {j: self.measure(entries[j].method, entries[j].spec, example, index, repeat) for j in order}
        for j in order:  # outside every timed region, after the round's last clock stopped
            self.score(example, measured[j].record)
        round_id = uuid.uuid4().hex[:12] if len(members) > 1 else None
        for position, j in enumerate(order):
            measured[j].record["pairing"] = {"mode": "interleaved" if round_id else "separate", "round": round_id,
                                             "session": SESSION, "position": position, "size": len(order)}
        baseline = measured[0] if len(members) > 1 else None
        for j in members:
            if j == 0 and baseline is not None:
                continue
            against = baseline.record if baseline else first_repeat(reference or [], example.id)
            same_model = entries[j].method.pair is self.pair  # (``make bench --fp32``: another dtype, no claim)
            if self.lossless is not None and against is not None and same_model:
                measured[j].record["lossless"] = self.check(measured[j], against)
        out = {}
        for j in sorted(members):  # the baseline (0) first: a method record never points at a missing round
            record = measured[j].record
            if j == 0 and len(members) > 1:
                with entries[0].spec.store.lock():  # shared with other methods' jobs: held for this append only
                    entries[0].spec.store.append(record)
            else:
                entries[j].spec.store.append(record)
            if self.tracker is not None and (j > 0 or len(entries) == 1):
                self.tracker.log_record(record)
            out[j] = record
        return out

    def check(self, ours: Measurement, baseline: dict) -> dict:
        return classify_record(self.lossless, ours.prompts, ours.record, baseline)

    def tune(self, method: DecodingMethod, previous: list[dict], example: Example) -> None:
        """A proposal length of ``auto`` (autotune.py), untimed, on the warm-up prompt: chosen once per run (a
        resumed run takes the length its records were measured with)."""
        if not method.tunes_length or getattr(method, "tuned", None):
            return
        earlier = next((r["tuned"] for r in previous if r.get("tuned")), None)
        if earlier is None:
            from .autotune import tune_length

            prompt_ids = self.encode([{"role": "user", "content": example.prompt}], len(example.turns) > 1)
            earlier = tune_length(method, method.pair, prompt_ids, min(self.max_new_tokens, 128))
        method.set_proposal_length(earlier["chosen"])
        method.tuned = earlier

    def warm_up(self, method: DecodingMethod, example: Example) -> None:
        prompt_ids = self.encode([{"role": "user", "content": example.prompt}], len(example.turns) > 1)
        budget = min(self.warmup_max_new_tokens, self.max_new_tokens)
        for _ in range(self.warmup):
            method.reset(self.seed)
            method.prepare(prompt_ids, budget, self.pair.eos_ids)
            method.generate(prompt_ids, budget, self.pair.eos_ids)

    def longest_sequence(self, examples: list[Example]) -> int:
        """An upper bound on the positions one generation's cache holds: every turn's prompt encoded on its own
        (a conversation's later turns hold the earlier ones, so this over-counts a template's preamble) plus
        the budget of every turn and a chat template's framing of each answer."""
        return max(sum(len(self.pair.encode(text, chat=self.chat)) + self.max_new_tokens + 16 for text in ex.turns)
                   for ex in examples)

    def encode(self, messages: list[dict], conversation: bool) -> list[int]:
        return self.pair.encode(prompt_of(messages, conversation), chat=self.chat)

    def measure(self, method: DecodingMethod, spec: RunSpec, example: Example, index: int, repeat: int) -> Measurement:
        warm = method.carries_state
        state = self.state_before(method, spec, index) if warm else None  # (may replay earlier prompts first)
        method.reset(self.seed + index)
        if warm:
            method.restore_state(state)
        captures = method.pair.captures
        turns, prompts = self.generate_turns(method, example)
        if warm:
            self.states[(id(method), spec.key)].setdefault(index + 1, method.carried_state())
        execution = {**method.pair.execution.as_record(),
                     "captured_while_timed": method.pair.captures[0] - captures[0]}  # 0 unless a cache regrew
        record = build_record(spec, example, index, repeat, self.max_new_tokens, turns, dtype=method.pair.dtype,
                              env={**self.env, "precision": method.pair.precision.as_record(),
                                   "execution": execution},
                              model_info=method.pair.info, config=self.config)
        if getattr(method, "tuned", None):  # the proposal length auto chose, and what it was chosen from
            record["tuned"] = method.tuned
        return Measurement(record, prompts)

    def generate_turns(self, method: DecodingMethod, example: Example) -> tuple[list[dict], list[list[int]]]:
        """Each turn generated (and timed) in turn, its prompt holding the earlier turns' answers."""
        messages, turns, prompts = [], [], []
        for text in example.turns:
            messages.append({"role": "user", "content": text})
            prompts.append(self.encode(messages, len(example.turns) > 1))
            turn = self.measure_turn(method, prompts[-1])
            messages.append({"role": "assistant", "content": turn["output_text"]})
            turns.append(turn)
        return turns, prompts

    def state_before(self, method: DecodingMethod, spec: RunSpec, index: int):
        """Warm start, defined (for a method that ``carries_state``): prompt i starts from the state the measured
        prompts 0..i-1 of the dataset left, in dataset order; never from the warm-up, nor from an earlier repeat
        of prompt i (every repeat starts from the same state), nor from whatever a resumed process measured
        first. The states before each prompt are kept in memory; those this process lacks (its earlier prompts
        were measured by another one) are rebuilt by replaying these prompts, untimed and unrecorded."""
        states = self.states.setdefault((id(method), spec.key), {0: None})
        known = max(i for i in states if i <= index)
        if known < index:
            print(f"[specbench] {spec.method}: rebuilding the warm-start state by replaying prompts "
                  f"{known}..{index - 1} (measured by an earlier process) untimed", file=sys.stderr)
        for i in range(known, index):
            method.reset(self.seed + i)
            method.restore_state(states[i])
            self.generate_turns(method, self.examples[i])
            states[i + 1] = method.carried_state()
        return states[index]

    def score(self, example: Example, record: dict) -> None:
        score_record(self.scorer, example, record)

    def measure_turn(self, method: DecodingMethod, prompt_ids: list[int]) -> dict:
        method.prepare(prompt_ids, self.max_new_tokens, self.pair.eos_ids)  # untimed (oracles only)
        watch = self.stopwatch
        watch.start()
        gen = method.generate(prompt_ids, self.max_new_tokens, self.pair.eos_ids, timeline=watch)
        wall = watch.stop()
        return {
            "prompt_tokens": len(prompt_ids),
            "output_ids": gen.tokens,
            "output_text": self.pair.decode(gen.tokens),
            "new_tokens": len(gen.tokens),
            "wall_s": wall,
            "prefill_s": watch.marks.get("prefill"),
            "target_forwards": gen.target_forwards,
            "draft_forwards": gen.draft_forwards,
            "drafted": gen.drafted,
            "accepted": gen.accepted,
            "accept_lengths": gen.accept_lengths,
            "proposed": gen.proposed,  # per step: the proposal's depth (metrics.acceptance_by_position)
            "accepted_steps": gen.accepted_steps,  # per step: of those, draft tokens accepted and kept
            "forward_sizes": gen.forward_sizes,
            "forward_rows": gen.forward_rows,  # rows of logits per forward (what the lm head cost): costs.py
            "extra": gen.extra,
        }


def prompt_of(messages: list[dict], conversation: bool):
    """What a turn encodes: a single-turn example its prompt text; a multi-turn one the whole conversation so far."""
    return messages if conversation else messages[-1]["content"]


def score_record(scorer, example: Example, record: dict) -> None:
    """The dataset's task score into the record (over its turns' texts); never raises (failures are recorded)."""
    if scorer is not None:
        record["score"] = scorer.score(example, [t["output_text"] for t in record.get("turns", [record])])


def build_record(spec: RunSpec, example: Example, index: int, repeat: int, max_new_tokens: int, turns: list[dict],
                 **measured) -> dict:
    """One record of the schema: identity, the turns combined (and kept when there are several), then what the
    engine says about how it measured (dtype, env, model_info, config; engine=vllm adds ``batch``)."""
    record = {
        "schema": SCHEMA_VERSION,
        "run_key": spec.key,
        "method": spec.method,
        "pair": spec.pair,
        "data": spec.data,
        "prompt_id": example.id,
        "prompt_index": index,
        "repeat": repeat,
        "max_new_tokens": max_new_tokens,
        **combine_turns(turns),
        **measured,
        "timestamp": time.time(),
    }
    if len(turns) > 1:
        record["turns"] = turns
    return record


def classify_record(lossless, prompts: list[list[int]], record: dict, baseline: dict) -> dict:
    """Losslessness of one record against greedy's on the same prompt: the first turn that differs decides;
    ``index`` counts over the concatenated turns (as the record's output_ids). A failure of the check itself
    is recorded as verdict ``error`` (counted as unclassified), never lost with the round's timings.
    ``lossless``: anything with ``classify(prompt, greedy_ids, method_ids)`` (lossless.LosslessCheck, or an
    engine's own)."""
    theirs = [t["output_ids"] for t in baseline.get("turns", [baseline])]
    mine = [t["output_ids"] for t in record.get("turns", [record])]
    reference = {"against": round_of(baseline), "against_repeat": baseline.get("repeat")}
    offset = 0
    try:
        for turn, (prompt, a, b) in enumerate(zip(prompts, theirs, mine)):
            result = lossless.classify(prompt, a, b)
            if result["verdict"] != "identical":
                result["index"] = result["index"] + offset
                return {**result, **reference, **({"turn": turn} if len(mine) > 1 else {})}
            offset += len(b)
    except Exception as exc:  # noqa: BLE001 — the timings of the round are kept whatever happens here
        return {"verdict": "error", "reason": f"{type(exc).__name__}: {exc}", **reference}
    return {"verdict": "identical", **reference}


SUMMED = ("new_tokens", "wall_s", "prefill_s", "target_forwards", "draft_forwards", "drafted", "accepted")


def combine_turns(turns: list[dict]) -> dict:
    """One record's top-level fields from its turns: counts and times summed, ids and steps concatenated.

    ``prompt_tokens`` is the first turn's; ``output_text`` joins the turns' texts with a blank line.
    """
    if len(turns) == 1:
        return dict(turns[0])
    combined = {key: sum(t[key] for t in turns) if all(t[key] is not None for t in turns) else None for key in SUMMED}
    combined.update(
        prompt_tokens=turns[0]["prompt_tokens"],
        output_ids=[i for t in turns for i in t["output_ids"]],
        output_text="\n\n".join(t["output_text"] for t in turns),
        accept_lengths=[n for t in turns for n in t["accept_lengths"]],
        proposed=[n for t in turns for n in t.get("proposed") or []],
        accepted_steps=[n for t in turns for n in t.get("accepted_steps") or []],
        forward_sizes={model: [k for t in turns for k in t["forward_sizes"].get(model, [])]
                       for model in ("target", "draft")},
        forward_rows={model: [r for t in turns for r in t["forward_rows"][model]] for model in ("target", "draft")
                      if all(model in (t.get("forward_rows") or {}) for t in turns)},
        extra={},
    )
    return combined
