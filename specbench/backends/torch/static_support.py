"""What a static cache (``model.execution: static`` or ``graphs``: backends/torch/static_cache.py) can run, refused up
front otherwise — the attention kernel from the config before anything loads, the model's own settings from its
config.json before its weights load. A static forward feeds explicit positions and its own additive mask over the
preallocated cache (stale positions masked, a tree's ancestors), so:

- attention must take that mask as given: transformers' ``sdpa`` or ``eager`` (its default here is one of them);
  flash-attention and flex attention build their masks from sequence lengths and would drop or bypass ours;
- RoPE must not depend on the length seen: ``dynamic`` and ``longrope`` recompute their frequencies from the
  largest position fed, which a padded bucket or a rolled-back cache changes;
- every layer must attend to the whole context: a sliding-window layer needs a cache layer of its own kind, and
  the static cache declares none (``is_sliding = False``).

``model.execution=eager`` runs all of these.
"""
from __future__ import annotations

from ...errors import ConfigError

STATIC_ATTENTION = ("sdpa", "eager")  # None (transformers' default) is sdpa or eager for the models here
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


def check_static_attention(execution, attention: str | None, key: str = "model.attn_implementation") -> None:
    """``attention``: the resolved ``model.attn_implementation`` (execution.resolve_attention)."""
    if execution.static and attention is not None and attention not in STATIC_ATTENTION:
        raise ConfigError(f"{key}: {attention!r} builds its own attention mask, which a static cache "
                          f"(model.execution={execution.mode}) replaces with its own; valid with it: "
                          f"{list(STATIC_ATTENTION)} or null (transformers' default), or model.execution=eager")


def check_config_attention(model_cfg: dict) -> None:
    """check_static_attention on a ``model`` config (a plain dict), resolved as the loaders resolve it."""
    from ..choice import placement_device
    from ..execution import execution_of_config, resolve_attention

    device = model_cfg.get("device") or placement_device(model_cfg.get("device_map"))
    check_static_attention(execution_of_config(model_cfg), resolve_attention(model_cfg.get("attn_implementation"),
                                                                             device))


def rope_types(config) -> set[str]:
    """The RoPE types a transformers config names (``rope_parameters``, transformers 5; ``rope_scaling`` before),
    per layer kind where a config keeps one dict per kind."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if not isinstance(rope, dict):
        return set()
    if "rope_type" in rope or "type" in rope:
        return {rope.get("rope_type") or rope.get("type")}
    return {v.get("rope_type") or v.get("type") for v in rope.values() if isinstance(v, dict)} - {None}


def static_problems(config) -> list[str]:
    """What in a transformers model config a static cache cannot run (empty: nothing)."""
    problems = []
    length_dependent = rope_types(config) & set(LENGTH_DEPENDENT_ROPE)
    if length_dependent:
        problems.append(f"RoPE scaling {sorted(length_dependent)} (its frequencies change with the largest position "
                        "fed)")
    kinds = set(getattr(config, "layer_types", None) or ())
    window = getattr(config, "sliding_window", None)
    if kinds - {"full_attention"}:
        problems.append(f"layers of kind {sorted(kinds - {'full_attention'})} (a static cache holds full attention "
                        "layers only)")
    elif not kinds and window and getattr(config, "use_sliding_window", True):
        problems.append(f"a sliding attention window of {window} tokens (a static cache holds full attention only)")
    return problems


def check_static_config(execution, config, role: str, model_id: str) -> None:
    """Refuse a model a static cache cannot run, from its config (before its weights load)."""
    if not execution.static:
        return
    problems = static_problems(config)
    if problems:
        raise ConfigError(f"model.execution: {execution.mode} runs a static cache, and the {role} '{model_id}' has "
                          f"{'; '.join(problems)}; valid for it: model.execution=eager")


def check_static_checkpoint(execution, path_or_id: str, role: str, missing_ok: bool = False, **kwargs) -> None:
    """check_static_config on a checkpoint's config.json (AutoConfig: no weights read; ``kwargs``: its loading
    options, e.g. local_files_only, trust_remote_code). ``missing_ok``: a config that cannot be read is left to the
    loader, which says how to point at the checkpoint."""
    if not execution.static:
        return
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path_or_id, **kwargs)
    except (OSError, ValueError):
        if missing_ok:
            return
        raise
    check_static_config(execution, config, role, str(path_or_id))
