"""The target run with some of its decoder layers skipped: the draft of self-speculative decoding (Draft & Verify,
Zhang et al. 2023; SWIFT, Xia et al. 2024), built from the target's own modules (no weights copied).

``LayerSkipModel(target, keep)`` shares the target's embedding, final norm, rotary embedding and ``lm_head`` and
holds the kept decoder layers, in order, in a ModuleList of its own. Its KV cache is its own object (a
``DynamicCache`` with one entry per *kept* layer), so the draft role and the target role never share a cache. The
target's attention modules index the cache by their ``layer_idx`` (their place in the full model); ``SlotCache``
maps that index to the kept layer's slot, so the kept layers run unchanged against the compact cache.

It is called like a Hugging Face causal LM (``input_ids``, ``cache``, ``attention_mask`` (a 4-D tree mask too),
``position_ids``, ``logits_to_keep``) and returns ``.logits`` and the cache (cache_api.py): a ``CachedLM``
drives it like any model (crop, keep_positions, tree feeds). Whole decoder layers are skipped (attention and MLP
together); SWIFT may also skip the attention or the MLP sublayer alone, which this module does not do.

Layout: the Llama family as transformers 5 writes it (``model.model.layers`` / ``embed_tokens`` / ``norm`` /
``rotary_emb``, ``lm_head``: Llama, Qwen2, Mistral ...) with full attention in every layer; anything else is a
ConfigError naming what is missing (GPT-2's ``transformer.h`` is not supported).
"""
from __future__ import annotations

import copy
from typing import Sequence

import torch
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..errors import ConfigError
from .cache_api import cache_argument, causal_lm_output

LAYOUT = ("model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb", "lm_head")


def decoder_layer_count(model: torch.nn.Module) -> int:
    """Decoder layers of a supported target (ConfigError, naming what is missing, for one that is not)."""
    for path in LAYOUT:
        node = model
        for part in path.split("."):
            node = getattr(node, part, None)
        if node is None:
            raise ConfigError(f"method=swift: runs the target's decoder layers itself and knows the Llama/Qwen2 "
                              f"layout ({', '.join(LAYOUT)}); {type(model).__name__} has no {path}")
    types = set(getattr(model.config, "layer_types", None) or ["full_attention"])
    if types != {"full_attention"}:
        raise ConfigError(f"method=swift: the target's layers use {sorted(types)}; only full attention is supported "
                          "(a sliding-window layer needs a cache layer of its own kind)")
    return len(model.model.layers)


def runs_layer_skipping(pair) -> bool:
    """Whether ``pair``'s target can draft by layer skipping here (transformers backend, the Llama layout)."""
    if getattr(pair, "backend", "transformers") != "transformers":
        return False
    try:
        return decoder_layer_count(pair.target) >= 2
    except ConfigError:
        return False


def check_skip_set(skip: Sequence[int], layers: int, key: str = "method.skip_layers") -> None:
    """A skip set must name existing layers and leave at least one (ConfigError naming ``key``)."""
    outside = sorted(i for i in skip if not 0 <= i < layers)
    if outside:
        raise ConfigError(f"{key}: the target has {layers} decoder layers (0..{layers - 1}); no layer {outside}")
    if len(set(skip)) >= layers:
        raise ConfigError(f"{key}: skips all {layers} decoder layers; at least one must run")


class SlotCache:
    """A view of the compact cache the target's attention modules write through: ``update(k, v, layer_idx)`` goes to
    the kept layer's slot. Anything else is the compact cache's own."""

    def __init__(self, cache: DynamicCache, slots: dict[int, int]):
        self.cache, self.slots = cache, slots

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        return self.cache.update(key_states, value_states, self.slots[layer_idx], *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.cache, name)


class LayerSkipModel(torch.nn.Module):
    """The target less the decoder layers it skips (module docstring). ``skip``: full-model layer indices."""

    def __init__(self, target: torch.nn.Module, skip: Sequence[int]):
        super().__init__()
        layers = decoder_layer_count(target)
        check_skip_set(skip, layers)
        self.kept = [i for i in range(layers) if i not in set(skip)]  # full-model indices, in order
        base = target.model
        self.embed_tokens, self.norm, self.rotary_emb = base.embed_tokens, base.norm, base.rotary_emb
        self.layers = torch.nn.ModuleList([base.layers[i] for i in self.kept])  # the target's modules, shared
        self.lm_head = target.lm_head
        # the attention modules' own indices (their place in the full model) -> the compact cache's slots
        self.slots = {layer.self_attn.layer_idx: slot for slot, layer in enumerate(self.layers)}
        self.layer_cache_arg = cache_argument(self.layers[0])  # what this transformers version calls it
        self.mask_cache_arg = cache_argument(create_causal_mask)
        self.config = copy.copy(target.config)  # a shallow model's config: sizes the cache and the mask
        self.config.num_hidden_layers = len(self.kept)
        if getattr(self.config, "layer_types", None):
            self.config.layer_types = [target.config.layer_types[i] for i in self.kept]

    def forward(self, input_ids: torch.Tensor, cache: DynamicCache | None = None, use_cache: bool = True,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                logits_to_keep: int = 0) -> CausalLMOutputWithPast:
        cache = cache if cache is not None else DynamicCache(config=self.config)
        hidden = self.embed_tokens(input_ids)  # (1, n, H)
        if position_ids is None:  # right after the cached prefix
            position_ids = (torch.arange(input_ids.shape[1], device=hidden.device) + cache.get_seq_length())[None]
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask,
                                  position_ids=position_ids, **{self.mask_cache_arg: cache})
        rope = self.rotary_emb(hidden, position_ids=position_ids)  # (cos, sin)
        view = SlotCache(cache, self.slots)
        for layer in self.layers:
            out = layer(hidden, attention_mask=mask, position_embeddings=rope, position_ids=position_ids,
                        use_cache=True, **{self.layer_cache_arg: view})
            hidden = out[0] if isinstance(out, tuple) else out
        hidden = self.norm(hidden)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return causal_lm_output(self.lm_head(hidden), cache)
