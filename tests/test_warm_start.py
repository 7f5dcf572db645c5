"""Warm start, defined: a method that carries state from prompt to prompt (Ouroboros†/lookahead's warm pool,
suffix decoding's global tree, dynHeur's persistent SL) starts prompt i from the state measured prompts 0..i-1
left, in dataset order: not from the warm-up prompt, not from an earlier repeat of prompt i, and a resumed run
starts from the same state as an uninterrupted one."""
from pathlib import Path

from specbench.data import Example
from specbench.methods.ouroboros import Ouroboros
from specbench.methods.sl_policies import HeuristicSL
from specbench.methods.speculative import SpeculativeDecoding
from specbench.methods.token_recycling import TokenRecycling
from specbench.methods.swift import Swift
from specbench.methods.suffix import SuffixDecoding
from specbench.engines.loops import LoopBackend
from specbench.run.runner import Entry, Runner, RunSpec

from .test_equivalence import pair_for

TEXTS = ["abcabcabcabd", "the cat sat on the mat, the cat", "abcabcabcabc xyz", "mat cat sat"]
EXAMPLES = [Example(id=f"p{i}", turns=[t]) for i, t in enumerate(TEXTS)]
WARMUP = Example(id="warmup", turns=["zzzz abcabc the cat"])
BUDGET = 12


class Recording:
    """Wraps a method: the carried state each measured generation started from, by prompt text."""

    def __init__(self, method):
        self.method, self.starts = method, []
        original = method.generate

        def generate(prompt_ids, *args, **kwargs):
            self.starts.append((tuple(prompt_ids), method.carried_state()))
            return original(prompt_ids, *args, **kwargs)

        method.generate = generate


def expected_starts(make, pair) -> dict[tuple, object]:
    """The state before each prompt when prompts 0, 1, 2, ... are decoded once each, in order, from a new method."""
    method, starts = make(), {}
    method.restore_state(None)
    for i, example in enumerate(EXAMPLES):
        ids = tuple(pair.encode(example.prompt, chat=None))
        method.reset(i)
        starts[ids] = method.carried_state()
        method.generate(list(ids), BUDGET, pair.eos_ids)
    return starts


def run(make, pair, records: Path, examples, repeats=1) -> Recording:
    recording = Recording(make())
    runner = Runner(LoopBackend(pair, BUDGET, warmup=1), repeats=repeats, progress=False)
    spec = RunSpec(key="k", method="warm", pair=pair.name, data="d", records_dir=records)
    runner.run([Entry(recording.method, spec)], examples, WARMUP)
    return recording


def makers(pair):
    return {
        "ouroboros_warm": lambda: Ouroboros(pair, gamma=4, window=4, beta=3, top_k=2, warm_start=True),
        "dyn_heur": lambda: SpeculativeDecoding(pair, "dyn_heur", policy=HeuristicSL(initial=2, persistent=True)),
        "token_recycling": lambda: TokenRecycling(pair, tree=[2, 2, 1], warm_start=True),
        "swift": lambda: Swift(pair, gamma=3, context_window=2, bayes_interval=2),  # the optimisation carries
        "suffix": lambda: SuffixDecoding(pair, max_cached_requests=3),  # 4 prompts: the cap evicts too
    }


def test_every_prompt_and_repeat_starts_from_the_earlier_prompts_state(tmp_path):
    pair = pair_for("llama", 0.05)
    for name, make in makers(pair).items():
        want = expected_starts(make, pair)
        recording = run(make, pair, tmp_path / name, EXAMPLES, repeats=2)
        # the warm-up generation is the first call; every measured one starts where expected
        measured = recording.starts[1:]
        assert len(measured) == 2 * len(EXAMPLES)
        for ids, state in measured:
            assert state == want[ids], name
        assert measured[0][1] in (None, {}, 2, ())  # prompt 0: a new method's state, whatever the warm-up learnt


def test_a_resumed_run_starts_from_the_same_state(tmp_path):
    pair = pair_for("llama", 0.05)
    for name, make in makers(pair).items():
        want = expected_starts(make, pair)
        run(make, pair, tmp_path / name, EXAMPLES[:2])  # "killed" after two prompts
        resumed = run(make, pair, tmp_path / name, EXAMPLES)  # another process: only p2, p3 are measured
        measured = [start for start in resumed.starts if start[0] in want]
        last_two = [tuple(pair.encode(e.prompt, chat=None)) for e in EXAMPLES[2:]]
        assert [ids for ids, _ in measured[-2:]] == last_two
        for ids, state in measured[-2:]:
            assert state == want[ids], name
