"""``model.execution: static | graphs``: the LanguageModel interface (language_model.py) over a preallocated KV
cache, forwards padded to buckets and (graphs) replayed from CUDA graphs captured once per (model, bucket).
gpt-fast's recipe.

One ``StaticModel`` per (model, role) owns the buffers: the StaticKV cache (static_cache.py), and per bucket B
and key span S the static inputs of a forward — ids (1, B), position ids (1, B), the write start (1,), what each
row sees ``visible`` (B, S) — and the function over them: additive mask from ``visible``, keys written at
start + 0..B-1, attention over the cache's first S positions only, the base model's last hidden state (1, B, H)
out. In ``graphs`` mode that function is captured once per (B, S) (before any timing: at the first use of the
model, in the runner's warm-up) and replayed. The spans (``kv_spans``: powers of two from 64, then the capacity)
keep a forward's attention, and the K/V copies of grouped-query attention, to at most twice the context it reads
rather than the whole capacity.

A ``StaticLM`` is one generation's view of it (what CachedLM is in eager mode): a logical ``length``; ``forward``
writes the tokens' ids and positions into the smallest bucket that holds them (padding rows see only themselves
and write past the logical end, where nothing reads them), sets ``visible`` (the prefix, then the block's own
causal or tree pattern), runs or replays, and applies the output embeddings to the rows asked for only. ``crop``
just lowers the length (the stale positions are masked out, then overwritten); ``keep_positions`` copies the
accepted path's keys and values into place (StaticKV.move). A block larger than every bucket (a prefill) runs
the same function unpadded and uncaptured.

The capacity is sized to the run (``ModelPair.reserve``: longest prompt + budget + the largest bucket) rather than
to the model's context, once, before timing.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Sequence

import torch

from ...errors import ConfigError
from .cache_api import cache_argument
from ...timing import ForwardClock
from .cached_lm import fit_vocabulary, layer_inputs
from .graphs import cuda_capture  # noqa: F401  (looked up here by ModelPair.static_for: tests stand it in)
from .static_cache import StaticKV
from ..staging import host_buffer, rows_at, to_device
from ..language_model import check_forward_inputs
from ..token_tree import tree_layout

DEFAULT_CAPACITY = 256  # positions when nothing was reserved (tests, direct use); grows on demand


def output_head(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """hidden (…, H) -> logits, as the model's own forward computes them after its base model: the output
    embeddings, then Gemma's final soft-capping where the config has one. A model whose logits need more (a
    logit scale) is refused with the mode that runs it."""
    config = model.config
    if getattr(config, "logit_scale", None):
        raise ConfigError(f"model.execution: {type(model).__name__} scales its logits after lm_head; static and "
                          "graphs execution compute logits as lm_head(hidden): use model.execution=eager")
    head = model.get_output_embeddings()
    cap = getattr(config, "final_logit_softcapping", None)
    if not cap:
        return head
    return lambda hidden: torch.tanh(head(hidden) / cap) * cap


class Block:
    """The static inputs of a forward of ``size`` rows attending to the cache's first ``span`` positions (module
    docstring); ``features`` (size, F) where the forward also reads a feature per row (a draft head)."""

    def __init__(self, owner: "BucketedForward", size: int, span: int):
        self.owner, self.size, self.span = owner, size, span
        device = owner.device
        self.inputs = torch.zeros(2 * size + 1, dtype=torch.long, device=device)  # ids | positions | start
        self.ids, self.positions = self.inputs[:size].view(1, size), self.inputs[size:2 * size].view(1, size)
        self.start = self.inputs[2 * size:]
        self.rows = torch.arange(size, device=device)
        self.visible = torch.zeros(size, span, dtype=torch.bool, device=device)
        self.features = (torch.zeros(size, owner.feature_size, dtype=owner.feature_dtype, device=device)
                         if owner.feature_size else None)
        self.replay: Callable | None = None  # graphs: the captured forward

    def run(self):
        return self.replay() if self.replay is not None else self.owner.compute(self)


SMALLEST_SPAN = 64  # the shortest key span a forward attends over (kv_spans)


def kv_spans(capacity: int) -> tuple[int, ...]:
    """The key spans forwards are bucketed by: powers of two from SMALLEST_SPAN below ``capacity``, then it."""
    spans, span = [], SMALLEST_SPAN
    while span < capacity:
        spans.append(span)
        span *= 2
    return (*spans, capacity)


def capacity_for(needed: int, buckets: Sequence[int]) -> int:
    """The cache positions ``needed`` positions take: plus the largest bucket (a forward padded to it near the end
    writes that far), rounded up to a multiple of 64."""
    return -(-(needed + max(buckets)) // 64) * 64


class BucketedForward:
    """What static execution shares between a model (StaticModel) and a draft head (models/heads/runner.py): the
    buckets and key spans, one Block per pair, the capacity of the cache, capture, and staging a forward's inputs. A
    subclass says how its cache is allocated and grown and what the forward computes over a Block."""

    feature_size = 0  # F: a per-row feature input (a draft head reads the target's features)
    feature_dtype = torch.float32

    def __init__(self, device: torch.device, buckets: Sequence[int], capacity: int, capture: Callable | None,
                 label: str):
        self.device, self.label, self.capture = device, label, capture
        self.buckets = tuple(sorted(buckets))
        self.capacity = capacity
        self.spans = kv_spans(capacity)
        self.blocks: dict[tuple[int, int], Block] = {}  # (rows B, key span S) -> its Block
        self.session = 0  # the generation that owns the cache now
        self.captures, self.capture_s = 0, 0.0  # graphs captured, seconds spent capturing (never timed)
        self.growths = 0  # times the allocated cache grew (static and graphs alike; each recaptures in graphs)
        self.cols = torch.arange(capacity, device=device)

    # what a subclass provides
    @property
    def allocated(self) -> bool:
        raise NotImplementedError

    def allocate(self, block: Block) -> None:
        """First use: allocate the cache's buffers (with one forward over ``block``, at the far end)."""
        raise NotImplementedError

    def grow_cache(self, capacity: int) -> None:
        raise NotImplementedError

    def compute(self, block: Block):
        """The forward over a Block's static inputs (what a graph captures)."""
        raise NotImplementedError

    # shared
    def open(self) -> int:
        """A new generation takes the cache over (an earlier one's view of it may not be used after)."""
        self.session += 1
        return self.session

    @torch.inference_mode()
    def prepare(self, needed: int, reserving: bool = False) -> None:
        """Have room for ``needed`` positions plus the largest bucket's padding, buffers allocated and (graphs)
        every bucket captured. Called before each forward; does work only at first use and on growth (announced
        when a forward needed it, not when ``reserving`` ahead of time)."""
        room = capacity_for(needed, self.buckets)
        if room > self.capacity:
            capacity = max(2 * self.capacity, room)
            if self.allocated:
                self.growths += 1  # counted in every mode: a growth inside a timed generation is a bug of ours
                if not reserving:
                    print(f"[specbench] {self.label}: static cache grown from {self.capacity} to {capacity} "
                          "positions (model.cache_length, or ModelPair.reserve before timing, avoids this)",
                          file=sys.stderr)
            self.capacity, self.spans = capacity, kv_spans(capacity)
            self.grow_cache(capacity)
            self.cols = torch.arange(capacity, device=self.device)
            self.blocks = {}
        if not self.allocated:
            block = Block(self, 1, self.capacity)
            self._scratch(block)
            self.allocate(block)
        if not self.blocks:
            started = time.perf_counter()
            # largest first: smaller graphs reuse its pool memory
            try:
                for size in sorted(self.buckets, reverse=True):
                    for span in sorted(self.spans, reverse=True):
                        if span < size:
                            continue
                        block = self.blocks[size, span] = Block(self, size, span)
                        if self.capture is not None:
                            self._scratch(block)
                            block.replay = self._captured(block)
                            self.captures += 1
            except Exception:
                self.blocks = {}  # none half-made: a later forward captures them all again, or fails the same way
                raise
            finally:
                self.capture_s += time.perf_counter() - started

    def span_for(self, end: int) -> int:
        """The shortest key span holding positions 0..end-1."""
        return next(span for span in self.spans if span >= end)

    def _scratch(self, block: Block) -> None:
        """Inputs for warm-up and capture: keys written to the last ``block.size`` positions (past anything valid,
        by ``capacity_for``), each row seeing one position of its span (finite, whatever it holds)."""
        block.start.fill_(self.capacity - block.size)
        block.visible.zero_()
        block.visible[block.rows, block.span - block.size + block.rows] = True

    def _captured(self, block: Block):
        try:
            return self.capture(lambda: self.compute(block), self.device)
        except torch.cuda.OutOfMemoryError as exc:
            raise RuntimeError(f"out of GPU memory capturing {self.label}'s graphs (static cache of "
                               f"{self.capacity} positions, buckets {list(self.buckets)}): lower "
                               "model.cache_length or model.buckets") from exc
        except Exception as exc:  # the capture ended (torch.cuda.graph's exit); say which forward could not be
            raise RuntimeError(f"capturing {self.label}'s forward of {block.size} rows over {block.span} positions "
                               f"as a CUDA graph failed ({type(exc).__name__}: {exc}); model.execution=static runs "
                               "the same static forwards without graphs") from exc

    @torch.inference_mode()
    def stage(self, ids: Sequence[int] | torch.Tensor, positions: Sequence[int], start: int, prefix: int,
              local: torch.Tensor, features: torch.Tensor | None = None) -> Block:
        """The Block for ``len(ids)`` rows with their inputs written: ids and position ids, keys to go at
        ``start``.., and row i seeing the positions before ``prefix`` and ``local[i]`` (n, w) over the w positions
        from ``prefix`` (w = start - prefix + n); padding rows see only themselves. ``features`` (n, F)."""
        n = len(ids)
        self.prepare(start + n)
        size = next((b for b in self.buckets if b >= n), n)  # larger than every bucket: unpadded
        span = self.span_for(start + size)
        block = self.blocks[size, span] if (size, span) in self.blocks else Block(self, n, span)
        size = block.size
        width = start - prefix + size  # columns from the prefix to the end of the padded block
        host = host_buffer(2 * size + 1, torch.long, self.device)  # ids, position ids, start: one pinned copy
        on_device = isinstance(ids, torch.Tensor)  # drafted ids kept on the device: copied there, never read
        if not on_device:
            host[:n] = torch.tensor(list(ids), dtype=torch.long)
        host[size:size + n] = torch.tensor(list(positions), dtype=torch.long)
        host[2 * size] = start
        pattern = host_buffer((size, width), torch.bool, self.device)
        pattern[:n, :local.shape[1]] = local
        pad = torch.arange(n, size)
        pattern[pad, width - size + pad] = True
        block.inputs.copy_(host, non_blocking=True)
        if on_device:
            block.inputs[:n].copy_(ids, non_blocking=True)
        torch.lt(self.cols[:span].expand(size, -1), prefix, out=block.visible)
        block.visible[:, prefix:prefix + width].copy_(pattern, non_blocking=True)
        if features is not None:
            block.features[:n].copy_(features)
        return block


