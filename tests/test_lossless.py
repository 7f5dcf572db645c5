"""Losslessness that tells near-ties from bugs: a hand-made exact tie is a near-tie; a wrong token, and every bug
planted in a correct method (tests/planted_bugs.py), a MISMATCH — on transformers fp32 and bf16 and on llama.cpp
(tiny pairs here; the embedded pair's Q4 GGUF and bf16 weights in test_lossless_embedded.py)."""
import json

import pytest

from specbench.backends.torch.cached_lm import CachedLM
from specbench.decoding.evidence import TokenEvidence, evidence_of
from specbench.decoding.generation import Generation, finalize_tokens, is_finished
from specbench.analysis.lossless import (MISMATCH, NEAR_TIE, TOLERANCE_FACTOR, LosslessCheck, NoiseProfile,
                                         measure_noise, noise_cache_path)
from specbench.methods.base import DecodingMethod, NoTimeline
from specbench.methods.greedy import Greedy
from specbench.methods.prompt_lookup import PromptLookup
from specbench.methods.speculative import SpeculativeDecoding
from specbench.models.gguf_pair import build_tiny_gguf_pair
from specbench.models.tiny import build_tiny_pair

from .conftest import run_cli
from .planted_bugs import PLANTED, ThirdTokenBug, verdicts

# every even token's output row copied onto the next (odd) one: each argmax is an exact tie between two tokens,
# which argmax breaks towards the even one
PAIRED_TIES = [[v, v + 1] for v in range(4, 258, 2)]


class TieFlipGreedy(DecodingMethod):
    """Greedy, except that exact ties go to the highest tied token id: correct up to numerics, not greedy's tokens."""

    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()) -> Generation:
        target = CachedLM(self.pair.target)
        logits = target.forward(prompt_ids, keep_last=1)[-1]
        timeline.mark("prefill")
        out, evidence = [], []
        while True:
            out.append(int((logits == logits.max()).nonzero().max()))
            evidence += evidence_of(logits[None], out[-1:], 1)  # an exact tie: margin 0, its own argmax all the same
            timeline.step()
            if is_finished(out, max_new_tokens, eos_ids):
                break
            logits = target.forward([out[-1]])[-1]
        gen = Generation(tokens=finalize_tokens(out, max_new_tokens, eos_ids), accept_lengths=[1] * len(out),
                         evidence=evidence)
        gen.count_forwards(target)
        return gen


class TieFlipThenWrongContext(DecodingMethod):
    """The first token's exact tie taken the other way (a near-tie), then every later row computed over a context that
    lost the prompt's first token, each token its own row's argmax: a bug only the rows past the divergence show."""

    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()) -> Generation:
        logits = CachedLM(self.pair.target).forward(prompt_ids, keep_last=1)[-1]
        out, evidence = [], []
        wrong = CachedLM(self.pair.target)
        while len(out) < max_new_tokens:
            out.append(int((logits == logits.max()).nonzero().max()))
            evidence += evidence_of(logits[None], out[-1:], 1)
            logits = wrong.forward((list(prompt_ids[1:]) if len(out) == 1 else []) + out[-1:], keep_last=1)[-1]
        return Generation(tokens=out, accept_lengths=[1] * len(out), evidence=evidence)


@pytest.fixture(scope="module")
def tied_pair():
    return build_tiny_pair(name="tiny-tied", arch="llama", lm_head_ties=PAIRED_TIES)


def test_the_noise_cache_is_the_targets_whether_or_not_the_draft_loaded():
    with_draft, without = build_tiny_pair(), build_tiny_pair(load_draft=False)
    assert noise_cache_path(with_draft, 2) == noise_cache_path(without, 2)
    assert noise_cache_path(with_draft, 2) != noise_cache_path(build_tiny_pair(seed=1), 2)  # another target


def test_the_noise_cache_names_how_the_target_computes_not_how_its_settings_were_chosen():
    """model.backend=auto resolved to llama.cpp and an explicit llamacpp computed alike but calibrated twice."""
    import dataclasses

    pair = build_tiny_pair()
    pair.info = {**pair.info, "backend": {"name": "llamacpp", "requested": "llamacpp", "reason": "set explicitly"}}
    before = noise_cache_path(pair, 2)
    pair.precision = dataclasses.replace(pair.precision, requested="float32", reason="set explicitly")
    pair.info = {**pair.info, "backend": {"name": "llamacpp", "requested": "auto", "reason": "llama-cpp installed"}}
    assert noise_cache_path(pair, 2) == before
    pair.precision = dataclasses.replace(pair.precision, linear_kernel="another")
    assert noise_cache_path(pair, 2) != before


