"""The runner: warm-up, timing, one record per (prompt, repeat) appended as it finishes, resume.

Everything outside ``method.generate`` (tokenisation, decoding to text, scoring, writing) happens
outside the timed region. Methods are reset before every prompt (cold start), not between the turns
of one conversation. A multi-turn example (MT-Bench) generates turn by turn, each turn's prompt
holding the earlier answers; its record sums time and counters over turns and keeps each turn in
``turns``. The dataset's scorer fills the record's ``score`` before the record is written.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .data import Example
from .environment import environment
from .methods.base import DecodingMethod
from .models import ModelPair
from .records import SCHEMA_VERSION, RecordStore, slug
from .timing import Stopwatch


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
        return RecordStore(self.records_dir / slug(self.pair) / slug(self.data) / f"{slug(self.method)}-{self.key}.jsonl")

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


class Runner:
    def __init__(self, pair: ModelPair, max_new_tokens: int, warmup: int = 1, warmup_max_new_tokens: int = 16,
                 repeats: int = 1, seed: int = 0, progress: bool = True, config: dict | None = None,
                 tracker=None, scorer=None, chat: bool | None = None):
        self.pair, self.max_new_tokens = pair, max_new_tokens
        self.scorer, self.chat = scorer, chat
        self.warmup, self.warmup_max_new_tokens = warmup, warmup_max_new_tokens
        self.repeats, self.seed, self.progress = repeats, seed, progress
        self.config = config or {}
        self.tracker = tracker
        self.stopwatch = Stopwatch(pair.device)
        self.env = environment(pair.device)

    def run(self, method: DecodingMethod, spec: RunSpec, examples: list[Example], warmup_example: Example) -> list[dict]:
        """Generate for every (example, repeat) not yet recorded; return this selection's records.

        Holds the run's writer lock throughout, so a parallel job needing the same run waits, then resumes.
        """
        with spec.store.lock():
            return self._run(method, spec, examples, warmup_example)

    def _run(self, method: DecodingMethod, spec: RunSpec, examples: list[Example], warmup_example: Example) -> list[dict]:
        store = spec.store
        previous = spec.records_for(examples)
        done = {(r["prompt_id"], r["repeat"]) for r in previous}
        todo = [(rep, i, ex) for rep in range(self.repeats) for i, ex in enumerate(examples) if (ex.id, rep) not in done]
        if previous:
            print(f"[specbench] {spec.method}: resuming, {len(previous)} record(s) kept, {len(todo)} to run "
                  f"({store.path})", file=sys.stderr)
        if not todo:
            return previous
        self.warm_up(method, warmup_example)
        records = list(previous)
        bar = tqdm(total=len(todo), desc=spec.method, unit="prompt", disable=not self.progress, file=sys.stderr)
        tokens_total, time_total = 0, 0.0
        for repeat, index, example in todo:
            record = self.measure(method, spec, example, index, repeat)
            store.append(record)
            if self.tracker is not None:
                self.tracker.log_record(record)
            records.append(record)
            tokens_total += record["new_tokens"]
            time_total += record["wall_s"]
            bar.set_postfix(tok_s=f"{tokens_total / time_total:.2f}", last=f"{record['new_tokens'] / record['wall_s']:.2f}")
            bar.update(1)
        bar.close()
        return records

    def warm_up(self, method: DecodingMethod, example: Example) -> None:
        prompt_ids = self.encode([{"role": "user", "content": example.prompt}], len(example.turns) > 1)
        budget = min(self.warmup_max_new_tokens, self.max_new_tokens)
        for _ in range(self.warmup):
            method.reset(self.seed)
            method.prepare(prompt_ids, budget, self.pair.eos_ids)
            method.generate(prompt_ids, budget, self.pair.eos_ids)

    def encode(self, messages: list[dict], conversation: bool) -> list[int]:
        """A single-turn example encodes its prompt text; a multi-turn one the whole conversation so far."""
        return self.pair.encode(messages if conversation else messages[-1]["content"], chat=self.chat)

    def measure(self, method: DecodingMethod, spec: RunSpec, example: Example, index: int, repeat: int) -> dict:
        method.reset(self.seed + index)
        messages, turns = [], []
        for text in example.turns:
            messages.append({"role": "user", "content": text})
            turn = self.measure_turn(method, self.encode(messages, len(example.turns) > 1))
            messages.append({"role": "assistant", "content": turn["output_text"]})
            turns.append(turn)
        record = {
            "schema": SCHEMA_VERSION,
            "run_key": spec.key,
            "method": spec.method,
            "pair": spec.pair,
            "data": spec.data,
            "prompt_id": example.id,
            "prompt_index": index,
            "repeat": repeat,
            "max_new_tokens": self.max_new_tokens,
            **combine_turns(turns),
            "dtype": self.pair.dtype,
            "timestamp": time.time(),
            "env": self.env,
            "model_info": self.pair.info,
            "config": self.config,
        }
        if len(turns) > 1:
            record["turns"] = turns
        if self.scorer is not None:  # outside the timed region; never raises (failures are recorded)
            record["score"] = self.scorer.score(example, [t["output_text"] for t in turns])
        return record

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
            "extra": gen.extra,
        }


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
        extra={},
    )
    return combined
