"""engine=hf's backend for the runner: our decoding loops (specbench/methods/), one prompt a round.

Everything outside ``method.generate`` (tokenisation, decoding to text) happens outside the timed region. Methods
are reset before every prompt (cold start), not between the turns of one conversation. A multi-turn example
(MT-Bench) generates turn by turn, each turn's prompt holding the earlier answers; its record sums time and
counters over turns and keeps each turn in ``turns``.

Warm start (``LoopBackend.state_before``): a method that carries state from prompt to prompt starts prompt i from
the state measured prompts 0..i-1 left, in dataset order, whatever the warm-up, the repeats or a resume did.
"""
from __future__ import annotations

import sys

import torch

from ..analysis.lossless import LosslessCheck
from ..data import Example
from ..decoding.evidence import rounded
from ..environment import environment
from ..methods.base import DecodingMethod
from ..models import ModelPair
from ..records.schema import TurnRecord, build_record
from ..run.runner import Entry, Measurement, RunSpec, prompt_of
from ..timing import Stopwatch


class LoopBackend:
    batch_size = 1
    batched = False

    def __init__(self, pair: ModelPair, max_new_tokens: int, warmup: int = 1, warmup_max_new_tokens: int = 16,
                 seed: int = 0, config: dict | None = None, chat: bool | None = None, threads: int | None = None,
                 exact: bool = False):
        """exact: greedy decoding (temperature 0), whose outputs are checked against the baseline's (``lossless``);
        sampled outputs are compared by distribution (the tests), not token by token."""
        self.pair, self.max_new_tokens, self.chat, self.exact = pair, max_new_tokens, chat, exact
        self.warmup, self.warmup_max_new_tokens, self.seed = warmup, warmup_max_new_tokens, seed
        self.config = config or {}
        self.stopwatch = Stopwatch(pair.device)
        self.examples: list[Example] = []  # the dataset being run, in order (warm-start replays read it)
        self.states: dict[tuple[int, str], dict[int, object]] = {}  # (method, run) -> {i: state before prompt i}
        self.env = {**environment(pair.device), "threads": threads}
        self.threads = threads
        self.checks: dict[int, LosslessCheck] = {}  # id(pair) -> its check (its own measured noise)

    # --- the runner's interface

    def prepare(self, entries: list[Entry], needed: list[int], examples: list[Example], rounds,
                warmup_example: Example, previous) -> None:
        """Size every static cache / llama.cpp context for the longest sequence ahead (no regrowth while timed);
        then tune (``auto`` lengths) and warm up every entry that will be timed."""
        self.examples = examples
        static = {id(e.method.pair): e.method.pair for e in entries if e.method.pair.sized_to_the_run}
        if static:
            longest = self.longest_sequence([warmup_example] + [ex for prompts in rounds for _, ex in prompts])
            for pair in static.values():
                pair.reserve(longest)
        for j in needed:
            self.tune(entries[j].method, previous[j], warmup_example)
            self.warm_up(entries[j].method, warmup_example)

    def generate(self, entry: Entry, prompts, repeat: int) -> list[Measurement]:
        return [self.measure(entry.method, entry.spec, example, index, repeat) for index, example in prompts]

    def lossless(self, entry: Entry, baseline: Entry) -> LosslessCheck | None:
        """At temperature 0, methods decoding on their baseline's pair, with that pair's check (its own noise);
        another pair (make bench's float32 greedy, another execution mode or backend) makes no claim."""
        pair = entry.method.pair
        if not self.exact or pair is not baseline.method.pair:
            return None
        return self.checks.setdefault(id(pair), LosslessCheck(pair, self.threads or torch.get_num_threads()))

    # --- untimed preparation

    def tune(self, method: DecodingMethod, previous: list[dict], example: Example) -> None:
        """A proposal length of ``auto`` (analysis/autotune.py), untimed, on the warm-up prompt: chosen once per run (a
        resumed run takes the length its records were measured with)."""
        if not method.tunes_length or getattr(method, "tuned", None):
            return
        earlier = next((r.tuned for r in previous if r.tuned), None)
        if earlier is None:
            from ..analysis.autotune import tune_length

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

    # --- one prompt

    def measure(self, method: DecodingMethod, spec: RunSpec, example: Example, index: int, repeat: int) -> Measurement:
        warm = method.carries_state
        state = self.state_before(method, spec, index) if warm else None  # (may replay earlier prompts first)
        method.reset(self.seed + index)
        if warm:
            method.restore_state(state)
        captures, growths = method.pair.captures, method.pair.growths
        turns, prompts = self.generate_turns(method, example)
        if warm:
            self.states[(id(method), spec.key)].setdefault(index + 1, method.carried_state())
        execution = {**method.pair.execution.as_record(),  # both 0 unless a cache grew while timed (a bug of ours)
                     "captured_while_timed": method.pair.captures[0] - captures[0],
                     "grown_while_timed": method.pair.growths - growths}
        record = build_record(spec, example, index, repeat, self.max_new_tokens, turns, dtype=method.pair.dtype,
                              env={**self.env, "precision": method.pair.precision.as_record(),
                                   "execution": execution},
                              model_info=method.pair.info, config=self.config)
        if getattr(method, "tuned", None):  # the proposal length auto chose, and what it was chosen from
            record.tuned = method.tuned
        return Measurement(record, prompts)

    def generate_turns(self, method: DecodingMethod, example: Example) -> tuple[list[TurnRecord], list[list[int]]]:
        """Each turn generated (and timed) in turn, its prompt holding the earlier turns' answers."""
        messages, turns, prompts = [], [], []
        for text in example.turns:
            messages.append({"role": "user", "content": text})
            prompts.append(self.encode(messages, len(example.turns) > 1))
            turn = self.measure_turn(method, prompts[-1])
            messages.append({"role": "assistant", "content": turn.output_text})
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

    def measure_turn(self, method: DecodingMethod, prompt_ids: list[int]) -> TurnRecord:
        method.prepare(prompt_ids, self.max_new_tokens, self.pair.eos_ids)  # untimed (oracles only)
        watch = self.stopwatch
        watch.start()
        gen = method.generate(prompt_ids, self.max_new_tokens, self.pair.eos_ids, timeline=watch)
        wall = watch.stop()
        return TurnRecord(
            **gen.counters(),  # as the method counted them (forwards, drafted/accepted, per step, per forward)
            prompt_tokens=len(prompt_ids),
            output_ids=gen.tokens,
            output_text=self.pair.decode(gen.tokens),
            new_tokens=len(gen.tokens),
            wall_s=wall,
            prefill_s=watch.marks.get("prefill"),
            # the clock at each step's end, where the method's steps are the record's (not hf_assisted's generate())
            step_ms=watch.steps_ms if len(watch.steps_ms) == len(gen.accept_lengths) else [],
            margins=rounded(e.margin for e in gen.evidence),  # each token's margin under its own forward (T = 0)
        )
