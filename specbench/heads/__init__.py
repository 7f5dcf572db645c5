"""Feature-level draft heads (EAGLE, GRIFFIN) trained here on the target: ShareGPT prompts (sharegpt.py), the
target's own answers and features (extract.py), the heads (model.py), training (train.py), the pipeline
(pipeline.py, ``python -m specbench.heads``), artifacts (artifact.py) and EAGLE-2's dynamic tree
(dynamic_tree.py) that ``method=eagle`` / ``method=griffin`` draft with."""
