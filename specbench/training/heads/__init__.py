"""Training feature-level draft heads (EAGLE, GRIFFIN) here on the target: ShareGPT prompts (sharegpt.py), the
target's own answers and features (extract.py), training (train.py) and the pipeline (pipeline.py,
``python -m specbench.training.heads``). The heads themselves (models/heads/draft_head.py) and their artifacts
(models/heads/artifact.py) live with the models, and EAGLE-2's dynamic tree (decoding/dynamic_tree.py) that
``method=eagle`` / ``method=griffin`` draft with lives with the decoding machinery: decoding needs them, not
training alone."""
