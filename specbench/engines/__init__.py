"""Engines: what decodes. ``engine=hf`` (default) runs our own loops on transformers models, one request at a
time; ``engine=vllm`` drives vLLM's speculative decoding at any batch size. Both are measured the same way:
same prompts, templates, budgets, scorers, records and summaries, each method against the same engine without
speculation, timed in the same rounds (docs/design.md, rule 9; docs/engines.md).

An engine is a config group (conf/engine/) whose ``_target_`` builds a small settings object with ``name``,
``identity(cfg)`` — what it adds to a run's identity —, ``check(cfg, pair)`` — everything that can be checked before
a model loads or an engine starts — and ``measure(cfg, spec, pair)`` — the benchmark itself, returning the method's
summary (components.py has the pieces: build, spec_for, threads, the resolution check; summaries.finish ends it).
docs/guides/add-an-engine.md walks through one.
"""
