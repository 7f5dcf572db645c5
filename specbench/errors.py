"""Errors a user can act on: each names the config key or file at fault and what would be valid."""


class ConfigError(ValueError):
    """A bad override, value or file in the resolved config. The message names the key."""


def require(condition: bool, key: str, message: str) -> None:
    """Raise ConfigError("<key>: <message>") unless condition holds."""
    if not condition:
        raise ConfigError(f"{key}: {message}")
