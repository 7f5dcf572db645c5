"""The end of every run, whichever engine measured it: summaries of the method and its baseline, written,
logged and printed, and ``runner.strict_lossless`` enforced."""
from __future__ import annotations

from omegaconf import DictConfig

from ..analysis.costs import efficiency
from ..errors import LosslessnessError
from ..analysis.metrics import summarize
from ..analysis.summary import Summary
from ..analysis.console import render_headline, render_table
from ..files import write_json
from .runner import RunSpec


def finish(cfg: DictConfig, spec: RunSpec, base_spec: RunSpec, records: list, baseline_records, tracker,
           **facts) -> Summary:
    """Summaries of the method (and its baseline), written, logged and printed; runner.strict_lossless enforced.
    ``facts``: what the summary says about how the run was measured (dtype, precision, threads ...)."""
    exact = cfg.sampling.temperature == 0
    is_baseline = base_spec.key == spec.key
    summaries = []
    if baseline_records:
        summaries.append((cfg.baseline.name, summarize(baseline_records, is_baseline=True)))
    summary = summarize(records, baseline_records, exact=exact, is_baseline=is_baseline)
    summary.update(run_key=spec.key, method=spec.method, pair=spec.pair, data=spec.data, **facts,
                   baseline_run_key=base_spec.key, records=str(spec.store.path))
    tuned = next((r.tuned for r in records if r.tuned), None)
    if tuned:
        summary["tuned"] = tuned
    if summary.get("bound") and summary.get("speedup_total"):
        summary["bound"]["efficiency"] = efficiency(summary["speedup_total"], summary["bound"]["bound"])
    write_json(spec.summary_path, summary)
    if tracker is not None:
        tracker.finish(summary)
    summaries.append((spec.method, summary))
    print(render_table(summaries))
    print(render_headline(spec.method, summary))
    unproven = (summary.get("mismatches") or 0) + (summary.get("unclassified") or 0)
    if cfg.runner.strict_lossless and unproven:
        raise LosslessnessError(f"runner.strict_lossless: {unproven} prompt(s) diverge from greedy beyond the "
                                f"measured numerical noise: {summary.get('divergences')} (records: {spec.store.path})")
    return summary
