"""Methods that exist only as another engine's implementation (vLLM's MTP, conf/method/mtp.yaml):
their configs name the engine's method and its draft head; our own loops have no such method."""
from __future__ import annotations

from ..errors import ConfigError, positive_int


def loop_methods() -> list[str]:
    """The ``method=`` options our own loops (engine=hf) run: every conf/method option whose class is not this one."""
    from ..conf_dir import group_options, target_class

    return [name for name in group_options("method") if target_class("method", name) is not EngineMethod]


class EngineMethod:
    """``method=mtp``: runs only with ``engine=vllm`` (engines/vllm_methods.py maps it)."""

    def __init__(self, name: str, engine_method: str, head: str | None = None, num_speculative_tokens: int = 4,
                 options: dict | None = None, pair=None, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int = 0):
        positive_int(num_speculative_tokens, "method.num_speculative_tokens")
        raise ConfigError(f"method={name}: runs only with engine=vllm (it is vLLM's {engine_method!r}); our own "
                          f"loops (engine=hf) have {', '.join(loop_methods())}")