def test_noise_profile_is_measured_small_and_nonnegative(tiny_llama):
    profile = measure_noise(tiny_llama.target, [[5, 6, 7, 8], [40, 41]], positions=8,
                            blocks=(("causal", 2), ("tree", 2), ("causal", 4)))
    assert set(profile.per_block) == set(profile.pair_max) == {"causal-2", "tree-2", "causal-4"}
    assert 0 <= profile.max_abs_diff < 1e-3  # fp32: summation-order noise only
    assert all(0 <= v <= 2 * profile.max_abs_diff for v in profile.pair_max.values())  # |Δ(b) - Δ(a)| <= 2 max|Δ|
    assert profile.pair_samples == 16  # a per-position statistic: 2 prompts x 8 positions per block
    assert profile.tolerance(3) == TOLERANCE_FACTOR * max(profile.pair_max.values())


def test_the_tolerance_grows_with_the_block_and_rests_on_the_pair_statistic():
    profile = NoiseProfile(max_abs_diff=5.0, per_block={}, positions=0,  # the vocabulary-wide maximum plays no part
                           pair_max={"causal-2": 0.2, "causal-4": 0.1, "tree-4": 0.3, "causal-32": 0.25})
    assert profile.tolerance(1) == profile.tolerance(2) == pytest.approx(1.5 * 0.2)
    assert profile.tolerance(3) == profile.tolerance(4) == pytest.approx(1.5 * 0.3)  # either mask, and any smaller
    assert profile.tolerance(5) == profile.tolerance(32) == pytest.approx(1.5 * 0.3)
    assert profile.tolerance(300) == profile.tolerance(None) == pytest.approx(1.5 * 0.3)  # beyond: every size's


def test_a_check_over_more_positions_or_deeper_than_calibrated_is_judged_on_an_extended_calibration(monkeypatch):
    """A tolerance is 1.5x the largest of the calibration's samples, and the largest of more samples is larger: a
    correct tiny-model run (speculative, 2,937 tokens) was a MISMATCH by the agreement check at 1.56x a tolerance
    from 384 samples. A check failing on the full calibration over more positions than it sampled, or twice as deep,
    is judged on the full one extended to them (positions and depth rounded up to 256, within the cache the run
    reserved); one it covers keeps the full calibration's verdict, and a bug beyond the extension stays one."""
    from types import SimpleNamespace

    from specbench.analysis import lossless

    full = NoiseProfile(max_abs_diff=1.0, per_block={"causal-4": 1.0}, positions=384, pair_max={"causal-4": 1.0},
                        pair_samples=384, version=2, depth=100)
    measured = []

    def extension(pair, threads, texts=None, extent=None):
        measured.append(extent)
        return NoiseProfile(max_abs_diff=2.0, per_block={"causal-4": 2.0}, positions=extent[0],
                            pair_max={"causal-4": 2.0}, pair_samples=extent[0], version=2, depth=extent[1])

    monkeypatch.setattr(lossless, "noise_profile", extension)
    check = LosslessCheck(SimpleNamespace(reserved=0), threads=1)
    check._profile = full
    noise_beyond_the_full = lambda p: 2.0 > p.tolerance(4)  # noqa: E731  1.5 x 1.0 < 2.0 <= 1.5 x 2.0
    judged = check._judged(noise_beyond_the_full, compared=2937, depth=3000)
    assert measured == [(3072, 3328)] and judged.tolerance(4) == pytest.approx(3.0)
    assert judged.positions == 384 + 3072 and judged.pair_samples == 384 + 3072 and judged.depth == 3328
    assert check._judged(noise_beyond_the_full, compared=2937, depth=3000) is judged and len(measured) == 1  # once
    assert check._judged(noise_beyond_the_full, compared=300, depth=150) is full  # covered: the full one decides
    assert check._judged(noise_beyond_the_full, compared=1000, depth=1200) is judged  # covered by the longer one
    assert check._judged(lambda p: 9.0 > p.tolerance(4), compared=2937, depth=3000).tolerance(4) < 9.0  # a bug
    fresh = LosslessCheck(SimpleNamespace(reserved=0), threads=1)
    fresh._profile = full
    assert fresh._judged(noise_beyond_the_full, compared=10, depth=250).depth == 256  # over twice as deep: extended
    assert measured == [(3072, 3328), (64, 256)]
    check.pair.reserved = 1000  # the run's caches hold 1,000 positions: the extension stays within them
    assert check._extension(full, compared=2937, depth=990) == (999, 1000)
    assert check._extension(full, compared=384, depth=200) is None


