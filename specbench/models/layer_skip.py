"""The target run with some of its decoder layers skipped: the draft of self-speculative decoding (Draft & Verify,
Zhang et al. 2023; SWIFT, Xia et al. 2024), built from the target's own modules (no weights copied).

``LayerSkipModel(target, keep)`` shares the target's embedding, final norm, rotary embedding and ``lm_head`` and
holds the kept decoder layers, in order, in a ModuleList of its own. Its KV cache has one slot per layer whose
attention runs: a ``DynamicCache`` of its own, or (``shared_cache``, SWIFT's drafting) a view whose slots are the
target's own cache layers, so the draft reads the target's keys and values and appends to them (the caller crops
them off again). The target's attention modules index the cache by their ``layer_idx`` (their place in the full
model); ``SlotCache`` maps that index to the slot, so the kept layers run unchanged against the compact cache.

It is called like a Hugging Face causal LM (``input_ids``, ``cache``, ``attention_mask`` (a 4-D tree mask too),
``position_ids``, ``logits_to_keep``) and returns ``.logits`` and the cache (cache_api.py): a ``CachedLM``
drives it like any model (crop, keep_positions, tree feeds). ``skip`` drops whole decoder layers; ``skip_attention``
and ``skip_mlp`` drop one sublayer of a layer (SWIFT's search space, Draft & Verify's too): the residual stream passes
the skipped sublayer unchanged, h ← h + MLP(norm₂(h)) for a layer without its attention and h ← h + Attn(norm₁(h))
for one without its MLP (``PartialLayer``, the Llama layout's decoder layer less one half). Only layers whose
attention runs hold a slot in the cache.

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
from ..backends.torch.cache_api import cache_argument, causal_lm_output

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


def attention_runs(skip: Sequence[int], attention: Sequence[int], layers: int) -> bool:
    """Whether a skip set (whole layers ``skip``, attention sublayers ``attention``) leaves an attention sublayer
    running: the cache and the positions live there."""
    return len(set(skip) | set(attention)) < layers


def check_sublayer_sets(attention: Sequence[int], mlp: Sequence[int], layers: int, skip: Sequence[int] = (),
                        keys: tuple[str, str] = ("method.skip_attention", "method.skip_mlp")) -> None:
    """Sublayer skip sets must name existing layers and, with the whole layers ``skip``, leave at least one attention
    sublayer running; ConfigError naming the key."""
    for chosen, key in zip((attention, mlp), keys):
        outside = sorted(i for i in chosen if not 0 <= i < layers)
        if outside:
            raise ConfigError(f"{key}: the target has {layers} decoder layers (0..{layers - 1}); no layer {outside}")
    if not attention_runs(skip, attention, layers):
        raise ConfigError(f"{keys[0]}: {'with method.skip_layers it ' if skip else ''}skips the attention of all "
                          f"{layers} decoder layers; at least one must run")


class PartialLayer(torch.nn.Module):
    """A Llama-layout decoder layer with its attention or its MLP sublayer skipped (module docstring): the
    target's own sublayer modules, composed as the layer composes them, less the skipped half."""

    def __init__(self, layer: torch.nn.Module, attention: bool, mlp: bool):
        super().__init__()
        missing = [name for name in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
                   if not hasattr(layer, name)]
        if missing:
            raise ConfigError(f"method=swift: skipping one sublayer needs the Llama layout's decoder layer; "
                              f"{type(layer).__name__} has no {', '.join(missing)}")
        self.layer, self.attention, self.mlp = layer, attention, mlp
        self.cache_arg = cache_argument(layer.self_attn)

    def forward(self, hidden: torch.Tensor, attention_mask=None, position_embeddings=None, position_ids=None,
                use_cache: bool = True, past_key_values=None, cache=None) -> torch.Tensor:  # hidden: (1, n, H)
        if self.attention:  # the cache under the name the decoder layer took it by
            out = self.layer.self_attn(hidden_states=self.layer.input_layernorm(hidden), attention_mask=attention_mask,
                                       position_ids=position_ids, position_embeddings=position_embeddings,
                                       use_cache=use_cache,
                                       **{self.cache_arg: cache if cache is not None else past_key_values})
            hidden = hidden + out[0]
        if self.mlp:
            hidden = hidden + self.layer.mlp(self.layer.post_attention_layernorm(hidden))
        return hidden


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
    """The target less the decoder layers and sublayers it skips (module docstring). ``skip``, ``skip_attention``,
    ``skip_mlp``: full-model layer indices (whole layers; their attention; their MLP)."""

    def __init__(self, target: torch.nn.Module, skip: Sequence[int] = (), skip_attention: Sequence[int] = (),
                 skip_mlp: Sequence[int] = ()):
        super().__init__()
        layers = decoder_layer_count(target)
        check_skip_set(skip, layers)
        check_sublayer_sets(skip_attention, skip_mlp, layers, skip)
        no_attention, no_mlp = set(skip) | set(skip_attention), set(skip) | set(skip_mlp)
        self.kept = [i for i in range(layers) if not (i in no_attention and i in no_mlp)]  # in order
        self.skip_attention = sorted(no_attention - no_mlp)  # layers that run their MLP alone
        self.skip_mlp = sorted(no_mlp - no_attention)        # layers that run their attention alone
        base = target.model
        self.embed_tokens, self.norm, self.rotary_emb = base.embed_tokens, base.norm, base.rotary_emb
        # the target's modules, shared: a whole layer as it is, a partial one through PartialLayer
        self.layers = torch.nn.ModuleList([
            base.layers[i] if i not in no_attention and i not in no_mlp
            else PartialLayer(base.layers[i], attention=i not in no_attention, mlp=i not in no_mlp)
            for i in self.kept])
        self.lm_head = target.lm_head
        # the attention modules' own indices (their place in the full model) -> the compact cache's slots
        attending = [i for i in self.kept if i not in no_attention]
        self.attending = attending  # full-model indices of the layers whose attention runs: the cache's slots, in order
        self.slots = {base.layers[i].self_attn.layer_idx: slot for slot, i in enumerate(attending)}
        self.layer_cache_arg = cache_argument(base.layers[0])  # what this transformers version calls it
        self.mask_cache_arg = cache_argument(create_causal_mask)
        self.config = copy.copy(target.config)  # a shallow model's config: sizes the cache and the mask
        self.config.num_hidden_layers = len(attending)
        if getattr(self.config, "layer_types", None):
            self.config.layer_types = [target.config.layer_types[i] for i in attending]

    def shared_cache(self, cache: DynamicCache) -> DynamicCache:
        """A cache through which this draft reads and writes the *target's* ``cache`` (SWIFT's drafting): its slots are
        the target's own layer objects of the layers whose attention runs, so what the draft feeds lands in the
        target's cache (crop them off after, as ``SkipDraftLM.end`` does); the target's other layers are untouched."""
        view = copy.copy(cache)
        view.layers = [cache.layers[i] for i in self.attending]
        return view

    def prefix_cache(self, cache: DynamicCache, length: int) -> DynamicCache:
        """A cache holding the first ``length`` positions of the target's ``cache`` for this draft's slots, as views
        (no copy): forwards after it read the target's keys and values and leave the target's cache untouched."""
        view = copy.copy(cache)
        view.layers = []
        for i in self.attending:
            layer = copy.copy(cache.layers[i])
            layer.keys, layer.values = layer.keys[..., :length, :], layer.values[..., :length, :]
            view.layers.append(layer)
        return view

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
