"""Methods that exist only as another engine's implementation (vLLM's EAGLE-3, Medusa, MTP):
their configs name the engine's method and its draft head; our own loops have no such method."""
from __future__ import annotations

from ..errors import ConfigError, positive_int


class EngineMethod:
    """``method=eagle3`` etc.: runs only with ``engine=vllm`` (engines/vllm_methods.py maps it)."""

    def __init__(self, name: str, engine_method: str, head: str | None = None, num_speculative_tokens: int = 4,
                 options: dict | None = None, pair=None, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int = 0):
        positive_int(num_speculative_tokens, "method.num_speculative_tokens")
        raise ConfigError(f"method={name}: runs only with engine=vllm (it is vLLM's {engine_method!r}); our own "
                          "loops (engine=hf) have greedy, speculative, prompt_lookup, specinfer, lookahead, "
                          "ouroboros, hf_assisted, eagle, griffin, suffix and the speculation-length policies")
