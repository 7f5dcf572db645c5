"""The seven datasets: offline sources, hub-only ones failing clearly, local files, templates, multi-turn."""
import json

import pytest

from specbench.run.components import build
from specbench.errors import ConfigError
from specbench.models.pair import plain_conversation

from .conftest import SHARED_DATA, run_cli
from .test_cli import load_records
from .test_config import composed

HUB_ONLY = {"mbpp": "google-research-datasets/mbpp", "cnndm": "abisee/cnn_dailymail", "wmt16": "wmt/wmt16",
            "alpaca": "tatsu-lab/alpaca"}

LOCAL_ROWS = {
    "mbpp": [{"task_id": 11, "text": "Write a function to add two numbers.", "code": "def add(a, b):\n    return a + b",
              "test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"], "test_setup_code": ""},
             {"task_id": 12, "text": "Write a function to negate a number.", "code": "def neg(a):\n    return -a",
              "test_list": ["assert neg(1) == -1"], "test_setup_code": ""}],
    "cnndm": [{"id": "a1", "article": "The mayor opened a bridge on Monday.", "highlights": "Mayor opens bridge."},
              {"id": "a2", "article": "Rain fell all week in the city.", "highlights": "A rainy week."}],
    "wmt16": [{"translation": {"de": "Das Haus ist klein.", "en": "The house is small."}},
              {"translation": {"de": "Guten Morgen.", "en": "Good morning."}}],
    "alpaca": [{"instruction": "Name a colour.", "input": "", "output": "Blue."},
               {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"}],
}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("name", sorted(HUB_ONLY))
def test_hub_only_datasets_fail_offline_naming_dataset_hub_id_and_data_path(name):
    data = build(composed(f"data={name}", "data.limit=3").data, "data")
    with pytest.raises(ConfigError) as err:
        data.examples()
    message = str(err.value)
    assert f"'{name}'" in message and HUB_ONLY[name] in message and "data.path=" in message


def test_cli_reports_the_offline_error_and_exits_2(tmp_path):
    proc = run_cli("method=greedy", "data=cnndm", "data.limit=3", records_dir=tmp_path / "records", check=False)
    assert proc.returncode == 2
    assert "abisee/cnn_dailymail" in proc.stderr and "data.path=" in proc.stderr and "cnndm_specbench" in proc.stderr


@pytest.mark.parametrize("name", sorted(LOCAL_ROWS))
def test_hub_only_datasets_run_from_a_local_file(tmp_path, name):
    path = write_jsonl(tmp_path / f"{name}.jsonl", LOCAL_ROWS[name])
    data = build(composed(f"data={name}", f"data.path={path}").data, "data")
    examples = data.examples()
    assert len(examples) == 2 and all(len(ex.turns) == 1 for ex in examples)
    first = {ex.reference for ex in examples}
    expected = {"mbpp": {"def add(a, b):\n    return a + b", "def neg(a):\n    return -a"},
                "cnndm": {"Mayor opens bridge.", "A rainy week."},
                "wmt16": {"The house is small.", "Good morning."},
                "alpaca": {"Blue.", "5"}}[name]
    assert first == expected


def test_hub_loader_path_with_download_allowed_reads_a_local_dataset_folder(tmp_path):
    """The real datasets.load_dataset code path, offline: a folder of data files stands in for the hub id."""
    folder = tmp_path / "mbpp_local"
    folder.mkdir()
    write_jsonl(folder / "validation.jsonl", LOCAL_ROWS["mbpp"])
    cfg = composed("data=mbpp", f"data.hub.id={folder}", "data.hub.config=null", "data.hub.allow_download=true",
                   f"+data.hub.cache_dir={tmp_path / 'cache'}")
    examples = build(cfg.data, "data").examples()
    assert [ex.id for ex in examples] == ["11", "12"]
    assert examples[0].prompt == "Write a function to add two numbers.\nassert add(1, 2) == 3\n"


def test_templates_follow_the_papers():
    mbpp = build(composed("data=mbpp").data, "data")
    assert mbpp.turns_of(LOCAL_ROWS["mbpp"][0]) == ["Write a function to add two numbers.\nassert add(1, 2) == 3\n"]
    cnndm = build(composed("data=cnndm").data, "data")
    assert cnndm.turns_of(LOCAL_ROWS["cnndm"][0]) == ["Summarize:\nThe mayor opened a bridge on Monday.\nSummary:\n"]
    wmt = build(composed("data=wmt16").data, "data")
    assert "Das Haus ist klein." in wmt.turns_of(LOCAL_ROWS["wmt16"][0])[0]
    alpaca = build(composed("data=alpaca").data, "data")
    no_input, with_input = (alpaca.turns_of(r)[0] for r in LOCAL_ROWS["alpaca"])
    assert "### Input:" not in no_input and no_input.startswith("Below is an instruction that describes a task. Write")
    assert "### Input:\n2 and 3\n\n### Response:\n" in with_input and "paired with an input" in with_input


def test_papers_protocol_sizes_and_budgets():
    sizes = {"humaneval": 164, "gsm8k": 100, "mt_bench": 80}
    for name, n in sizes.items():
        assert len(build(composed(f"data={name}").data, "data").selected_indices()) == n, name
    budgets = {"humaneval": 512, "mbpp": 512, "gsm8k": 256, "cnndm": 128, "wmt16": 64}
    for name, n in budgets.items():
        assert composed(f"data={name}").data.max_new_tokens == n, name
    assert composed("data=cnndm").data.sample == 100 and composed("data=wmt16").data.sample == 100


def test_aime2025_reads_both_parts_in_order_and_scores_the_final_integer():
    data = build(composed("data=aime2025").data, "data")
    examples = data.examples()
    assert len(examples) == 30 and [e.id for e in examples[14:16]] == ["aime2025/14", "aime2025/15"]
    assert examples[0].reference == "70" and "integer bases" in examples[0].turns[0]  # part I's first problem
    assert examples[15].reference == "468"  # part II's first, read after part I's 15
    assert composed("data=aime2025").data.max_new_tokens == 2048
    right = data.scorer.score(examples[0], ["... so b = 21 or 49. The answer is 70."])
    assert right["status"] == "ok" and right["values"]["correct"] == 1.0
    assert data.scorer.score(examples[0], ["The answer is 71."])["values"]["correct"] == 0.0


def test_mt_bench_has_80_two_turn_questions():
    data = build(composed("data=mt_bench").data, "data")
    examples = data.examples()
    assert len(examples) == 80 and all(len(ex.turns) == 2 for ex in examples)
    assert examples[0].id == "81" and data.scorer.name == "none"


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"Spec-Bench/EAGLE question files not found at {SHARED_DATA}")
@pytest.mark.parametrize("name, scorer, first_words", [
    ("cnndm_specbench", "rouge", "Summarize:"),
    ("wmt16_specbench", "bleu", "Translate German to English:"),
    ("alpaca_eagle", "rouge_l", "What would be the best"),
])
def test_offline_subsets_from_question_files(name, scorer, first_words):
    data = build(composed(f"data={name}", f"external_data={SHARED_DATA}").data, "data")
    examples = data.examples()
    assert len(examples) == 80 and data.scorer.name == scorer
    assert examples[0].prompt.startswith(first_words) and isinstance(examples[0].reference, str)
    assert all(len(ex.turns) == 1 for ex in examples)


