"""The bound prices each forward at the context it ran after: every model records the positions cached before each
forward (``forward_contexts``), and a run whose forwards reach far past its first prompt gets a second cost table
after that many tokens (costs.run_bound's ``long_context``), forwards priced linearly between the two. Before, every
forward of a 1300-token summarization prompt was priced with T(k) measured after a 47-token one."""
from __future__ import annotations

import pytest

from specbench.analysis import costs
from specbench.methods.greedy import Greedy
from specbench.methods.speculative import SpeculativeDecoding
from specbench.methods.token_recycling import TokenRecycling
from specbench.records.schema import RunRecord, TurnRecord, combine_turns

from .test_feature_heads import tiny_pair

NEAR = costs.ForwardCosts({1: 10.0, 8: 20.0}, row_ms=1.0)  # after the run's 100-token prompt
FAR = costs.ForwardCosts({1: 20.0, 8: 30.0}, row_ms=1.0)   # after 1100 tokens


def test_a_forward_is_priced_between_the_tables_measured_around_its_context():
    both = costs.ContextCosts([NEAR, FAR], [100, 1100])
    assert both.at(1, 1, 600) == pytest.approx(15.0) and both.at(8, 1, 350) == pytest.approx(22.5)
    assert both.at(1, 1, 0) == 10.0 and both.at(1, 1, 5000) == 20.0  # the nearer table outside them
    assert both.at(8, None, None) == NEAR.at(8)  # a context not recorded: the table after the run's prompt
    run = RunRecord(forward_sizes={"target": [8, 1, 1]}, forward_rows={"target": [1, 1, 1]},
                    forward_contexts={"target": [0, 600, 1100]})
    assert costs.predicted_ms([run], both, None) == pytest.approx(20.0 + 15.0 + 20.0)
    old = RunRecord(forward_sizes={"target": [8, 1, 1]}, forward_rows={"target": [1, 1, 1]})  # before contexts
    assert costs.predicted_ms([old], both, None) == costs.predicted_ms([old], NEAR, None) == 40.0


def test_a_summary_stores_both_tables_and_the_report_prices_with_them():
    stored = {"target_ms": {"1": 10.0, "8": 20.0}, "target_row_ms": 1.0, "draft_ms": None, "prompt_tokens": 100,
              "long_context": {"prompt_tokens": 1100, "target_ms": {"1": 20.0, "8": 30.0}, "target_row_ms": 1.0}}
    target = costs.stored_costs(stored, "target")
    assert isinstance(target, costs.ContextCosts) and target.at(1, 1, 600) == pytest.approx(15.0)
    assert costs.stored_costs(stored, "draft") is None
    assert costs.stored_costs({k: v for k, v in stored.items() if k != "long_context"}, "target") == NEAR
    greedy = RunRecord(prompt_id="p", new_tokens=2, forward_sizes={"target": [1, 1]},
                       forward_contexts={"target": [1100, 1101]})
    method = RunRecord(prompt_id="p", new_tokens=2, forward_sizes={"target": [8]}, forward_rows={"target": [8]},
                       forward_contexts={"target": [1100]})
    priced = costs.repriced(stored, [method], [greedy], speedup_total=1.0)
    assert priced["bound"] == pytest.approx(40.0 / 37.0) and priced["long_context"] == stored["long_context"]


def test_the_long_table_is_measured_where_the_run_went_far_past_its_prompt():
    def reaching(*contexts):
        return RunRecord(forward_sizes={"target": [19] * len(contexts)}, forward_contexts={"target": list(contexts)})

    assert costs.long_context([reaching(0, 1300), reaching(700)], 47) == 1300 + 19 - costs.MEASURED_UP_TO
    assert costs.long_context([reaching(0, 200)], 47) is None  # within MIN_CONTEXT_GAP of the prompt
    assert costs.long_context([reaching(600)], 400) is None  # under twice the prompt
    prefill = RunRecord(forward_sizes={"target": [1300, 1]}, forward_contexts={"target": [0, 1300]})
    assert costs.long_context([prefill], 47) == 1301 - costs.MEASURED_UP_TO  # a prefill's reach is not a decode's
    assert costs.long_context([RunRecord(forward_sizes={"target": [1, 1]})], 47) is None  # no contexts recorded


