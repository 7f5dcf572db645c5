"""What this transformers version calls the KV cache, in one place.

transformers 5.24 renamed the cache argument and output field ``past_key_values`` to ``cache`` (the old name is
deprecated there, with a FutureWarning on every call, and goes in 5.40; 5.20-5.23 still use the old one); the CPU
lock (constraints-cpu.txt) names 5.19, a GPU install gets the newest. Every call into transformers that passes or
reads a cache goes through these helpers, so the code runs on both sides of the rename without the warning
(tests/test_dependencies.py here; ``make test-newest`` on the newest 5.x).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from transformers.modeling_outputs import CausalLMOutputWithPast

# the field a model output holds its cache in
OUTPUT_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def cache_argument(function: Callable | Any) -> str:
    """``cache`` where ``function`` (a model or module: its ``forward``) takes it by that name, else
    ``past_key_values``. The deprecation decorator keeps the new signature visible (functools.wraps)."""
    target = getattr(function, "forward", function)
    return "cache" if "cache" in inspect.signature(target).parameters else "past_key_values"


def returned_cache(out):
    """The cache a model call returned, by either name."""
    return out["cache"] if "cache" in out else out["past_key_values"]


def causal_lm_output(logits, cache) -> CausalLMOutputWithPast:
    """A causal LM's output holding ``cache`` under this version's field name."""
    return CausalLMOutputWithPast(logits=logits, **{OUTPUT_FIELD: cache})
