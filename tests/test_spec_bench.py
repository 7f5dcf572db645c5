"""data=spec_bench (Spec-Bench's 480 prompts in six categories) and +experiment=spec_bench: categories selected and
sampled per category, records carrying their prompt's category, and the report splitting each run by category
beside the leaderboard's numbers (hand-built records, then one tiny end-to-end sweep)."""
import collections
import csv
import re

import pytest

from specbench.run.components import build, spec_for
from specbench.data import Example
from specbench.errors import ConfigError
from specbench.analysis.metrics import summarize
from specbench.files import write_json
from specbench.report.experiment import compose_config, hydra_context
from specbench.report.paper import PUBLISHED_DIR
from specbench.report.render import render_experiment
from specbench.report.spec_bench import CATEGORIES
from specbench.run.runner import RunSpec
from specbench.records.schema import SCHEMA_VERSION, RunRecord, build_record, TurnRecord

from .conftest import SHARED_DATA, run_cli
from .test_config import composed


def spec_bench(*overrides):
    return build(composed("data=spec_bench", f"external_data={SHARED_DATA}", *overrides).data, "data")


# --- data=spec_bench -------------------------------------------------------------------------------------

@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"Spec-Bench question file not found at {SHARED_DATA}")
def test_all_480_prompts_in_six_categories_the_conversations_two_turns():
    examples = spec_bench().examples()
    counts = collections.Counter(ex.category for ex in examples)
    assert counts == {c: 80 for c in CATEGORIES}
    assert {len(ex.turns) for ex in examples if ex.category == "mt_bench"} == {2}
    assert {len(ex.turns) for ex in examples if ex.category != "mt_bench"} == {1}
    assert next(ex for ex in examples if ex.category == "translation").prompt.startswith("Translate German to English")
    assert next(ex for ex in examples if ex.category == "mt_bench").row["category"] == "writing"  # MT-Bench's own


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"Spec-Bench question file not found at {SHARED_DATA}")
def test_categories_select_and_per_category_samples_a_balanced_seeded_subset():
    picked = spec_bench("data.categories=[summarization,rag]", "data.per_category=3").examples()
    assert [ex.category for ex in picked] == ["summarization"] * 3 + ["rag"] * 3
    five = spec_bench("data.per_category=5").examples()
    assert collections.Counter(ex.category for ex in five) == {c: 5 for c in CATEGORIES}
    assert [ex.id for ex in five] == [ex.id for ex in spec_bench("data.per_category=5").examples()]  # seeded
    other = spec_bench("data.per_category=5", "data.seed=1").examples()
    assert [ex.id for ex in other] != [ex.id for ex in five]
    assert len(spec_bench("data.per_category=100").examples()) == 480  # more than a category has: all of it
    assert len(spec_bench("data.per_category=5", "data.limit=7").examples()) == 7


def test_unknown_category_is_one_line_listing_the_six_before_any_row_is_read(tmp_path):
    with pytest.raises(ConfigError) as caught:  # the file does not exist: the names are checked first
        build(composed("data=spec_bench", f"data.path={tmp_path / 'missing.jsonl'}",
                       "data.categories=[rag,poetry,maths]").data, "data")
    assert str(caught.value) == ("data.categories: unknown categories poetry, maths; the categories are mt_bench, "
                                 "translation, summarization, qa, math_reasoning, rag")


def test_records_carry_their_prompts_category_and_older_records_load_without_one(tmp_path):
    spec = RunSpec(key="k", method="m", pair="p", data="spec_bench", records_dir=tmp_path)
    turn = TurnRecord(output_ids=[1, 2], new_tokens=2, wall_s=0.1, accept_lengths=[1, 1])
    record = build_record(spec, Example(id="241", turns=["Summarize: ..."], category="summarization"), 0, 0, 8, [turn])
    assert RunRecord.from_dict(record.to_dict()).category == "summarization"
    plain = build_record(spec, Example(id="x", turns=["hi"]), 0, 0, 8, [turn]).to_dict()
    assert "category" not in plain and RunRecord.from_dict(plain).category is None


# --- the published numbers -------------------------------------------------------------------------------

