"""What a run's summary holds, declared once: ``Summary`` (a typed dict, as it is written to ``<run>.summary.json``
and read by the console, the reports and the pipelines), its losslessness part (``Verdicts``) and the measurement
facts the engine adds (``run/summaries.finish``). ``metrics.summarize`` computes the numbers; tests/test_summary.py
fails on a key computed anywhere and not declared here. The rules behind each number: docs/design.md."""
from __future__ import annotations

from typing import TypedDict


class Verdicts(TypedDict, total=False):
    """Outputs against greedy's at T = 0, one per prompt (its first repeat; metrics.losslessness)."""

    identical: int | None        # token for token greedy's
    compared: int                # prompts with a baseline output to compare
    near_ties: int               # diverged only where the two forwards' preferences were within the measured noise
    mismatches: int              # diverged beyond it: a bug
    unclassified: int            # diverged, and no verdict was recorded for that divergence
    first_divergence: dict       # prompt -> the first token index where the outputs part (None: identical)
    divergences: dict            # prompt -> its verdict
    largest_gap: dict            # the near-tie whose gap came closest to its tolerance: prompt, gap, tolerance


class Summary(Verdicts, total=False):
    # the records measured (metrics.summarize)
    prompts: int
    repeats: int
    new_tokens: int
    wall_s: float
    tok_per_s: float | None              # Σ tokens / Σ time
    tok_per_s_std: float | None          # over repeats
    tok_per_s_prompt_mean: float | None
    ms_per_token: float | None
    prefill_s_mean: float | None
    tau: float | None                    # tokens per target forward, pooled (over identical work at T = 0)
    tau_decoding: float | None           # the same without the prefill's forward
    tau_whole: float | None              # over the whole outputs
    tau_decoding_whole: float | None
    tau_ci95: list | None
    tau_prompt_mean: float | None
    acceptance_rate: float | None        # accepted / drafted
    alpha: list | None                   # α_k: per-position acceptance
    target_forwards: int
    draft_forwards: int
    accuracy: dict | None                # the dataset's task score, aggregated
    is_baseline: bool
    # against the baseline (metrics.compare; over identical work at T = 0: metrics.over_identical_work)
    speedup: float | None                # mean of paired per-prompt ratios (or a ratio of sums, unpaired)
    speedup_ci95: list | None            # its 95% bootstrap interval over prompts
    speedup_whole: float | None          # the same over whole outputs
    speedup_whole_ci95: list | None
    speedup_total: float | None          # Σ tokens / Σ time over the baseline's: what the bound is compared with
    speedup_std: float | None            # over repeats
    speedup_prompt_mean: float | None
    paired: bool                         # the baseline was timed in the method's rounds
    pairs: int
    unpaired_records: int
    baseline_tok_per_s: float | None
    baseline_prompts: int
    identical_work: dict                 # the cell's identical-work flags (UNLIKE)
    identical_work_prompts: dict         # per prompt: tokens compared, shared prefix, clock, ratio
    # batched engines (engine=vllm: metrics.throughput_compare)
    batch_size: int
    batch_tok_per_s: float | None
    throughput_speedup: float | None
    throughput_speedup_ci95: list | None
    throughput_speedup_total: float | None
    batches: int
    baseline_batch_tok_per_s: float | None
    # the run and how it was measured (run/summaries.finish and the engine's EngineRun.after)
    run_key: str
    method: str
    pair: str
    data: str
    baseline_run_key: str
    records: str                         # the records file
    tuned: dict                          # what a proposal length of ``auto`` chose
    precision: dict
    dtype: str
    threads: int
    bound: dict                          # the bound from this machine's forward costs, and ``efficiency``
    execution: dict                      # static cache / CUDA graphs: the mode and its (untimed) captures
    engine: str                          # engine=vllm: "vllm <version>"; engine=llama_server: "llama-server"
    device: str
    serving: dict                        # served runs: the load level, the SLO, each server's latency percentiles,
                                         # throughput and goodput, and the paired speed-up (analysis/latency.py)


SUMMARY_KEYS = Summary.__required_keys__ | Summary.__optional_keys__


def numeric_keys() -> set[str]:
    """The summary's numbers (an int or float, or None where not measured): what ``objective`` may name."""
    import typing

    def numeric(annotation) -> bool:
        kinds = typing.get_args(annotation) or (annotation,)
        return any(k in (int, float) for k in kinds) and bool not in kinds

    return {key for key, annotation in typing.get_type_hints(Summary).items() if numeric(annotation)}


def undeclared(summary: dict) -> set[str]:
    """Keys of ``summary`` that ``Summary`` does not declare (a number added without saying what it is)."""
    return set(summary) - SUMMARY_KEYS
