"""transformers models: eager over a DynamicCache (cached_lm.py), over a static cache with CUDA graphs where they
run (static_lm.py, static_cache.py, graphs.py), oneDNN-prepacked linear layers on CPUs (cpu_linear.py)."""