def test_an_extension_raises_no_tolerance_above_twice_the_full_calibrations():
    """It is measured only when a check fails, by the code running then: a bug in the forward path it runs through
    (shifted positions in a block forward) would read as noise of any size. Twice the full calibration's at most; a
    block whose full calibration saw no noise at all gets none."""
    full = NoiseProfile(max_abs_diff=1.0, per_block={}, positions=384, pair_max={"causal-4": 1.0, "tree-4": 0.0},
                        pair_samples=384, version=2, depth=100)
    buggy = NoiseProfile(max_abs_diff=9.0, per_block={}, positions=64, pair_max={"causal-4": 5.0, "tree-4": 5.0},
                         pair_samples=64, version=2, depth=600)
    capped = full.merged(buggy, cap=2.0)
    assert capped.pair_max == {"causal-4": 2.0, "tree-4": 0.0} and capped.depth == 600
    assert full.merged(buggy).pair_max == {"causal-4": 5.0, "tree-4": 5.0}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_bug_in_the_forward_path_the_extension_runs_through_stays_a_mismatch(tiny_pairs, dtype, tmp_path,
                                                                              monkeypatch):
    """A 520-token prompt is over twice as deep as the full calibration: the failing check is judged on an
    extension, measured while the planted bug (blocks fed at shifted positions) is active in the shared forward
    path, so the extension reads the bug as noise. The cap keeps it a MISMATCH (it was a near-tie in bf16)."""
    from .planted_bugs import shifted_positions

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    pair = tiny_pairs[dtype]
    prompt = [(7 * i) % 250 + 3 for i in range(520)]
    check = LosslessCheck(pair, threads=1)
    assert check.profile.depth < 260  # the full calibration, measured by correct code
    greedy = Greedy(pair, "greedy").generate(prompt, 24, set())
    with shifted_positions():
        buggy = SpeculativeDecoding(pair, "speculative", gamma=4).generate(prompt, 24, set())
        verdict = check.classify(prompt, greedy, buggy)
    assert verdict["verdict"] == MISMATCH, verdict
    assert check._extended_profiles  # the extension was measured (and capped)


