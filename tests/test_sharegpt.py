"""ShareGPT training prompts for draft heads: a file cut short mid-element, the 13-word contamination rule,
deduplication and a seeded sample, on files the test writes."""
import json

import pytest

from specbench.errors import ConfigError
from specbench.data.sharegpt import Contamination, conversations, training_conversations


def training_prompts(*args, **kwargs) -> list[str]:
    return [prompt for prompt, _ in training_conversations(*args, **kwargs)]

EVAL = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many?"


def conversation(i, human, gpt="ok"):
    return {"id": f"c{i}", "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]}


def write_cut(path, items, cut_text='  {\n    "id": "cut", "conversations": [{"from": "human", "value": "half a'):
    whole = ",\n".join(json.dumps(item, indent=2) for item in items)
    path.write_text("[\n" + whole + ",\n" + cut_text)
    return path


def test_conversations_reads_every_complete_element_of_a_cut_file(tmp_path):
    items = [conversation(i, f"question number {i} about python lists") for i in range(5)]
    assert [c["id"] for c in conversations(write_cut(tmp_path / "s.json", items))] == [f"c{i}" for i in range(5)]
    (tmp_path / "whole.json").write_text(json.dumps(items))
    assert len(list(conversations(tmp_path / "whole.json"))) == 5
    (tmp_path / "bad.json").write_text('{"not": "an array"}')
    with pytest.raises(ConfigError, match="heads.data.path: .*bad.json is not a JSON array"):
        list(conversations(tmp_path / "bad.json"))


def test_contamination_drops_prompts_sharing_13_words_with_an_evaluation_prompt():
    clean = Contamination([EVAL, "Write fizzbuzz."])
    # 13 consecutive words of EVAL, re-cased and re-spaced, inside a longer prompt: contaminated
    assert clean.overlaps("Please solve:  natalia SOLD clips to 48 of her friends in april, and then she\nsold it")
    assert not clean.overlaps("Natalia sold clips to 48 of her friends in April and then she sold")  # comma differs
    assert not clean.overlaps("Natalia sold clips to 48 of her friends in April,")  # 10 words only
    assert clean.overlaps("write   FIZZBUZZ.") and not clean.overlaps("Write fizzbuzz in Rust.")


def test_training_prompts_are_clean_unique_and_a_seeded_sample(tmp_path):
    items = [conversation(i, f"Explain topic {i} of distributed systems to a new engineer") for i in range(30)]
    items += [conversation(30, "Explain topic 3 of distributed systems to a new engineer"),  # duplicate of 3
              conversation(31, "Hi"),  # too short
              conversation(32, "Quiz: " + EVAL),  # contaminated
              {"id": "gpt-first", "conversations": [{"from": "gpt", "value": "no human turn here at all"}]}]
    path = write_cut(tmp_path / "s.json", items)
    every = training_prompts(path, limit=100, evaluation_prompts=[EVAL])
    assert len(every) == 30 and not any("Natalia" in p for p in every) and "Hi" not in every
    sample = training_prompts(path, limit=10, evaluation_prompts=[EVAL], seed=1)
    assert len(sample) == 10 and set(sample) <= set(every)
    assert sample == training_prompts(path, limit=10, evaluation_prompts=[EVAL], seed=1)
    assert sample != training_prompts(path, limit=10, evaluation_prompts=[EVAL], seed=2)
    assert sample == [p for p in every if p in sample]  # file order kept


def test_training_conversations_bring_clean_replies_when_asked(tmp_path):
    items = [conversation(i, f"Explain topic {i} of distributed systems to a new engineer",
                          gpt=f"Topic {i} is about consensus and replication") for i in range(6)]
    items += [conversation(6, "Explain why the sky looks blue at noon", gpt="Quiz: " + EVAL),  # contaminated reply
              conversation(7, "Explain why the sea looks blue at noon", gpt="ok"),  # reply too short
              {"id": "no-reply", "conversations": [{"from": "human", "value": "A question nobody answered here"}]}]
    path = write_cut(tmp_path / "s.json", items)
    pairs = training_conversations(path, limit=100, evaluation_prompts=[EVAL], answers=True)
    assert [a for _, a in pairs] == [f"Topic {i} is about consensus and replication" for i in range(6)]
    assert len(training_conversations(path, limit=100, evaluation_prompts=[EVAL])) == 9  # prompts alone: all 9
    assert all(a is None for _, a in training_conversations(path, limit=100, evaluation_prompts=[EVAL]))


def test_a_topic_pattern_keeps_only_the_first_turns_it_is_found_in(tmp_path):
    items = [conversation(i, f"Write a python function that sorts list number {i}") for i in range(4)]
    items += [conversation(4 + i, f"Tell me a story about the harbour and boat number {i}") for i in range(4)]
    path = write_cut(tmp_path / "s.json", items)
    code = training_prompts(path, limit=100, evaluation_prompts=[EVAL], match=r"(?i)\bPYTHON\b")
    assert code == [f"Write a python function that sorts list number {i}" for i in range(4)]
    assert len(training_prompts(path, limit=100, evaluation_prompts=[EVAL])) == 8  # no pattern: every turn
    assert training_prompts(path, limit=100, evaluation_prompts=[EVAL], match="haskell") == []
