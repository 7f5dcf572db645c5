"""Feature-level draft heads (EAGLE, GRIFFIN) trained here on the target: training data first (sharegpt.py)."""