def published_rows():
    path = PUBLISHED_DIR / "spec_bench.csv"
    return list(csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#")))


def test_leaderboard_file_holds_the_ranking_issue_36_quotes_for_a100_vicuna_13b():
    overall = {(r["method.name"], r["metric"]): float(r["value"]) for r in published_rows()
               if r["setting"] == "a100-vicuna-13b" and r["category"] == "overall"}
    assert {m: overall[(m, "speedup")] for m, _ in overall} == {
        "eagle3": 3.02, "sam_eagle": 2.77, "eagle": 2.46, "hydra": 2.20, "token_recycling": 2.17,
        "eagle1": 2.16, "medusa": 1.80, "prompt_lookup": 1.56, "speculative": 1.54, "rest": 1.38, "lookahead": 1.30}
    assert overall[("eagle3", "tau")] == 5.71
    settings = collections.Counter(r["setting"] for r in published_rows())
    # per method: six categories and overall speed-up, and tau; 10 methods each but A100 Vicuna-13B (+ EAGLE-3)
    assert settings == {"3090-vicuna-7b": 80, "a100-vicuna-7b": 80, "a100-vicuna-13b": 88, "a100-vicuna-33b": 80}


# --- the report from hand-built records ------------------------------------------------------------------

T1, T5 = 10.0, 20.0  # ms of a 1-token and a 5-token target forward (the run's measured costs)


def config(records_dir, *overrides):
    with hydra_context():
        return compose_config(["+experiment=spec_bench", *overrides, f"runner.records_dir={records_dir}"])


def line(spec, prompt: str, category: str, index: int, wall: float, steps: list[int], sizes: list[int], round_id,
         end: float) -> dict:
    tokens = sum(steps)
    return {"schema": SCHEMA_VERSION, "run_key": spec.key, "method": spec.method, "pair": spec.pair,
            "data": spec.data, "prompt_id": prompt, "prompt_index": index, "category": category, "repeat": 0,
            "max_new_tokens": 10, "prompt_tokens": 20, "output_ids": list(range(tokens)), "output_text": "x",
            "new_tokens": tokens, "wall_s": wall, "prefill_s": wall / 10, "target_forwards": len(steps),
            "draft_forwards": 0, "drafted": 0, "accepted": tokens - len(steps), "accept_lengths": steps,
            "forward_sizes": {"target": sizes}, "extra": {}, "dtype": "float32", "timestamp": end,
            "env": {"hostname": "test-host", "device_name": "test cpu", "torch_threads": 2}, "model_info": {},
            "config": {}, "pairing": {"mode": "interleaved", "round": round_id, "session": "t", "position": 0,
                                      "size": 2}}


def write_run(cfg, prompts, start: float) -> None:
    """One method's run: per prompt (id, category, method wall s, greedy wall s, method steps); greedy emits 10
    tokens in ten 1-token forwards, the method the same 10 in forwards of 5 tokens (one per step)."""
    spec, base = spec_for(cfg, cfg.method), spec_for(cfg, cfg.baseline)
    mine, theirs = [], []
    for index, (prompt, category, wall, greedy_wall, steps) in enumerate(prompts):
        round_id = f"{spec.key[:6]}-{index}"
        end = start + 10 * index
        theirs.append(line(base, prompt, category, index, greedy_wall, [1] * 10, [1] * 10, round_id, end))
        mine.append(line(spec, prompt, category, index, wall, steps, [5] * len(steps), round_id, end + wall))
    for r in theirs:
        base.store.append(r)
    for r in mine:
        spec.store.append(r)
    summary = summarize([RunRecord.from_dict(r) for r in mine], [RunRecord.from_dict(r) for r in theirs])
    summary["bound"] = {"bound": 1.0, "efficiency": 1.0, "target_ms": {"1": T1, "5": T5}, "target_row_ms": 0.0,
                        "draft_ms": None, "verify_ratio": {"k": 5, "ratio": T5 / T1}}
    write_json(spec.summary_path, summary)


def rows_of(table) -> dict[tuple, dict[str, str]]:
    """(category, method) -> {column header: cell text, without the best / second-best marks}."""
    plain = [[re.sub(r"\*\*|</?u>", "", c) for c in r] for r in table.rows]
    return {tuple(r[:2]): dict(zip(table.header[2:], r[2:])) for r in plain}


def test_report_splits_runs_by_category_beside_the_leaderboard_and_says_why_cells_are_missing(tmp_path):
    records = tmp_path / "records"
    sweep = ["method=speculative_spec_bench,ouroboros,prompt_lookup_spec_bench", f"runner.records_dir={records}"]
    # speculative: summarization 2x faster than greedy in 4 steps of 2.5 tokens (bound 100 ms / 80 ms = 1.25x);
    # qa 1.25x faster, 5 steps of 2 tokens (bound 100 / 100 = 1.0x)
    write_run(config(records, "method=speculative_spec_bench"),
              [("241", "summarization", 0.5, 1.0, [1, 3, 3, 3]), ("242", "summarization", 0.25, 0.5, [3, 3, 3, 1]),
               ("321", "qa", 0.8, 1.0, [2, 2, 2, 2, 2]), ("322", "qa", 0.8, 1.0, [2, 2, 2, 2, 2])], 1e6)
    # ouroboros (no leaderboard number): summarization only
    write_run(config(records, "method=ouroboros"), [("241", "summarization", 0.4, 1.0, [2, 3, 3, 2])], 2e6)
    # prompt_lookup_spec_bench (PLD as published): in the sweep, never run
    result = render_experiment("spec_bench", sweep, out=tmp_path / "reports")
    rows = rows_of(result["table"])
    sps = rows[("Summarization", "SpS")]
    assert sps["(ours) speed-up"].startswith("2.00× [2.00, 2.00]"), sps
    # τ over identical work (the outputs are greedy's), pooled: (10 + 10) / 8, with its interval over prompts
    assert (sps["(ours) τ"], sps["(ours) bound"], sps["(ours) efficiency"]) == ("2.50 [2.50, 2.50]", "1.25×", "1.60")
    assert sps["(ours) τ, decoding steps"] == "2.67"  # (9 + 7) / 6: each prompt's first step left out
    assert sps["(paper) speed-up"] == "1.71×"  # A100, Vicuna-13B
    qa = rows[("Question answering", "SpS")]
    assert qa["(ours) speed-up"].startswith("1.25×") and (qa["(ours) τ"], qa["(ours) bound"]) == ("2.00 [2.00, 2.00]",
                                                                                                  "1.00×")
    overall = rows[("Overall", "SpS")]
    assert overall["(ours) τ"].startswith("2.22 [") and overall["(ours) greedy tok/s"] == "11.43"  # 40 tok / 3.5 s
    assert (overall["(paper) speed-up"], overall["(paper) τ"]) == ("1.54×", "2.19")
    # the overall bound is priced from the run's cost tables (40 T(1) / 18 T(5)), not read from its summary (1.00)
    efficiency = (3.5 / 2.35) / (40 * T1 / (18 * T5))  # Σ/Σ speed-up over the bound
    assert (overall["(ours) bound"], overall["(ours) efficiency"]) == ("1.11×", f"{efficiency:.2f}")
    assert rows[("Translation", "SpS")]["(ours) speed-up"] == "not in this sweep"  # no translation records
    ouro = rows[("Summarization", "Ouroboros")]
    assert ouro["(ours) speed-up"].startswith("2.50×") and ouro["(paper) speed-up"] == "not reported"
    assert rows[("Summarization", "PLD")]["(ours) speed-up"] == "not run yet"
    assert rows[("Summarization", "PLD")]["(paper) speed-up"] == "2.30×"
    eagle1 = rows[("Summarization", "EAGLE")]  # EAGLE-1 (eagle1): ours, with a head trained here, not swept
    assert (eagle1["(ours) speed-up"], eagle1["(paper) speed-up"]) == ("not in this sweep", "2.12×")
    sam_eagle = rows[("Summarization", "SAM-Decoding[EAGLE-2]")]  # ours (sam_speculative over eagle), not swept
    assert sam_eagle["(ours) speed-up"] == "not in this sweep", sam_eagle
    assert rows[("Overall", "EAGLE-3")]["(paper) τ"] == "5.71"
    # the paper's τ is not ranked (no intervals), nor ours where a cell has none (Ouroboros: one prompt)
    table = result["markdown"].split("\n- ")[0]  # the notes below explain the marks
    assert "**" not in table and "<u>" not in table
    categories = list(dict.fromkeys(r[0] for r in result["table"].rows))
    assert categories == ["Multi-turn conversation", "Translation", "Summarization", "Question answering",
                          "Mathematical reasoning", "Retrieval-aug. generation", "Overall"]
    assert "paper columns: Source: Spec-Bench leaderboard" in result["markdown"]
    assert result["paths"]["speedup_by_category.png"].stat().st_size > 5000


def test_a_row_is_set_beside_the_papers_only_when_it_runs_the_published_preset(tmp_path):
    """A CPU-sized variant (token_recycling_cpu) and the paper's method with other settings (prompt_lookup:
    transformers' occurrence rule, not Spec-Bench's) get rows of their own, labelled, the paper column saying
    "different settings"; the paper's rows keep their numbers."""
    records = tmp_path / "records"
    sweep = ["method=token_recycling_cpu,prompt_lookup,speculative_spec_bench,hydra", f"runner.records_dir={records}"]
    for method in ("token_recycling_cpu", "prompt_lookup", "speculative_spec_bench", "hydra"):
        write_run(config(records, f"method={method}"), [("241", "summarization", 0.5, 1.0, [1, 3, 3, 3])], 1e6)
    result = render_experiment("spec_bench", sweep, out=tmp_path / "reports")
    rows = rows_of(result["table"])
    variant = rows[("Summarization", "Token Recycling (18 nodes)")]
    assert variant["(ours) speed-up"].startswith("2.00×")
    assert variant["(paper) speed-up"] == ("different settings (matrix_init, tree; published: "
                                           "method=token_recycling)")
    pld = rows[("Summarization", "PLD [occurrence=earliest]")]
    assert pld["(ours) speed-up"].startswith("2.00×")
    assert pld["(paper) speed-up"] == "different settings (occurrence; published: method=prompt_lookup_spec_bench)"
    assert rows[("Summarization", "PLD")]["(ours) speed-up"] == "not in this sweep"
    assert rows[("Summarization", "PLD")]["(paper) speed-up"] == "2.30×"
    assert rows[("Summarization", "Token Recycling")]["(ours) speed-up"] == "not in this sweep"
    assert rows[("Summarization", "SpS")]["(paper) speed-up"] == "1.71×"  # the published preset: beside the paper
    assert rows[("Summarization", "SpS")]["(ours) speed-up"].startswith("2.00×")
    hydra = rows[("Summarization", "Hydra [MLP heads, not Hydra++]")]  # a null preset: what ours is, in its label
    assert hydra["(paper) speed-up"] == "different settings (no config here is the published run)"
    assert rows[("Summarization", "Hydra")]["(paper) speed-up"] != "different settings (no config here is the " \
        "published run)"
    assert "paper columns say 'different settings'" in result["markdown"]


def test_every_published_preset_is_the_leaderboards_run():
    """The presets experiment.published_presets names hold the published runs' settings (docs/methods.md cites the
    reference code for each), and every key is a method row of the leaderboard file."""
    with hydra_context():
        spec = compose_config(["+experiment=spec_bench"]).experiment
        presets = {row: name for row, name in spec.published_presets.items()}
        assert set(presets) <= {r["method.name"] for r in published_rows()}
        method = {row: compose_config(["+experiment=spec_bench", f"method={name}"]).method
                  for row, name in presets.items() if name is not None}
        variants = {name: compose_config(["+experiment=spec_bench", f"method={name}"]).method
                    for name in spec.variants}
    for row, cfg in method.items():
        assert cfg.name == row, f"{presets[row]} runs as {cfg.name}, not the paper's row {row}"
    for name, cfg in variants.items():
        assert cfg.name == name and spec.variants[name] in presets
    tree = [tuple(p) for p in method["token_recycling"].tree]
    per_depth = collections.Counter(len(p) for p in tree)
    assert len(set(tree)) == 80 and [per_depth[d] for d in range(1, 7)] == [8, 21, 25, 15, 8, 3]
    assert max(max(p) for p in tree) + 1 == 8 and all(p[:-1] in set(tree) for p in tree if len(p) > 1)
    assert (method["token_recycling"].matrix_init, method["token_recycling"].warm_start) == ("zeros", True)
    pld = method["prompt_lookup"]
    assert (pld.max_ngram_size, pld.min_ngram_size, pld.num_pred_tokens, pld.occurrence) == (3, 1, 10,
                                                                                              "earliest_whole")
    lookahead = method["lookahead"]
    assert (lookahead.ngram, lookahead.window, lookahead.guesses, lookahead.pool_capacity) == (5, 7, 7, 7)
    assert not lookahead.pool_from_prompt and not lookahead.warm_start
    rest = method["rest"]
    assert (rest.max_context, rest.min_context, rest.draft_length, rest.max_candidates, rest.retrieve,
            rest.max_nodes) == (16, 2, 10, 5000, "first", 64)
    policy = method["speculative"].policy
    assert (policy.initial, policy.increase, policy.decrease, policy.minimum, policy.persistent) == (5, 2, 1, 1, False)
    eagle2, eagle1, sam_eagle = method["eagle"], method["eagle1"], method["sam_eagle"]
    assert (eagle2.top_k, eagle2.depth, eagle2.max_nodes) == (10, 6, 59)  # total_token 60 counts the root
    assert len(eagle1.tree) == 25 and max(map(len, eagle1.tree)) == 5 and max(max(p) for p in eagle1.tree) == 3
    eagle3 = method["eagle3"]  # inference_eagle3.py: 60 / 5 / 10 too, over a head of the published layout
    assert (eagle3.top_k, eagle3.depth, eagle3.max_nodes, eagle3.head) == (10, 6, 59, "eagle3_published")
    assert (sam_eagle.max_draft, sam_eagle.min_match_length, sam_eagle.corpus_bias, sam_eagle.corpus) == (
        39, 5, 5, None)
    assert (sam_eagle.fallback.name, sam_eagle.fallback.top_k, sam_eagle.fallback.depth,
            sam_eagle.fallback.max_nodes) == ("eagle", 8, 6, 62)
    with hydra_context():  # SAM alone (no leaderboard row): Spec-Bench's code, min(n_predicts 40, 1 + ⌊4·m⌋)
        sam = compose_config(["+experiment=spec_bench", "method=sam_decoding"]).method
    assert (sam.max_draft, sam.alpha, sam.min_match_length, sam.corpus) == (39, 4.0, 1, None)


def test_another_leaderboard_setting_and_a_bad_one(tmp_path):
    records = [f"runner.records_dir={tmp_path / 'records'}"]
    result = render_experiment("spec_bench", [*records, "experiment.published_where.setting=3090-vicuna-7b"],
                               out=tmp_path / "reports")
    assert rows_of(result["table"])[("Overall", "SAM-Decoding[EAGLE-2]")]["(paper) speed-up"] == "2.38×"
    with pytest.raises(ConfigError, match=r"experiment.published_where.setting: 'h100' is not one of \['3090-"):
        render_experiment("spec_bench", [*records, "experiment.published_where.setting=h100"], out=tmp_path)


# --- end to end on the tiny pair ---------------------------------------------------------------------------

@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"Spec-Bench question file not found at {SHARED_DATA}")
def test_tiny_sweep_records_categories_and_the_report_splits_them(tmp_path):
    records = tmp_path / "records"
    sweep = ["model=tiny_llama", "method=prompt_lookup_spec_bench", "data.per_category=1", "data.max_new_tokens=8",
             "data.categories=[mt_bench,summarization]", f"external_data={SHARED_DATA}",
             f"runner.records_dir={records}"]
    run_cli("-m", "+experiment=spec_bench", *sweep, records_dir=records)
    lines = [RunRecord.from_dict(r) for path in records.rglob("*.jsonl") for r in
             (__import__("json").loads(x) for x in path.read_text().splitlines())]
    assert {r.category for r in lines} == {"mt_bench", "summarization"}
    assert all(len(r.turns) == 2 for r in lines if r.category == "mt_bench")
    result = render_experiment("spec_bench", sweep, out=tmp_path / "reports")
    rows = rows_of(result["table"])
    for category in ("Multi-turn conversation", "Summarization", "Overall"):
        assert re.match(r"[\d.]+×", rows[(category, "PLD")]["(ours) speed-up"]), rows[(category, "PLD")]
        assert re.fullmatch(r"[\d.]+×", rows[(category, "PLD")]["(ours) bound"]), rows[(category, "PLD")]
    assert rows[("Translation", "PLD")]["(ours) speed-up"] == "not in this sweep"
