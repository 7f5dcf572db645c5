"""Training a draft head on extracted data (extract.py): EAGLE's teacher forcing and GRIFFIN's token-alignable
training (TAT), one loss written once.

A sequence x_0..x_{n-1} with features F_0..F_{n-1} gives head positions t = 0..n-3: input (F_t + noise, x_{t+1}),
targets F_{t+1} (regression) and p_t = softmax(lm_head(F_{t+1})) over the draft vocabulary (the target's own
next-token distribution, for x_{t+2}); only answer tokens count (x_{t+2} in the answer, and in the draft
vocabulary). Per pass p and position t (GRIFFIN Eq. 2 and its released code):

    ℓ = 1.0 · SmoothL1(regress, F_{t+1}) + 0.1 · CE(p_t, q_t) [+ 0.5 · CE over the top-10 of p_t, stages ≥ 2]

A stage with P passes (stage j of GRIFFIN has P = j; EAGLE: always 1) runs pass 1 on the target's features,
then pass p ≥ 2 on the previous pass's regressed features shifted one position (the input at t is what the
head predicted for F_t), attending as it would while drafting (stream_mask, models/heads/draft_head.py). The loss
mask of pass p keeps position t only if every token the head would have drafted on the way there was in its top-k
(``align_top_k``; GRIFFIN Eq. 3): M_1 = 1, M_p[t] = A_{p-1}[t-1] · M_{p-1}[t-1], A_p[t] = [x_{t+2} ∈ top-k of
pass p at t]. (The released code checks A at the same position t; we follow the paper's indices.) Loss =
mean over passes (Eq. 5). Noise: uniform (u - 0.5) · 0.2 · 512 / L on the input features, as EAGLE's code.
AdamW betas (0.9, 0.95), gradients clipped by value (0.5), linear warm-up then linear decay per stage.
"""
from __future__ import annotations

import json
import math
import random
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn import functional as F

from ...errors import ConfigError
from ...models.heads.draft_head import DraftHead, TargetParts


@dataclass
class Stage:
    passes: int          # forward passes per step (GRIFFIN stage j: j; EAGLE: 1)
    epochs: float        # passes over the training sequences
    lr: float


@dataclass
class TrainSettings:
    stages: list[Stage]
    batch_tokens: int = 2048       # most (padded) tokens per step
    max_length: int = 1024         # sequences are cut to this many tokens
    noise: float = 0.2
    feature_weight: float = 1.0
    ce_weight: float = 0.1
    topk_loss_weight: float = 0.5  # stages with passes >= 2 (GRIFFIN's code)
    topk_loss_k: int = 10
    align_top_k: int = 3           # 0: no alignment mask ("NA" in GRIFFIN Table 3)
    warmup_steps: int = 20
    clip_value: float = 0.5
    betas: tuple = (0.9, 0.95)
    seed: int = 0
    checkpoint_seconds: float = 300.0
    threads: int = 0               # 0: torch's default

    @classmethod
    def from_dict(cls, d: dict) -> "TrainSettings":
        d = dict(d)
        d["stages"] = [Stage(**s) for s in d["stages"]]
        d["betas"] = tuple(d.get("betas", (0.9, 0.95)))
        return cls(**d)


@dataclass
class Batch:
    tokens_in: torch.Tensor   # (B, m) x_{t+1}
    feats_in: torch.Tensor    # (B, m, H) F_t
    feats_out: torch.Tensor   # (B, m, H) F_{t+1}
    next_draft: torch.Tensor  # (B, m) x_{t+2} as a draft-vocabulary index (-1: outside it)
    mask: torch.Tensor        # (B, m) float: answer positions whose next token is in the draft vocabulary
    tokens: int = 0

    def to(self, device: torch.device) -> "Batch":
        """The batch on the training device (batches are built, and kept for the whole stage, in CPU memory)."""
        return Batch(self.tokens_in.to(device), self.feats_in.to(device), self.feats_out.to(device),
                     self.next_draft.to(device), self.mask.to(device), self.tokens)


def draft_vocabulary(sequences: list[dict], size: int, vocab_size: int, always: set[int]) -> torch.Tensor | None:
    """EAGLE-3's reduced draft vocabulary: the ``size`` most frequent answer tokens (+ ``always``: EOS), sorted by
    id; None when size is 0 or covers the vocabulary. Where a small dataset has fewer distinct answer tokens than
    ``size``, the rest are the most frequent prompt tokens, then the lowest ids (a BPE's earliest merges)."""
    if size <= 0 or size >= vocab_size:
        return None
    answer = torch.zeros(vocab_size, dtype=torch.long)
    prompt = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        ids = seq["ids"].long()
        answer += torch.bincount(ids[seq["start"]:], minlength=vocab_size)
        prompt += torch.bincount(ids[:seq["start"]], minlength=vocab_size)
    score = answer.double() * (float(prompt.sum()) + 1.0) + prompt.double()
    for token in always:
        score[token] = float("inf")
    order = torch.sort(-score, stable=True).indices  # ties: the lower id first
    return order[:size].sort().values


