"""The record schema (records/schema.py): a record written is read back as the same type, and lines of earlier versions
load (missing fields take their defaults, unknown ones are kept and written back unchanged)."""
import json

from specbench.data import Example
from specbench.records.store import RecordStore
from specbench.run.runner import RunSpec
from specbench.records.schema import RunRecord, TurnRecord, build_record


def turn(ids, wall, steps):
    return TurnRecord(prompt_tokens=3, output_ids=ids, output_text="x" * len(ids), new_tokens=len(ids), wall_s=wall,
                      prefill_s=wall / 4, target_forwards=len(steps), draft_forwards=len(steps), drafted=4,
                      accepted=sum(steps) - len(steps), accept_lengths=steps, proposed=[0] + [2] * (len(steps) - 1),
                      accepted_steps=[n - 1 for n in steps], forward_sizes={"target": [3, 3], "draft": [1, 1]},
                      forward_rows={"target": [1, 3], "draft": [1, 1]}, extra={"sl": [2]})


def test_a_record_round_trips_through_the_store(tmp_path):
    spec = RunSpec(key="k", method="speculative", pair="p", data="d", records_dir=tmp_path)
    record = build_record(spec, Example(id="e1", turns=["hi"]), 0, 0, 16, [turn([5, 6, 7], 0.5, [1, 2])],
                          dtype="float32", env={"threads": 2}, model_info={}, config={"method": {}})
    record.pairing = {"mode": "separate", "round": None}
    spec.store.append(record.to_dict())
    (loaded,) = spec.records_for([Example(id="e1", turns=["hi"])])
    assert loaded == record and isinstance(loaded, RunRecord)
    line = json.loads(spec.store.path.read_text())
    assert "turns" not in line and "batch" not in line and "lossless" not in line  # unset optional fields
    assert line["schema"] == 2 and line["accept_lengths"] == [1, 2]


def test_a_conversation_keeps_its_turns_and_sums_them():
    spec = RunSpec(key="k", method="m", pair="p", data="d", records_dir=None)
    a, b = turn([1, 2], 1.0, [1, 1]), turn([3, 4, 5], 2.0, [1, 2])
    record = build_record(spec, Example(id="c", turns=["q1", "q2"]), 3, 1, 8, [a, b])
    assert record.output_ids == [1, 2, 3, 4, 5] and record.new_tokens == 5 and record.wall_s == 3.0
    assert record.accept_lengths == [1, 1, 1, 2] and record.forward_rows["target"] == [1, 3, 1, 3]
    assert record.turn_list == [a, b]
    back = RunRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert back.turns == [a, b] and back == record


def test_an_older_line_loads_and_keeps_what_this_version_does_not_know(tmp_path):
    old = {"run_key": "k", "prompt_id": "p", "repeat": 0, "new_tokens": 2, "wall_s": 1.0, "output_ids": [1, 2],
           "accept_lengths": [1, 1], "target_forwards": 2, "legacy_field": {"kept": True}}  # no proposed, pairing ...
    store = RecordStore(tmp_path / "r.jsonl")
    store.append(old)
    record = RunRecord.from_dict(store.load()[0])
    assert record.proposed == [] and record.pairing is None and record.round is None
    assert record.other == {"legacy_field": {"kept": True}}
    assert record.to_dict()["legacy_field"] == {"kept": True}


def test_a_line_of_valid_json_that_is_no_record_is_skipped_like_a_corrupted_one(tmp_path):
    """A hand-edited or damaged file: ``null``, a list, a record whose pairing is not an object. Each is skipped
    (its prompt is redone), never an AttributeError on every later run and report."""
    good = {"run_key": "k", "prompt_id": "p", "repeat": 0, "new_tokens": 2, "wall_s": 1.0, "output_ids": [1, 2]}
    path = tmp_path / "r.jsonl"
    bad = ["null", "[1, 2]", '"text"', json.dumps({**good, "prompt_id": "q", "pairing": "oops"}), "{not json",
           json.dumps({**good, "prompt_id": ["q"]}), json.dumps({**good, "pairing": {"round": {"id": 1}}})]
    path.write_text("\n".join([*bad, json.dumps(good)]) + "\n")
    assert RecordStore(path).load() == [good]
