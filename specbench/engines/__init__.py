"""Engines: what decodes. ``engine=hf`` (default) runs our own loops on transformers models, one request at a
time; ``engine=vllm`` drives vLLM's speculative decoding at any batch size. Both are measured the same way:
same prompts, templates, budgets, scorers, records and summaries, each method against the same engine without
speculation, timed in the same rounds (DESIGN.md rule 11).

An engine is a config group (conf/engine/) whose ``_target_`` builds a small settings object with two methods:
``check(cfg, pair)`` — everything that can be checked before a model loads or an engine starts — and
``measure(cfg, spec, pair)`` — the benchmark itself, returning the method's summary.
"""