class StaticModel(BucketedForward):
    """One transformers model's static cache and bucketed forwards (module docstring). ``capture``: fn -> replay
    callable (graphs: ``cuda_capture``; None: every forward runs directly, the ``static`` mode). ``layers``
    (EAGLE-3's feature taps): the forward also returns the inputs of these decoder layers, concatenated after the
    last hidden state, (1, B, H + len(layers)·H), read by hooks inside the same (captured) forward."""

    def __init__(self, model: torch.nn.Module, buckets: Sequence[int], capacity: int,
                 capture: Callable | None = None, label: str = "model", layers: Sequence[int] = ()):
        super().__init__(model.get_input_embeddings().weight.device, buckets, capacity, capture, label)
        self.model = model
        self.layers = tuple(layers)
        self.hidden_size = model.config.get_text_config().hidden_size
        self.base = model.base_model
        self.head = output_head(model)
        self.cache_arg = cache_argument(self.base)
        dtype = next(model.parameters()).dtype
        self.visible_value = torch.zeros((), dtype=dtype, device=self.device)
        self.hidden_value = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=self.device)
        self.kv = StaticKV(model.config.get_text_config().num_hidden_layers, capacity, self.device)

    @property
    def allocated(self) -> bool:
        return self.kv.ready

    def allocate(self, block: Block) -> None:
        self.compute(block)
        self.kv.consolidate()

    def grow_cache(self, capacity: int) -> None:
        self.kv.grow(capacity)

    def compute(self, block: Block) -> torch.Tensor:
        """Keys written at start + 0..B-1, attention over the first S positions (the additive mask from ``visible``);
        the last hidden state (1, B, H)."""
        self.kv.write_index = block.start + block.rows
        self.kv.span = block.span
        mask = torch.where(block.visible, self.visible_value, self.hidden_value)[None, None]  # (1, 1, B, S)
        with layer_inputs(self.model, self.layers) as taps:
            out = self.base(input_ids=block.ids, position_ids=block.positions, attention_mask=mask,
                            use_cache=True, **{self.cache_arg: self.kv})
        return torch.cat([out.last_hidden_state, *taps], dim=-1) if self.layers else out.last_hidden_state

    @torch.inference_mode()
    def forward(self, ids: Sequence[int] | torch.Tensor, positions: Sequence[int], start: int, prefix: int,
                local: torch.Tensor) -> torch.Tensor:
        """Hidden states (n, H) of ``ids`` (BucketedForward.stage says what the arguments mean)."""
        return self.stage(ids, positions, start, prefix, local).run()[0, :len(ids)]

    @torch.inference_mode()
    def move(self, source: list[int], destination: list[int]) -> None:
        index = to_device(torch.tensor([source, destination], dtype=torch.long), self.device)
        self.kv.move(index[0], index[1])


