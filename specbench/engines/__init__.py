"""Engines: what decodes. ``engine=hf`` (default) runs our own loops on transformers models, one request at a
time; ``engine=vllm`` drives vLLM's speculative decoding at any batch size. Both are measured the same way:
same prompts, templates, budgets, scorers, records and summaries, each method against the same engine without
speculation, timed in the same rounds (docs/design.md, rule 9; docs/engines.md).

An engine is a config group (conf/engine/) whose ``_target_`` builds a small settings object; what it must offer
(``Engine``, and the ``EngineRun`` its ``open`` returns) and the one measure path every engine runs through are in
base.py. docs/guides/add-an-engine.md walks through one.
"""
