"""What a run records: the record types (schema.py: a turn, a run's record per prompt and repeat) and the
append-only record files with their locks and run keys (store.py)."""