class StaticLM:
    """The LanguageModel interface (language_model.py) over a StaticModel: one generation's view of its cache.

    vocab: as CachedLM's. features: also keep the last call's hidden states (FeatureLM's ``features_at``)."""

    def __init__(self, static: StaticModel, vocab: int | None = None, features: bool = False):
        self.static, self.vocab, self.keeps_features = static, vocab, features
        self.model = static.model
        self.device = static.device
        self.session = static.open()
        self.length = 0
        self.sizes: list[int] = []  # tokens fed per call, and rows of logits each computed (keep_last)
        self.rows: list[int] = []
        self.contexts: list[int] = []  # positions cached before each call
        self.clock = ForwardClock(self.device)  # wall ms of each call (on the CPU only: timing.ForwardClock)
        self.hidden: torch.Tensor | None = None

    @property
    def forwards(self) -> int:
        return len(self.sizes)

    def reset(self) -> None:
        self.session = self.static.open()
        self.length, self.sizes, self.rows, self.contexts, self.hidden = 0, [], [], [], None
        self.clock.reset()

    def _check(self) -> None:
        if self.session != self.static.session:
            raise RuntimeError(f"{self.static.label}: a newer generation took this static cache over; a StaticLM "
                               "is one generation's (build a new one with ModelPair.lm)")

    @torch.inference_mode()
    def forward(self, ids: Sequence[int] | torch.Tensor, keep_last: int | None = None,
                parents: Sequence[int] | None = None, cached_parents: Sequence[int] = ()) -> torch.Tensor:
        """As CachedLM.forward: float32 logits (keep_last or all rows, V) of ``ids`` (Python ints or an (n,) device
        tensor) after the cached ones."""
        check_forward_inputs(self, ids, parents, cached_parents)
        self._check()
        self.clock.start()
        n, past = len(ids), self.length
        if parents is None:
            prefix, positions = past, list(range(past, past + n))
            local = torch.ones(n, n, dtype=torch.bool).tril()
        else:
            prefix, positions, local = tree_layout(parents, past, cached_parents)
        hidden = self.static.forward(ids, positions, past, prefix, local)  # (n, H), or (n, H + taps): EAGLE-3's
        self.length = past + n
        self.contexts.append(past)
        self.sizes.append(n)
        self.rows.append(min(keep_last or n, n))
        width = self.static.hidden_size
        if self.keeps_features:  # the last hidden state, or EAGLE-3's layer inputs after it
            self.hidden = hidden[:, width:] if self.static.layers else hidden
        hidden = hidden[:, :width]
        rows = hidden if keep_last is None else hidden[n - keep_last:]
        logits = fit_vocabulary(self.static.head(rows).float(), self.vocab)
        self.clock.stop()
        return logits

    def features_at(self, rows: Sequence[int]) -> torch.Tensor | None:
        return rows_at(self.hidden, list(rows)) if self.keeps_features else None

    def crop(self, new_length: int) -> None:
        if new_length > self.length:
            raise ValueError(f"cannot crop a cache of {self.length} positions to {new_length}")
        self._check()
        self.length = new_length  # the positions past it are masked from now on, and overwritten next

    def keep_positions(self, positions: Sequence[int] | torch.Tensor) -> None:
        positions = [int(p) for p in positions]
        if any(p >= self.length or p < 0 for p in positions):
            raise ValueError(f"keep_positions: a position outside the {self.length} cached ones: {positions}")
        self._check()
        moves = [(p, j) for j, p in enumerate(positions) if p != j]
        if moves:
            self.static.move([p for p, _ in moves], [j for _, j in moves])
        self.length = len(positions)
