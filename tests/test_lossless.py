"""Losslessness that tells near-ties from bugs: a hand-made exact tie is a near-tie, a wrong token a MISMATCH."""
import json

import pytest

from specbench.decoding.cached_lm import CachedLM
from specbench.decoding.generation import Generation, finalize_tokens, is_finished
from specbench.lossless import MISMATCH, NEAR_TIE, LosslessCheck, measure_noise, noise_cache_path
from specbench.methods.base import DecodingMethod, NoTimeline
from specbench.methods.greedy import Greedy
from specbench.models.tiny import build_tiny_pair

from .conftest import run_cli

# every even token's output row copied onto the next (odd) one: each argmax is an exact tie between two tokens,
# which argmax breaks towards the even one
PAIRED_TIES = [[v, v + 1] for v in range(4, 258, 2)]


class TieFlipGreedy(DecodingMethod):
    """Greedy, except that exact ties go to the highest tied token id: correct up to numerics, not greedy's tokens."""

    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()) -> Generation:
        target = CachedLM(self.pair.target)
        logits = target.forward(prompt_ids, keep_last=1)[-1]
        timeline.mark("prefill")
        out = []
        while True:
            out.append(int((logits == logits.max()).nonzero().max()))
            if is_finished(out, max_new_tokens, eos_ids):
                break
            logits = target.forward([out[-1]])[-1]
        gen = Generation(tokens=finalize_tokens(out, max_new_tokens, eos_ids), accept_lengths=[1] * len(out))
        gen.count_forwards(target)
        return gen


class ThirdTokenBug(Greedy):
    """Greedy with a bug: the third token is replaced by the target's least likely token."""

    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()) -> Generation:
        gen = super().generate(prompt_ids, max_new_tokens, eos_ids, timeline)
        if len(gen.tokens) >= 3:
            target = CachedLM(self.pair.target)
            worst = int(target.forward(list(prompt_ids) + gen.tokens[:2], keep_last=1)[-1].argmin())
            gen.tokens[2] = worst
        return gen


@pytest.fixture(scope="module")
def tied_pair():
    return build_tiny_pair(name="tiny-tied", arch="llama", lm_head_ties=PAIRED_TIES)


def test_the_noise_cache_is_the_targets_whether_or_not_the_draft_loaded():
    with_draft, without = build_tiny_pair(), build_tiny_pair(load_draft=False)
    assert noise_cache_path(with_draft, 2) == noise_cache_path(without, 2)
    assert noise_cache_path(with_draft, 2) != noise_cache_path(build_tiny_pair(seed=1), 2)  # another target


def test_noise_profile_is_measured_small_and_nonnegative(tiny_llama):
    profile = measure_noise(tiny_llama.target, [[5, 6, 7, 8], [40, 41]], positions=8, blocks=(2, 4))
    assert set(profile.per_block) == {"causal-2", "tree-2", "causal-4", "tree-4"}
    assert 0 <= profile.max_abs_diff < 1e-3  # fp32: summation-order noise only
    assert profile.tolerance == 4 * profile.max_abs_diff


def test_exact_tie_is_a_near_tie_and_a_wrong_token_a_mismatch(tied_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    prompt = [10, 11, 12, 13]
    greedy = Greedy(tied_pair, "greedy").generate(prompt, 6, set()).tokens
    flipped = TieFlipGreedy(tied_pair, "flip").generate(prompt, 6, set()).tokens
    assert flipped[0] == greedy[0] + 1  # the tie went the other way at the very first token
    check = LosslessCheck(tied_pair, threads=1)
    result = check.classify(prompt, greedy, flipped)
    assert result["verdict"] == NEAR_TIE and result["index"] == 0 and abs(result["gap_step"]) <= result["tolerance"]
    assert list((tmp_path / "noise").glob("*.json")), "the calibration is cached"

    buggy = ThirdTokenBug(tied_pair, "buggy").generate(prompt, 6, set()).tokens
    result = check.classify(prompt, greedy, buggy)
    assert result["verdict"] == MISMATCH and result["index"] == 2
    assert result["gap_step"] > 100 * result["tolerance"]
    assert check.classify(prompt, greedy, list(greedy)) == {"verdict": "identical"}


def tied_model_overrides():
    return ["model.name=tiny-tied", f"+model.lm_head_ties={json.dumps(PAIRED_TIES).replace(' ', '')}"]


def test_cli_counts_near_ties_and_strict_mode_fails_only_on_mismatch(tmp_path):
    records = tmp_path / "records"
    common = ("data.limit=3", "data.max_new_tokens=8", *tied_model_overrides(), "runner.strict_lossless=true")
    proc = run_cli("method=greedy", "method._target_=tests.test_lossless.TieFlipGreedy", "method.name=tie_flip",
                   *common, records_dir=records)
    assert "identical to greedy: 0/3 (3 near-ties), 0 mismatches" in proc.stdout, proc.stdout
    record = json.loads(next(records.rglob("tie_flip-*.jsonl")).read_text().splitlines()[0])
    assert record["lossless"]["verdict"] == "near-tie" and record["lossless"]["index"] == 0

    proc = run_cli("method=greedy", "method._target_=tests.test_lossless.ThirdTokenBug", "method.name=buggy",
                   *common, records_dir=records, check=False)
    assert proc.returncode == 3, proc.stderr
    assert "MISMATCH" in proc.stdout and "runner.strict_lossless" in proc.stderr