def target_to_draft(draft_ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """(V,) long: a target id's draft index, or -1 when the draft vocabulary lacks it (EAGLE-3's t2d)."""
    if draft_ids is None:
        return torch.arange(vocab_size)
    t2d = torch.full((vocab_size,), -1, dtype=torch.long)
    t2d[draft_ids] = torch.arange(len(draft_ids))
    return t2d


def split(sequences: list[dict], holdout: float, seed: int) -> tuple[list[dict], list[dict]]:
    order = list(range(len(sequences)))
    random.Random(seed).shuffle(order)
    n_eval = min(len(order) - 1, max(1, round(holdout * len(order)))) if len(order) > 1 else 0
    return [sequences[i] for i in order[n_eval:]], [sequences[i] for i in order[:n_eval]]


def token_groups(sequences: list[dict], max_length: int, batch_tokens: int, seed: int) -> list[list[tuple[int, dict]]]:
    """Length-sorted groups of (length, sequence) of at most ``batch_tokens`` padded tokens, in a seeded random
    order; sequences cut to ``max_length``, those with no answer token to predict left out."""
    items = []
    for seq in sequences:
        n = min(len(seq["ids"]), max_length)
        if n >= 3 and n > seq["start"] + 1:
            items.append((n, seq))
    items.sort(key=lambda item: item[0])
    groups, current = [], []
    for n, seq in items:
        if current and (len(current) + 1) * n > batch_tokens:
            groups.append(current)
            current = []
        current.append((n, seq))
    if current:
        groups.append(current)
    random.Random(seed).shuffle(groups)
    return groups


def batches(sequences: list[dict], settings: TrainSettings, t2d: torch.Tensor, seed: int) -> list[Batch]:
    """``token_groups`` of the settings' sizes as Batches."""
    return [make_batch(group, t2d) for group in token_groups(sequences, settings.max_length, settings.batch_tokens,
                                                             seed)]


def epoch_plan(epochs: float, one_epoch) -> list:
    """The batches of ``epochs`` passes, ``one_epoch(i)`` giving pass i's: a fraction is that share of one more
    pass (0.25: a quarter of its batches), and a plan has at least one batch."""
    passes = max(1, math.ceil(epochs))
    plan = [batch for epoch in range(passes) for batch in one_epoch(epoch)]
    return plan[:max(1, round(len(plan) * epochs / passes))]


def make_batch(group: list[tuple[int, dict]], t2d: torch.Tensor) -> Batch:
    m = max(n for n, _ in group) - 2
    hidden = group[0][1]["hidden"].shape[-1]
    b = len(group)
    tokens_in = torch.zeros(b, m, dtype=torch.long)
    feats_in, feats_out = torch.zeros(b, m, hidden), torch.zeros(b, m, hidden)
    next_draft = torch.full((b, m), -1, dtype=torch.long)
    mask = torch.zeros(b, m)
    for row, (n, seq) in enumerate(group):
        ids, h, k = seq["ids"][:n].long(), seq["hidden"][:n].float(), n - 2
        tokens_in[row, :k] = ids[1:n - 1]
        feats_in[row, :k], feats_out[row, :k] = h[:n - 2], h[1:n - 1]
        next_draft[row, :k] = t2d[ids[2:n]]
        answer = torch.arange(2, n) >= seq["start"]
        mask[row, :k] = (answer & (next_draft[row, :k] >= 0)).float()
    return Batch(tokens_in, feats_in, feats_out, next_draft, mask, int(mask.sum()))


def shift_right(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)


def reach(mask: torch.Tensor, ahead: int) -> torch.Tensor:
    """(B, m) bool: positions t with mask at any of t .. t + ahead (mask (B, m) float)."""
    out = mask > 0
    for shift in range(1, min(ahead, mask.shape[1] - 1) + 1):
        out[:, :-shift] |= mask[:, shift:] > 0
    return out


def pass_losses(head: DraftHead, parts: TargetParts, batch: Batch, passes: int, settings: TrainSettings,
                generator: torch.Generator | None, train: bool = True) -> tuple[torch.Tensor, list[dict]]:
    """The stage's loss on one batch (mean over passes) and per-pass statistics.

    lm_head runs only on the R positions whose logits can matter (``rows``): counted ones (batch.mask) and the
    passes - 1 before each, whose top-k alignment masks later passes. Prompt and padding positions (a third of
    the embedded pair's data) still pass through the head's layer, where they are attention context.
    Runs on the target's device (``parts.device``), where the head must be too."""
    device = parts.device
    batch = batch.to(device)
    b, m = batch.tokens_in.shape
    embeds = parts.embed(batch.tokens_in).float()
    inputs = batch.feats_in
    if train and settings.noise:
        u = torch.rand(inputs.shape, generator=generator).to(device)  # a CPU generator: the same noise anywhere
        inputs = inputs + (u - 0.5) * settings.noise * 512 / m
    positions = torch.arange(m, device=device)[None].expand(b, m)
    rows = reach(batch.mask, passes - 1).reshape(-1)  # (B·m,) bool

    def at_rows(x: torch.Tensor) -> torch.Tensor:  # (B, m, ...) -> (R, ...)
        return x.reshape(b * m, *x.shape[2:])[rows]

    target_feats, next_draft = at_rows(batch.feats_out), at_rows(batch.next_draft)  # (R, H), (R,)
    with torch.no_grad():
        p = torch.softmax(parts.logits(target_feats).float(), dim=-1)  # (R, V_d) the target's distribution
        top_p = p.topk(settings.topk_loss_k, dim=-1) if passes >= 2 and settings.topk_loss_weight else None
    streams: list = []
    aligned_so_far = torch.ones(b, m, device=device)
    total, stats = 0.0, []
    for index in range(1, passes + 1):
        predict, regress = head(embeds, inputs, positions, streams=streams)
        logq = torch.log_softmax(parts.logits(at_rows(predict)).float(), dim=-1)  # (R, V_d)
        weight = at_rows(batch.mask * aligned_so_far)  # (R,)
        per_position = settings.feature_weight * F.smooth_l1_loss(at_rows(regress), target_feats,
                                                                  reduction="none").mean(-1)
        per_position = per_position + settings.ce_weight * -(p * logq).sum(-1)
        if top_p is not None:
            per_position = per_position + settings.topk_loss_weight * -(
                top_p.values * logq.gather(-1, top_p.indices)).sum(-1)
        counted = weight.sum()
        total = total + (per_position * weight).sum() / counted.clamp_min(1.0) / passes
        with torch.no_grad():
            hit = logq.argmax(-1) == next_draft
            k = settings.align_top_k
            in_top = (logq.topk(k, dim=-1).indices == next_draft[:, None]).any(-1) if k else torch.ones_like(hit)
            stats.append({"pass": index, "positions": float(counted), "top1": float((hit * weight).sum()),
                          "in_top_k": float((in_top * weight).sum())})
        if index < passes:
            aligned = torch.zeros(b * m, device=device)
            aligned[rows] = in_top.float()  # positions outside rows mask nothing that counts
            aligned_so_far = shift_right(aligned.view(b, m) * aligned_so_far)
            inputs = torch.cat([inputs[:, :1], regress[:, :-1].detach()], dim=1)
    return total, stats


@contextmanager
def flushed_denormals():
    """Flush denormal floats to zero while training: once a head has learned, most of its log-probabilities over
    the draft vocabulary are so negative that softmax's exp(·) and its gradients land below 1.2e-38, and x86
    computes on such denormals ~100x slower. Measured on the embedded target's GRIFFIN head (stage 2 from the
    trained stage 1, 2 passes, 12 steps): backward 2.3-19.5 s per step without, 2.3-3.8 s with; random heads
    (flat distributions) do not show it. Numerically: values under 1.2e-38 become 0.

    The setting is per thread, and a thread inherits it from the thread that creates it: here it reaches the
    calling thread only, so the pipeline enters it before the first parallel operation creates torch's worker
    threads (HeadPipeline.run); entered after that, the workers keep computing on denormals. Re-entrant."""
    global _flushing
    _flushing += 1
    # numpy's finfo, first computed under the flush, warns that float32's smallest subnormal is 0: it is, here
    warnings.filterwarnings("ignore", message="The value of the smallest subnormal", category=UserWarning)
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        _flushing -= 1
        if not _flushing:  # the outermost one restores it
            torch.set_flush_denormal(False)


_flushing = 0  # flushed_denormals() contexts open


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory instead of handing it back to the OS (no mmap'd chunks, trim only
    past 1 GiB): each training step frees and re-allocates the same (R, V_d) logits buffers, ~130 MB each, and
    returning them costs a page fault per 4 KiB on the next step. Measured on the embedded target's GRIFFIN
    head (2 passes, 2 threads): 1.14x the steps per second. False (nothing changed) without glibc."""
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 1 << 30))


def learning_rate(step: int, steps: int, stage: Stage, warmup: int) -> float:
    if step < warmup:
        return stage.lr * (step + 1) / warmup
    return stage.lr * max(0.0, (steps - step) / max(1, steps - warmup))


@dataclass
class StageRun:
    """One stage's training, checkpointed every ``checkpoint_seconds`` to ``partial.pt`` so a killed run resumes."""

    head: DraftHead
    parts: TargetParts
    settings: TrainSettings
    stage: Stage
    index: int
    directory: Path
    log: object = print
    history: list = field(default_factory=list)

    def run(self, train_set: list[dict], t2d: torch.Tensor) -> list[dict]:
        seed = self.settings.seed * 1000 + self.index * 100
        plan = epoch_plan(self.stage.epochs, lambda epoch: batches(train_set, self.settings, t2d, seed + epoch))
        optimizer = torch.optim.AdamW(self.head.parameters(), lr=self.stage.lr, betas=self.settings.betas,
                                      weight_decay=0.0)
        generator = torch.Generator().manual_seed(self.settings.seed + self.index)
        start = self._resume(optimizer, generator)
        last_save = time.monotonic()
        self.head.train()
        with flushed_denormals():
            self._steps(plan, start, optimizer, generator, last_save)
        self.head.eval()
        return self.history

    def _steps(self, plan: list[Batch], start: int, optimizer, generator, last_save: float) -> None:
        for step in range(start, len(plan)):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, len(plan), self.stage, self.settings.warmup_steps)
            began = time.perf_counter()
            loss, stats = pass_losses(self.head, self.parts, plan[step], self.stage.passes, self.settings, generator)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_value_(self.head.parameters(), self.settings.clip_value)
            optimizer.step()
            row = {"step": step + 1, "of": len(plan), "loss": loss.item(), "seconds": time.perf_counter() - began,
                   "tokens": plan[step].tokens_in.numel(),
                   "top1": [round(s["top1"] / max(s["positions"], 1), 4) for s in stats]}
            self.history.append(row)
            if (step + 1) % 10 == 0 or step + 1 == len(plan):
                self.log(f"[heads] stage {self.index}: step {step + 1}/{len(plan)} loss {row['loss']:.4f} "
                         f"top-1 per pass {row['top1']} ({row['tokens'] / row['seconds']:.0f} tok/s)")
            if time.monotonic() - last_save > self.settings.checkpoint_seconds and step + 1 < len(plan):
                self._save_partial(optimizer, generator, step + 1)
                last_save = time.monotonic()

    @property
    def partial(self) -> Path:
        return self.directory / "partial.pt"

    def _resume(self, optimizer, generator) -> int:
        if not self.partial.exists():
            return 0
        state = torch.load(self.partial, map_location="cpu", weights_only=False)  # load_state_dict places them
        self.head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        self.history = state["history"]
        self.log(f"[heads] stage {self.index}: resuming at step {state['step']} from {self.partial}")
        return state["step"]

    def _save_partial(self, optimizer, generator, step: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.partial.with_suffix(".tmp")
        torch.save({"head": self.head.state_dict(), "optimizer": optimizer.state_dict(),
                    "generator": generator.get_state(), "step": step, "history": self.history}, tmp)
        tmp.replace(self.partial)


@torch.no_grad()
def evaluate(head: DraftHead, parts: TargetParts, sequences: list[dict], settings: TrainSettings,
             t2d: torch.Tensor, passes: int = 5) -> dict:
    """Held-out, teacher-forced: per drafting depth p (pass p: p - 1 tokens drafted ahead on the head's own
    features), the share of positions (whose earlier drafts were all in the top-k) where the head's top-1 /
    top-k is the target's token. A chain's expected accepted length is roughly Σ_d Π_{p≤d} top-1_p."""
    head.eval()
    totals = [{"positions": 0.0, "top1": 0.0, "in_top_k": 0.0} for _ in range(passes)]
    with flushed_denormals():
        for batch in batches(sequences, settings, t2d, seed=0):
            _, stats = pass_losses(head, parts, batch, passes, settings, None, train=False)
            for total, s in zip(totals, stats):
                for key in total:
                    total[key] += s[key]
    rows = [{"depth": i + 1, "positions": int(t["positions"]),
             "top1": t["top1"] / max(t["positions"], 1), "top_k": t["in_top_k"] / max(t["positions"], 1)}
            for i, t in enumerate(totals)]
    chain = 1.0
    for row in rows:
        chain *= row["top1"]
        row["chain_top1"] = chain
    return {"depths": rows, "expected_chain_tau": 1.0 + sum(r["chain_top1"] for r in rows),
            "sequences": len(sequences)}


def check_predecessor(directory: Path, stage_index: int) -> None:
    from ...models.heads.artifact import CONFIG_FILE
    if stage_index > 1 and not (directory / f"stage-{stage_index - 1}" / CONFIG_FILE).exists():
        raise ConfigError(f"heads.stage: stage {stage_index} resumes from stage {stage_index - 1}, but "
                          f"{directory / f'stage-{stage_index - 1}' / CONFIG_FILE} does not exist; run "
                          f"stage {stage_index - 1} first (or stage=all)")


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
