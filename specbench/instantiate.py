"""``build``: a config node's ``_target_`` instantiated, with our ConfigErrors surfaced and a bad ``_target_`` named by
its key. Every config group becomes an object through it, the methods nested in a method config too (sam_decoding's
fallback), so it sits below everything that builds."""
from __future__ import annotations

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

from .errors import ConfigError, require


def build(node: DictConfig, key: str, **kwargs):
    """hydra.utils.instantiate, with our ConfigErrors surfaced and a bad _target_ named by its key.

    ``kwargs`` (live objects such as the model pair) are passed to the target as they are, not merged
    into the config (Hydra would turn a dataclass into a config node).
    """
    require(isinstance(node, DictConfig) and "_target_" in node, key, "must be a config with a _target_")
    try:
        return instantiate(node, _convert_="all", _partial_=True)(**kwargs)
    except InstantiationException as exc:
        cause = exc.__cause__
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        raise ConfigError(f"{key}._target_: cannot build {node.get('_target_')!r}: {exc}") from exc
