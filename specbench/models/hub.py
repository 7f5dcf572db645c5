"""Model pairs by Hugging Face id (or local directory) for people with GPUs and hub access.

By default nothing is downloaded (``local_files_only: true``): the weights must already be in the
local Hugging Face cache, or ``model.target``/``model.draft`` must point at local directories. Set
``model.local_files_only=false`` to let transformers download them.
"""
from __future__ import annotations

from ..errors import ConfigError
from .pair import ModelPair, attention_of, eos_ids_of, prepare_for_inference
from ..backends.choice import resolve_backend
from ..backends.execution import announce_execution, resolve_attention, resolve_execution
from ..backends.choice import placement_device
from ..backends.precision import announce, resolve_precision
from ..backends.torch.static_support import check_static_attention, check_static_checkpoint


def _load(role: str, name: str, model_id: str, local_files_only: bool, **kwargs):
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(model_id, local_files_only=local_files_only, **kwargs)
    except (OSError, ValueError) as exc:
        hint = ("it is not in the local Hugging Face cache and downloads are off (model.local_files_only=true)"
                if local_files_only else f"loading failed: {exc}")
        raise ConfigError(
            f"model.{role}: cannot load '{model_id}' for pair '{name}': {hint}. Point it at a local checkpoint "
            f"with model.{role}=/path/to/dir, or allow downloads with model.local_files_only=false "
            "(needs hub access; gated models also need a token)."
        ) from exc


def load_hub_pair(name: str, target: str, draft: str | None, dtype: str = "auto", device_map: str | None = "auto",
                  trust_remote_code: bool = False, local_files_only: bool = True, chat_template: bool = False,
                  attn_implementation: str | None = None, tokenizer: str | None = None,
                  eos_token_ids: list[int] | None = None, linear_kernel: str = "auto", load_draft: bool = True,
                  execution: str = "auto", buckets: list[int] | None = None, cache_length: int | None = None,
                  backend: str = "transformers",
                  **_) -> ModelPair:
    """A pair loaded by hub id or local directory; load_draft=False leaves the draft unloaded (no method of the
    run uses it: ``components.needs_draft_model``)."""
    from transformers import AutoTokenizer

    placement = placement_device(device_map)
    resolve_backend(backend, placement, gguf=False, pair=name)  # llamacpp runs GGUF files: model=gguf
    precision = resolve_precision(dtype, placement, linear_kernel)
    runs = resolve_execution(execution, placement, buckets, cache_length)
    announce(precision, name)
    announce_execution(runs, name)
    kwargs = dict(dtype=precision.torch_dtype, trust_remote_code=trust_remote_code)
    if device_map:
        kwargs["device_map"] = device_map
    attention = resolve_attention(attn_implementation, placement)
    check_static_attention(runs, attention)
    if attention:
        kwargs["attn_implementation"] = attention
    for role, model_id in (("target", target), ("draft", draft if load_draft else None)):
        if model_id:  # RoPE scaling, sliding windows: from config.json, before any weights load
            check_static_checkpoint(runs, model_id, role, missing_ok=True, local_files_only=local_files_only,
                                    trust_remote_code=trust_remote_code)
    tokenizer_id = tokenizer or target
    try:
        tok = AutoTokenizer.from_pretrained(tokenizer_id, local_files_only=local_files_only,
                                            trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"model.tokenizer: cannot load the tokenizer '{tokenizer_id}' for pair '{name}' offline; point "
            f"model.target (or model.tokenizer) at a local directory or set model.local_files_only=false"
        ) from exc
    target_model = prepare_for_inference(_load("target", name, target, local_files_only, **kwargs), precision=precision)
    draft_model = (prepare_for_inference(_load("draft", name, draft, local_files_only, **kwargs), precision=precision)
                   if draft and load_draft else None)
    return ModelPair(
        name=name, target=target_model, draft=draft_model, tokenizer=tok,
        eos_ids=eos_ids_of(tok, target_model, extra=eos_token_ids or ()), precision=precision,
        chat_template=chat_template, execution=runs,
        info={"target": target, "draft": draft if draft_model is not None else None,
              "attn_implementation": attention_of(target_model)},
    )