def test_category_filter_that_matches_nothing_is_named(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl",
                       [{"question_id": 1, "category": "qa", "turns": ["hi"], "reference": ["x"]}])
    with pytest.raises(ConfigError, match="data.categories"):
        build(composed("data=cnndm_specbench", f"data.path={path}").data, "data").examples()


def test_mbpp_from_local_file_end_to_end_records_pass_at_1(tmp_path):
    path = write_jsonl(tmp_path / "mbpp.jsonl", LOCAL_ROWS["mbpp"])
    records = tmp_path / "records"
    proc = run_cli("method=greedy", "data=mbpp", f"data.path={path}", "data.limit=2", "data.max_new_tokens=8",
                   records_dir=records)
    assert "pass@1 0.00" in proc.stdout  # a random tiny model writes no working code
    rows = load_records(records, "greedy")
    assert [r["score"]["status"] for r in rows] == ["ok", "ok"]
    assert all(r["score"]["values"]["pass"] == 0.0 and r["score"]["reason"] for r in rows)


def test_scorer_failure_keeps_the_timing_record(tmp_path):
    path = write_jsonl(tmp_path / "gsm.jsonl", [{"question": "1+1?", "answer": "#### 2"},
                                                {"question": "2+2?", "answer": "no final number"},
                                                {"question": "3+3?", "answer": "#### 6"}])
    records = tmp_path / "records"
    proc = run_cli("method=greedy", "data=gsm8k", f"data.path={path}", "data.max_new_tokens=6", records_dir=records)
    rows = {r["prompt_id"]: r for r in load_records(records, "greedy")}
    assert len(rows) == 3
    failed = rows["gsm8k/1"]["score"]
    assert failed["status"] == "failed" and "no number" in failed["reason"] and rows["gsm8k/1"]["wall_s"] > 0
    summary = json.loads(next(records.rglob("greedy-*.summary.json")).read_text())
    assert summary["accuracy"]["failed"] == 1 and summary["accuracy"]["scored"] == 2
    assert "(1 failed)" in proc.stdout


