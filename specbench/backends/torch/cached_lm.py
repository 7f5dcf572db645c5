"""A causal LM together with its KV cache: feed new tokens, get their logits, crop or gather the cache (the
LanguageModel interface, language_model.py, on transformers with a DynamicCache)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Sequence

import torch

from .cache_api import cache_argument, returned_cache
from ...timing import ForwardClock
from ..staging import ids_on, rows_at, to_device
from ..language_model import check_forward_inputs
from ..token_tree import tree_inputs


class CachedLM:
    """Wraps a Hugging Face causal LM (batch size 1) and owns its DynamicCache.

    vocab: the vocabulary the returned logits are laid out in, when it is not the model's own (a draft whose
    padded vocabulary differs from the target's, e.g. CodeLlama 34B 32000 / 7B 32016): logits are cut to it,
    or padded with -inf (ids the model does not have get probability 0 and are never its argmax).
    """

    def __init__(self, model: torch.nn.Module, vocab: int | None = None):
        self.model = model
        self.vocab = vocab
        self.device = next(model.parameters()).device  # where input ids go (the embedding's device)
        self.cache = None
        self.cache_arg = cache_argument(model)  # what this transformers version calls the cache argument
        self.sizes: list[int] = []  # tokens fed per model call since reset(), in order
        self.rows: list[int] = []  # rows of logits each call computed (keep_last), in order
        self.contexts: list[int] = []  # positions cached before each call (what its attention read besides itself)
        self.clock = ForwardClock(self.device)  # wall ms of each call (on the CPU only: timing.ForwardClock)

    @property
    def forwards(self) -> int:
        """Raw count of model calls since reset()."""
        return len(self.sizes)

    def reset(self) -> None:
        self.cache = None
        self.sizes, self.rows, self.contexts = [], [], []
        self.clock.reset()

    @property
    def length(self) -> int:
        """Number of positions held in the KV cache."""
        return 0 if self.cache is None else int(self.cache.get_seq_length())

    @torch.inference_mode()
    def forward(self, ids: Sequence[int] | torch.Tensor, keep_last: int | None = None,
                parents: Sequence[int] | None = None, cached_parents: Sequence[int] = ()) -> torch.Tensor:
        """Run the model on ``ids`` after the cached prefix; return float32 logits (n, V). ``ids``: Python ints, or
        an (n,) tensor of ids already on a device (read by nothing: staging.ids_on).

        keep_last: only compute logits for the last n positions (prefill needs one row, not
        prompt_len x vocab).
        parents: feed ``ids`` as a token tree (see token_tree.py) instead of a sequence; the cache then
        holds every node, and the caller keeps the accepted path with ``keep_positions``.
        cached_parents: with ``parents``, the parent links of the tree nodes the cache already ends with (fed
        by earlier tree calls); ``parents`` then number nodes on from them, so new nodes can hang from cached
        ones (token_tree.tree_inputs). A tree grows one level per call this way; ``crop`` drops it again.
        """
        check_forward_inputs(self, ids, parents, cached_parents)
        self.clock.start()
        input_ids = ids_on(ids, self.device)[None]  # (1, n)
        kwargs = {}
        if keep_last is not None:
            kwargs["logits_to_keep"] = keep_last
        if parents is not None:
            dtype = next(self.model.parameters()).dtype
            kwargs["attention_mask"], kwargs["position_ids"] = tree_inputs(parents, self.length, dtype, self.device,
                                                                            cached_parents)
        before = self.length
        logits = self._run(input_ids, kwargs)
        self.contexts.append(before)
        self.sizes.append(len(ids))
        self.rows.append(min(keep_last or len(ids), len(ids)))
        logits = fit_vocabulary(logits[0].float(), self.vocab)
        self.clock.stop()
        return logits

    def _run(self, input_ids: torch.Tensor, kwargs: dict) -> torch.Tensor:
        """One model call on (1, n) ids after the cache; keeps the new cache, returns (1, k, V) logits."""
        out = self.model(input_ids=input_ids, use_cache=True, **{self.cache_arg: self.cache}, **kwargs)
        self.cache = returned_cache(out)
        return out.logits

    def features_at(self, rows: Sequence[int]) -> torch.Tensor | None:
        """The last call's hidden states at ``rows`` of what it was fed; None: this model keeps none."""
        return None

    def crop(self, new_length: int) -> None:
        """Drop cache entries past ``new_length`` (transformers 5: crop takes a negative count)."""
        if new_length > self.length:
            raise ValueError(f"cannot crop a cache of {self.length} positions to {new_length}")
        if new_length < self.length:
            self.cache.crop(new_length - self.length)

    def keep_positions(self, positions: Sequence[int] | torch.Tensor) -> None:
        """Keep only the given cache positions, in order (for non-contiguous accepted paths)."""
        index = torch.as_tensor(positions, dtype=torch.long)
        on_device: dict[torch.device, torch.Tensor] = {}  # with device_map=auto, layers sit on several GPUs
        for layer in self.cache.layers:
            device = layer.keys.device
            if device not in on_device:
                on_device[device] = to_device(index, device)
            layer.keys = layer.keys.index_select(-2, on_device[device])
            layer.values = layer.values.index_select(-2, on_device[device])


