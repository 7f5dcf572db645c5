"""Draft heads: EAGLE / GRIFFIN / EAGLE-3 layers and Medusa / Hydra heads (draft_head.py, medusa.py), how trained
heads are stored and named (artifact.py, names.py, speculators_format.py) and how their forwards run (run/runner.py)."""