def chain_contexts(prompt: int, steps: list[int]) -> list[int]:
    """Where a chain verifier's forwards run: the prompt's at 0, then step i after the prompt and every token
    emitted before it but the last (which that step feeds)."""
    return [0] + [prompt + sum(steps[:i]) - 1 for i in range(1, len(steps))]


@pytest.mark.parametrize("name", ["greedy", "speculative", "token_recycling"])
def test_every_forward_records_the_positions_cached_before_it(name):
    pair = tiny_pair()
    prompt = [3, 17, 29, 5, 41, 8, 12, 3, 17, 29]
    method = {"greedy": lambda: Greedy(pair, "greedy"),
              "speculative": lambda: SpeculativeDecoding(pair, "speculative", gamma=3),
              "token_recycling": lambda: TokenRecycling(pair, tree=[3, 2, 1])}[name]()
    gen = method.generate(prompt, 24, set())
    target = gen.forward_contexts["target"]
    assert len(target) == len(gen.forward_sizes["target"]) == gen.target_forwards
    assert target == chain_contexts(len(prompt), gen.accept_lengths)
    if name == "speculative":  # the draft model's cache: its prompt at 0, each block after what it holds
        assert gen.forward_contexts["draft"][0] == 0 and len(gen.forward_contexts["draft"]) == gen.draft_forwards
    turns = [TurnRecord(forward_sizes=gen.forward_sizes, forward_contexts=gen.forward_contexts)] * 2
    assert combine_turns(turns).forward_contexts["target"] == target * 2
    line = RunRecord(prompt_id="p", forward_sizes=gen.forward_sizes, forward_contexts=gen.forward_contexts)
    assert RunRecord.from_dict(line.to_dict()).forward_contexts == gen.forward_contexts
    assert "forward_contexts" not in RunRecord(prompt_id="p").to_dict()  # an engine that records none writes none


def test_run_bound_measures_a_second_table_after_the_longest_context_and_prices_with_both(monkeypatch):
    monkeypatch.setattr(costs, "MIN_CONTEXT_GAP", 16)
    pair = tiny_pair()
    short, long = [3, 17, 29, 5, 41, 8, 12, 3, 17, 29], [3, 17, 29, 5, 41, 8, 12, 3] * 25  # 10 and 200 tokens

    def record(method, prompt):
        gen = method.generate(prompt, 12, set())
        return RunRecord(prompt_id=str(len(prompt)), new_tokens=len(gen.tokens), forward_sizes=gen.forward_sizes,
                         forward_rows=gen.forward_rows, forward_contexts=gen.forward_contexts)

    spec = SpeculativeDecoding(pair, "speculative", gamma=3)
    run = [record(spec, short), record(spec, long)]
    base = [record(Greedy(pair, "greedy"), short), record(Greedy(pair, "greedy"), long)]
    priced = costs.run_bound(pair, run, base, short, repeats=1)
    far = priced["long_context"]
    reach = max(c + k for r in run + base for role in ("target", "draft")
                for k, c in zip(r.forward_sizes.get(role, []), r.forward_contexts.get(role, []))
                if k <= costs.MEASURED_UP_TO)
    assert far["prompt_tokens"] == reach - costs.MEASURED_UP_TO > 2 * len(short)
    assert set(far["target_ms"]) == set(priced["target_ms"]) and set(far["draft_ms"]) == set(priced["draft_ms"])
    assert priced["bound"] == pytest.approx(costs.bound(run, base, *(costs.stored_costs(priced, role)
                                                                      for role in ("target", "draft", "head"))))
    assert "long_context" not in costs.run_bound(pair, run[:1], base[:1], short, repeats=1)  # never went far
    # T(k)/T(1) is of the largest verify block, not of a first forward that reads the prompt with a draft (13 here)
    assert priced["verify_ratio"]["k"] == max(k for r in run for k in r.forward_sizes["target"][1:]) == 4


def test_the_headline_says_where_the_tables_were_measured():
    from specbench.analysis.console import render_headline

    bound = {"bound": 0.8, "efficiency": 0.95, "prompt_tokens": 47, "verify_ratio": {"k": 19, "ratio": 6.1}}
    assert "priced at its context" not in render_headline("m", {"speedup": 0.76, "bound": bound})
    far = render_headline("m", {"speedup": 0.76, "bound": {**bound, "long_context": {"prompt_tokens": 1237}}})
    assert "between tables after 47 and 1237 tokens" in far
