"""Where another engine (vLLM) finds a ``model=`` pair on disk, and the tokenizer side of the pair.

Keyed by the model config's ``_target_`` (the loader our own loops call): the embedded pair is its converted
checkpoint directories (converted once, as for engine=hf), a hub pair its ids or local dirs, a tiny random
pair is built as for engine=hf and written once under ``$SPECBENCH_CACHE/tiny/<digest>/``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from ..errors import ConfigError
from ..models.pair import encode_prompt, eos_ids_of
from ..backends.precision import precision_of_config
from .vllm_methods import ModelFiles


def embedded_files(model: dict, dtype: str) -> ModelFiles:
    from ..models.embedded import DRAFT, TARGET, prepare

    target, draft = prepare(TARGET, dtype), prepare(DRAFT, dtype)
    return ModelFiles(target=str(target), draft=str(draft), tokenizer=str(target), dtype=dtype)


def hub_files(model: dict, dtype: str) -> ModelFiles:
    return ModelFiles(target=model["target"], draft=model.get("draft"), tokenizer=model.get("tokenizer") or
                      model["target"], dtype=dtype, trust_remote_code=bool(model.get("trust_remote_code")),
                      local_files_only=bool(model.get("local_files_only", True)))


def tiny_files(model: dict, dtype: str) -> ModelFiles:
    """The tiny random pair engine=hf builds, saved as two checkpoints with its byte tokenizer."""
    from ..files import cache_root, publish, staging_path
    from ..models.tiny import build_tiny_pair

    settings = {k: v for k, v in model.items() if k not in ("_target_", "device", "linear_kernel")}
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]
    root = cache_root() / "tiny" / f"{model.get('name', 'tiny')}-{digest}"
    if not (root / "draft" / "config.json").exists():
        pair = build_tiny_pair(**{**settings, "device": "cpu", "linear_kernel": "torch"})
        for role, lm in (("target", pair.target), ("draft", pair.draft)):
            staged = staging_path(root / role)
            lm.save_pretrained(staged)
            pair.tokenizer.save_pretrained(staged)
            publish(staged, root / role)
    return ModelFiles(target=str(root / "target"), draft=str(root / "draft"), tokenizer=str(root / "target"),
                      dtype=dtype)


LOCATORS = {
    "specbench.models.embedded.load_embedded_pair": embedded_files,
    "specbench.models.hub.load_hub_pair": hub_files,
    "specbench.models.tiny.build_tiny_pair": tiny_files,
}


def check_locatable(model: dict) -> None:
    if model.get("_target_") not in LOCATORS:
        raise ConfigError(f"model._target_: engine=vllm loads pairs from checkpoints; {model.get('_target_')!r} is "
                          f"not one it can locate (valid: {', '.join(sorted(LOCATORS))})")


def locate(model: dict) -> ModelFiles:
    """The pair's files (converting or writing them once if needed)."""
    check_locatable(model)
    return LOCATORS[model["_target_"]](model, precision_of_config({**model, "backend": "transformers"}).dtype)


@dataclass
class PromptCodec:
    """The text side of a pair without its weights: the same prompts (chat template or not) and decoding as the
    ModelPair of engine=hf, and the EOS ids (tokenizer + the target's generation config)."""

    tokenizer: object
    chat_template: bool
    eos_ids: set[int]

    @classmethod
    def load(cls, files: ModelFiles, model: dict) -> PromptCodec:
        from transformers import AutoTokenizer, GenerationConfig

        kwargs = dict(local_files_only=files.local_files_only, trust_remote_code=files.trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(files.tokenizer, **kwargs)
        try:
            generation = [GenerationConfig.from_pretrained(files.target, **kwargs)]
        except OSError:  # no generation_config.json
            generation = []
        eos = eos_ids_of(tokenizer, *generation, extra=model.get("eos_token_ids") or ())
        return cls(tokenizer, bool(model.get("chat_template", False)), eos)

    def encode(self, prompt, chat: bool | None = None) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.chat_template if chat is None else chat)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