def test_exact_tie_is_a_near_tie_and_a_wrong_token_a_mismatch(tied_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    prompt = [10, 11, 12, 13]
    greedy = Greedy(tied_pair, "greedy").generate(prompt, 6, set())
    flipped = TieFlipGreedy(tied_pair, "flip").generate(prompt, 6, set())
    assert flipped.tokens[0] == greedy.tokens[0] + 1  # the tie went the other way at the very first token
    check = LosslessCheck(tied_pair, threads=1)
    result = check.classify(prompt, greedy, flipped)
    # both forwards saw the two tokens exactly tied: a disagreement of 0, within any tolerance
    assert result["verdict"] == NEAR_TIE and result["index"] == 0 and result["check"] == "divergence"
    assert result["gap"] == result["gap_greedy"] == result["gap_method"] == 0 and result["exact"]
    assert list((tmp_path / "noise").glob("*.json")), "the calibration is cached"
    # check 4: past the near-tie, the flip's rows are one-token rows along its own output, as the recomputed ones
    assert result["continuation"]["positions"] == 5 and result["continuation"]["ratio"] <= 1

    drifting = TieFlipThenWrongContext(tied_pair, "drift").generate(prompt, 6, set())
    assert drifting.tokens[0] == flipped.tokens[0]  # the same near-tie at the first token
    result = check.classify(prompt, greedy, drifting)
    assert result["verdict"] == MISMATCH and result["check"] == "continuation", result
    assert result["divergence"] == 0 and result["index"] >= 1 and result["continuation"]["ratio"] > 1
    # the divergence's own near-tie is kept apart, so the record never reads "MISMATCH, gap 0 <= tolerance"
    assert "gap" not in result and result["near_tie_at_divergence"]["gap"] == 0
    # a repeat with the same output reuses the rows recomputed for it
    monkeypatch.setattr("specbench.analysis.lossless.continuation_rows",
                        lambda *a: pytest.fail("recomputed for a repeat"))
    assert check.classify(prompt, greedy, drifting)["continuation"] == result["continuation"]

    buggy = ThirdTokenBug(tied_pair, "buggy").generate(prompt, 6, set())
    result = check.classify(prompt, greedy, buggy)
    assert result["verdict"] == MISMATCH and result["index"] == 2 and result["check"] == "own_forward"
    assert "did not" in result["reason"]
    result = check.classify(prompt, greedy, buggy.tokens)  # the ids alone: greedy's preference decides
    assert result["verdict"] == MISMATCH and result["check"] == "divergence"
    assert result["gap_greedy"] > 100 * result["tolerance"]
    assert check.classify(prompt, greedy, greedy)["verdict"] == "identical"


def test_a_negative_margin_is_a_mismatch_whatever_the_ids_show(tied_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    prompt = [10, 11, 12, 13]
    greedy = Greedy(tied_pair, "greedy").generate(prompt, 4, set())
    forged = Generation(tokens=list(greedy.tokens), evidence=list(greedy.evidence))
    forged.evidence[1] = TokenEvidence(forged.tokens[1], -0.5, [7, forged.tokens[1]], [1.0, 0.5], 5)
    result = LosslessCheck(tied_pair, threads=1).classify(prompt, greedy, forged)
    assert result["verdict"] == MISMATCH and result["check"] == "own_forward" and result["index"] == 1
    assert result["own_forward"]["own_argmax"] == 7


TINY_PROMPTS = [list(range(s, s + 6)) for s in (3, 20, 50, 90)] + [[5, 6, 7, 5, 6, 7, 5, 6]]
TINY_METHODS = {"speculative": lambda pair: SpeculativeDecoding(pair, "speculative", gamma=4),
                "prompt_lookup": lambda pair: PromptLookup(pair, "prompt_lookup", num_pred_tokens=3)}


@pytest.fixture(scope="module")
def tiny_pairs():
    return {"float32": build_tiny_pair(), "bfloat16": build_tiny_pair(dtype="bfloat16"),
            "llamacpp": build_tiny_gguf_pair()}


@pytest.mark.parametrize("method", sorted(TINY_METHODS))
@pytest.mark.parametrize("kind", ["float32", "bfloat16", "llamacpp"])
def test_every_planted_bug_is_a_mismatch_and_the_correct_method_is_not(tiny_pairs, kind, method, tmp_path,
                                                                       monkeypatch):
    """second_best: its own forward did not rank the token first (no tolerance); shifted_positions and stale_kv: the
    forwards disagree beyond the noise where both chose alike, or at the divergence. llama.cpp refuses a block at
    positions that do not continue its sequence: that bug cannot run there."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    pair, make = tiny_pairs[kind], TINY_METHODS[method]
    correct = verdicts(pair, lambda: make(pair), None, TINY_PROMPTS, 24)
    assert all(v["verdict"] != MISMATCH for v in correct), correct
    for bug in PLANTED:
        if kind == "llamacpp" and bug == "shifted_positions":
            with pytest.raises(RuntimeError, match="llama_decode failed .* at positions"):
                verdicts(pair, lambda: make(pair), bug, TINY_PROMPTS, 24)
            continue
        found = verdicts(pair, lambda: make(pair), bug, TINY_PROMPTS, 24)
        assert [v["verdict"] for v in found] == [MISMATCH] * len(TINY_PROMPTS), (bug, found)
        if bug == "second_best":
            assert all(v["check"] == "own_forward" for v in found)


def test_what_passes_on_the_first_text_calibration_needs_no_more_and_a_bug_is_judged_on_the_full_one(
        tiny_pairs, tmp_path, monkeypatch):
    """A correct method passes on the calibration of the first text alone (the full one is never measured); a
    planted bug's check does not pass there, so it is judged on the full calibration, with the verdict a check
    given only the full calibration reaches; every tolerance of the first-text calibration is at most the full's."""
    from specbench.analysis.lossless import QUICK_TEXTS, noise_profile

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    pair = tiny_pairs["float32"]
    full_path, first_path = noise_cache_path(pair, 1), noise_cache_path(pair, 1, QUICK_TEXTS)
    check = LosslessCheck(pair, threads=1)
    monkeypatch.setattr("torch.get_num_threads", lambda: 1)  # verdicts() builds its check at the test's threads
    correct = verdicts(pair, lambda: SpeculativeDecoding(pair, "speculative", gamma=4), None, TINY_PROMPTS, 24)
    assert all(v["verdict"] != MISMATCH for v in correct) and first_path.exists() and not full_path.exists()
    assert {v["agreement"]["calibration_positions"] for v in correct if "agreement" in v} == {64}
    buggy = verdicts(pair, lambda: SpeculativeDecoding(pair, "speculative", gamma=4), "stale_kv", TINY_PROMPTS, 24)
    assert full_path.exists() and [v["verdict"] for v in buggy] == [MISMATCH] * len(TINY_PROMPTS)
    first, full = noise_profile(pair, 1, QUICK_TEXTS), check.profile
    assert all(first.tolerance(k) <= full.tolerance(k) for k in (1, 2, 4, 8, 32, None))
    assert full.positions == 6 * first.positions
    full_path.unlink(), first_path.unlink()  # the full calibration only: the same verdicts
    monkeypatch.setattr("specbench.analysis.lossless.QUICK_TEXTS", None)
    assert [v["verdict"] for v in verdicts(pair, lambda: SpeculativeDecoding(pair, "speculative", gamma=4),
                                           "stale_kv", TINY_PROMPTS, 24)] == [v["verdict"] for v in buggy]


def test_without_the_methods_rows_only_greedys_preference_is_weighed(tied_pair, tmp_path, monkeypatch):
    """hf_assisted's generate() keeps no rows: the divergence is judged on greedy's preference alone (a lower bound
    of the disagreement), said in the verdict."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    prompt = [10, 11, 12, 13]
    greedy = Greedy(tied_pair, "greedy").generate(prompt, 6, set())
    flipped = TieFlipGreedy(tied_pair, "flip").generate(prompt, 6, set())
    result = LosslessCheck(tied_pair, threads=1).classify(prompt, greedy, flipped.tokens)
    assert result["verdict"] == NEAR_TIE and result["method_row"] == "not recorded" and not result["exact"]
    assert result["gap_method"] is None and result["gap"] == result["gap_greedy"] == 0


def tied_model_overrides():
    return ["model.name=tiny-tied", f"+model.lm_head_ties={json.dumps(PAIRED_TIES).replace(' ', '')}"]


def test_cli_counts_near_ties_and_strict_mode_fails_only_on_mismatch(tmp_path):
    records = tmp_path / "records"
    common = ("data.limit=3", "data.max_new_tokens=8", *tied_model_overrides(), "runner.strict_lossless=true")
    proc = run_cli("method=greedy", "method._target_=tests.test_lossless.TieFlipGreedy", "method.name=tie_flip",
                   *common, records_dir=records)
    assert ("lossless: 3/3 (0 identical, 3 differ from one-row greedy only by kernel rounding, largest gap 0 <= "
            "tolerance ") in proc.stdout, proc.stdout
    record = json.loads(next(records.rglob("tie_flip-*.jsonl")).read_text().splitlines()[0])
    assert record["lossless"]["verdict"] == "near-tie" and record["lossless"]["index"] == 0
    assert record["lossless"]["gap"] == 0 and record["lossless"]["tolerance"] >= 0
    assert record["margins"] == [0.0] * record["new_tokens"]  # each an exact tie, chosen by its own forward
    assert len(record["step_ms"]) == len(record["accept_lengths"])

    proc = run_cli("method=greedy", "method._target_=tests.test_lossless.ThirdTokenBug", "method.name=buggy",
                   *common, records_dir=records, check=False)
    assert proc.returncode == 3, proc.stderr
    assert "MISMATCH" in proc.stdout and "runner.strict_lossless" in proc.stderr
