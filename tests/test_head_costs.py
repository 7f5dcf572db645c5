"""A draft head's forwards (EAGLE's layer, Medusa's and Hydra's heads) are recorded under their own role and priced
by the run's bound (costs.run_bound) with the head's own measured costs: before, a method drafting with a head and
no draft model had its drafting priced at nothing, so its bound was too high and its efficiency too low."""
from __future__ import annotations

import pytest

from specbench.analysis import costs
from specbench.methods.feature_head import FeatureHeadMethod
from specbench.methods.greedy import Greedy
from specbench.methods.medusa import MedusaMethod
from specbench.methods.sam_decoding import SamDecoding
from specbench.records.schema import RunRecord, TurnRecord, combine_turns

from .test_feature_heads import random_head, tiny_pair
from .test_medusa import random_heads

PROMPT = [3, 17, 29, 5, 41, 8, 12, 3, 17, 29]


def method_of(kind: str, directory):
    pair = tiny_pair()
    if kind in ("medusa", "hydra"):
        return MedusaMethod(pair, kind, kind=kind, head=random_heads(pair, kind, directory), top_k=3, depth=3,
                            max_nodes=6)
    head = random_head(pair, "eagle", directory)
    if kind == "eagle1":
        return FeatureHeadMethod(pair, "eagle1", head=head, tree=[[0], [1], [0, 0], [0, 0, 0]])
    eagle = dict(_target_="specbench.methods.feature_head.FeatureHeadMethod", name="eagle", head=head, top_k=3,
                 depth=3, max_nodes=6)
    if kind == "sam_eagle":  # min_match_length beyond any match here: every step is the head's
        return SamDecoding(pair, "sam_eagle", min_match_length=50, fallback=eagle)
    return FeatureHeadMethod(pair, "eagle", head=head, top_k=3, depth=3, max_nodes=6)


def record(gen) -> RunRecord:
    return RunRecord(prompt_id="p", repeat=0, forward_sizes=gen.forward_sizes, forward_rows=gen.forward_rows)


@pytest.mark.parametrize("kind", ["eagle", "eagle1", "sam_eagle", "medusa", "hydra"])
def test_head_forwards_are_recorded_and_priced_by_the_bound(kind, tmp_path):
    method = method_of(kind, tmp_path / "head")
    gen = method.generate(PROMPT, 12, set())
    head_forwards = gen.extra.get("head_forwards", gen.extra.get("fallback", {}).get("head_forwards"))
    fed = gen.forward_sizes["head"]
    assert len(fed) == head_forwards > 0 and gen.forward_rows["head"] == fed and "draft" not in gen.forward_sizes
    assert gen.draft_forwards == 0  # no draft model ran
    greedy = Greedy(tiny_pair(), "greedy").generate(PROMPT, 12, set())
    assert "head" not in greedy.forward_sizes
    run, base = [record(gen)], [record(greedy)]
    priced = costs.run_bound(tiny_pair(), run, base, PROMPT, repeats=1, head=method.head_cost_probe())
    assert set(fed) | {1} <= set(priced["head_ms"]) and all(ms > 0 for ms in priced["head_ms"].values())
    assert "head_ms" not in costs.run_bound(tiny_pair(), run, base, PROMPT, repeats=1)  # no probe: not measured

    target, head = costs.stored_costs(priced, "target"), costs.stored_costs(priced, "head")
    assert priced["bound"] == pytest.approx(costs.bound(run, base, target, None, head))
    free = costs.bound(run, base, target, None)  # what the bound was: the head's forwards cost nothing
    head_ms = costs.predicted_ms(run, None, None, head)
    assert head_ms > 0 and 1 / priced["bound"] == pytest.approx(1 / free + head_ms / costs.predicted_ms(base, target,
                                                                                                          None))


def test_a_methods_without_a_head_records_and_probes_none(tmp_path):
    method = SamDecoding(tiny_pair(), "sam_decoding")
    assert method.head_cost_probe() is None
    assert "head" not in method.generate(PROMPT, 8, set()).forward_sizes


def test_turns_keep_their_head_forwards(tmp_path):
    turns = [TurnRecord(forward_sizes={"target": [5, 3], "head": [4, 1]}, forward_rows={"target": [1, 3],
                                                                                         "head": [4, 1]}),
             TurnRecord(forward_sizes={"target": [2], "head": [2]}, forward_rows={"target": [1], "head": [2]})]
    merged = combine_turns(turns)
    assert merged.forward_sizes == {"target": [5, 3, 2], "draft": [], "head": [4, 1, 2]}
    assert merged.forward_rows == {"target": [1, 3, 1], "head": [4, 1, 2]}
    plain = combine_turns([TurnRecord(forward_sizes={"target": [5]}), TurnRecord(forward_sizes={"target": [1]})])
    assert plain.forward_sizes == {"target": [5, 1], "draft": []}  # as before: no head role where none ran
