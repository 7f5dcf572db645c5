"""What a run's numbers mean, computed in one place each: speed-up, τ and intervals (metrics.py, over identical
work: identical_work.py), forward costs, the bound and efficiency (costs.py, cost_tables.py), proposal lengths
tuned from costs (autotune.py), the losslessness verdicts (lossless.py, lossless_rows.py) and the console
table (console.py)."""