def fit_vocabulary(logits: torch.Tensor, vocab: int | None) -> torch.Tensor:
    """(n, V_model) logits -> (n, vocab): cut, or padded with -inf (see CachedLM)."""
    if vocab is None or logits.shape[-1] == vocab:
        return logits
    if logits.shape[-1] > vocab:
        return logits[..., :vocab]
    return torch.nn.functional.pad(logits, (0, vocab - logits.shape[-1]), value=float("-inf"))


class FeatureLM(CachedLM):
    """A CachedLM that also keeps the features of every position it is fed: the target's last hidden state
    (after its final norm, before ``lm_head``), F_t in EAGLE's and GRIFFIN's notation, what a feature-level
    draft head reads. The model runs as its base model + output embeddings, so logits are ``lm_head(F)``: a
    model whose logits are more than that (a soft-capped Gemma) is refused.

    layers (EAGLE-3): the features are instead the inputs of these decoder layers, concatenated, (n, 3H) for
    its low / mid / high layers, read by forward pre-hooks during the same forward (no second pass, nothing
    computed twice; the hooks stay on for that one call only).
    """

    def __init__(self, model: torch.nn.Module, vocab: int | None = None, layers: Sequence[int] = ()):
        super().__init__(model, vocab)
        self.check_model(model)
        self.layers = tuple(layers)
        self.hidden: torch.Tensor | None = None  # (n, H) (layers: (n, len(layers)·H)) of the last call

    @staticmethod
    def check_model(model: torch.nn.Module) -> None:
        """Feature heads read lm_head(F) as the logits: a model whose logits are more than that is refused."""
        for attribute in ("final_logit_softcapping", "logit_scale"):
            if getattr(model.config, attribute, None):
                raise ValueError(f"{type(model).__name__} applies {attribute} after lm_head; feature heads read "
                                 "lm_head(F) as the logits")

    def _run(self, input_ids, kwargs):
        keep = kwargs.pop("logits_to_keep", None)
        with layer_inputs(self.model, self.layers) as states:
            out = self.model.base_model(input_ids=input_ids, use_cache=True, **{self.cache_arg: self.cache},
                                        **kwargs)
        self.cache = returned_cache(out)
        hidden = out.last_hidden_state  # (1, n, H)
        self.hidden = torch.cat(states, dim=-1)[0] if self.layers else hidden[0]
        return self.model.get_output_embeddings()(hidden if keep is None else hidden[:, -keep:])

    def features_at(self, rows):
        return rows_at(self.hidden, list(rows))


@contextmanager
def layer_inputs(model: torch.nn.Module, layers: Sequence[int]):
    """Within the block, the model's forwards record the input of each decoder layer in ``layers``; after it,
    the yielded list holds them ((b, n, H) each, in ``layers``' order: EAGLE-3's low / mid / high features)."""
    states: list[torch.Tensor] = []
    if not layers:
        yield states
        return
    decoder = getattr(model.base_model, "layers", None)
    if decoder is None:
        raise ValueError(f"{type(model).__name__} has no decoder layers list to read features from")
    found: dict[int, torch.Tensor] = {}
    hooks = [decoder[i].register_forward_pre_hook(lambda module, args, i=i: found.__setitem__(i, args[0]))
             for i in sorted(set(layers))]
    try:
        yield states
    finally:
        for hook in hooks:
            hook.remove()
    states += [found[i] for i in layers if i in found]


def draft_lm(pair) -> CachedLM:
    """The pair's draft, its logits laid out in the target's vocabulary (ModelPair.vocab_size), in the pair's
    execution mode."""
    return pair.lm("draft")