def test_mt_bench_two_turns_end_to_end(tmp_path, tiny_llama):
    records = tmp_path / "records"
    proc = run_cli("method=speculative", "data=mt_bench", "data.limit=2", "data.max_new_tokens=10",
                   records_dir=records)
    assert "lossless: 2/2 (" in proc.stdout and "not scored" in proc.stdout
    rows = load_records(records, "speculative")
    data = build(composed("data=mt_bench").data, "data")
    for row, example in zip(rows, data.examples()):
        first, second = row["turns"]
        assert row["new_tokens"] == first["new_tokens"] + second["new_tokens"]
        assert row["wall_s"] == pytest.approx(first["wall_s"] + second["wall_s"])
        assert row["output_ids"] == first["output_ids"] + second["output_ids"]
        assert row["target_forwards"] == first["target_forwards"] + second["target_forwards"]
        # the second turn's prompt is the whole conversation, the first answer included
        conversation = [{"role": "user", "content": example.turns[0]},
                        {"role": "assistant", "content": first["output_text"]},
                        {"role": "user", "content": example.turns[1]}]
        assert second["prompt_tokens"] == len(tiny_llama.encode(plain_conversation(conversation)))
        assert row["score"]["status"] == "not_scored"


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"Spec-Bench question files not found at {SHARED_DATA}")
def test_mixture_orders_by_consecutive_number_and_scores_per_task(tmp_path):
    def ids(*overrides):
        data = build(composed("data=mixture_cn", f"external_data={SHARED_DATA}", *overrides).data, "data")
        return [ex.id.split(":")[0] for ex in data.examples()], data

    cn20, _ = ids()
    assert len(cn20) == 80 and cn20 == ["code"] * 20 + ["gsm8k"] * 20 + ["cnndm"] * 20 + ["wmt16"] * 20
    cn4, _ = ids("data.consecutive=4")
    assert cn4[:8] == ["code"] * 4 + ["gsm8k"] * 4 and cn4.count("wmt16") == 20
    shuffled, data = ids("data.consecutive=null")
    assert sorted(shuffled) == sorted(cn20) and shuffled != cn20
    cn1, _ = ids("data.consecutive=1", "data.per_component=2")
    assert cn1 == ["code", "gsm8k", "cnndm", "wmt16"] * 2
    records = tmp_path / "records"
    proc = run_cli("method=lookahead", "method.warm_start=true", "data=mixture_cn", f"external_data={SHARED_DATA}",
                   "data.consecutive=1", "data.limit=4", "data.max_new_tokens=8", records_dir=records)
    assert "lossless: 4/4 (" in proc.stdout and "mixed" in proc.stdout
    scorers = [r["score"]["scorer"] for r in load_records(records, "lookahead")]
    assert scorers == ["humaneval_pass", "gsm8k_exact_match", "rouge", "bleu"]


def test_partition_cuts_fixed_disjoint_parts_and_limit_applies_inside_one():
    sizes = "+data.partition={seed: 0, sizes: {train: 500, validation: 80, test: 80}}"
    parts = {part: [ex.id for ex in build(composed("data=gsm8k", "data.sample=null", sizes, f"+data.part={part}").data,
                                          "data").examples()] for part in ("train", "validation", "test")}
    assert [len(v) for v in parts.values()] == [500, 80, 80]
    assert len(set().union(*parts.values())) == 660  # disjoint
    again = build(composed("data=gsm8k", "data.sample=null", sizes, "+data.part=test", "data.limit=5").data, "data")
    assert [ex.id for ex in again.examples()] == parts["test"][:5]  # fixed by the seed; limit takes the first N
    with pytest.raises(ConfigError, match="data.part"):
        build(composed("data=gsm8k", sizes, "+data.part=dev").data, "data")
    with pytest.raises(ConfigError, match="data.partition.sizes"):
        build(composed("data=gsm8k", "+data.partition={sizes: {train: 2000}}", "+data.part=train").data,
              "data").examples()
