"""Training Medusa / Hydra heads (models/heads/medusa.py) on the heads pipeline's data: the training prompts, the
target's own greedy answers and its features h_t at every position (extract.py), as for EAGLE and GRIFFIN.

Medusa-1's loss (Cai et al. 2024, the target frozen): L = Σ_k λ^k CE(head_k(h_t), x_{t+k+1}) over the positions t
whose target token x_{t+k+1} is an answer token, each head's CE averaged over its positions (λ = ``head.decay``,
0.8 in the paper). Hydra's head k is teacher-forced: it reads the answer's own x_{t+1}..x_{t+k}. The head configs'
``train`` block is the pipeline's TrainSettings (stages of {passes: 1, epochs, lr}, batch_tokens, warm-up, AdamW
betas, gradient clipping by value); no partial checkpoints (a stage here is minutes), no feature noise.
"""
from __future__ import annotations

import math
import random
import time

import torch
from torch.nn import functional as F

from ...models.heads.draft_head import TargetParts
from ...models.heads.medusa import MedusaHeads
from .train import Stage, TrainSettings, flushed_denormals, learning_rate


def medusa_batches(sequences: list[dict], settings: TrainSettings, heads: int, seed: int) -> list[dict]:
    """Positions t of the sequences, at most ``batch_tokens`` per batch, shuffled with ``seed``; each batch:
    ``h`` (B, H) the features h_t, ``ahead`` (B, K+1) the tokens x_{t+1}..x_{t+K+1} (-1 past the sequence's end),
    ``answer`` (B, K+1) bool: that token is part of the answer."""
    rows = []
    for seq in sequences:
        n = min(len(seq["ids"]), settings.max_length)
        ids, hidden, start = seq["ids"][:n].long(), seq["hidden"][:n].float(), seq["start"]
        for t in range(max(0, start - 2), n - 2):  # head 1's token x_{t+2} is in the answer and exists
            ahead = torch.full((heads + 1,), -1, dtype=torch.long)
            upto = min(n, t + heads + 2)
            ahead[:upto - t - 1] = ids[t + 1:upto]
            answer = (torch.arange(t + 1, t + heads + 2) >= start) & (ahead >= 0)
            rows.append((hidden[t], ahead, answer))
    random.Random(seed).shuffle(rows)
    size = max(1, settings.batch_tokens)
    return [{"h": torch.stack([r[0] for r in rows[i:i + size]]), "ahead": torch.stack([r[1] for r in rows[i:i + size]]),
             "answer": torch.stack([r[2] for r in rows[i:i + size]])} for i in range(0, len(rows), size)]


def medusa_loss(heads: MedusaHeads, parts: TargetParts, batch: dict, decay: float):
    """(Σ_k λ^k CE_k, [(top-1 hits, positions) per head k])."""
    device = parts.device
    h, ahead, answer = batch["h"].to(device), batch["ahead"].to(device), batch["answer"].to(device)
    total, stats = h.new_zeros(()), []
    for k in range(1, heads.cfg.heads + 1):
        valid = answer[:, k]  # x_{t+k+1} is an answer token
        if not bool(valid.any()):
            stats.append((0, 0))
            continue
        embeds = parts.embed(ahead[valid, :k]).float() if heads.cfg.kind == "hydra" else None
        logits = heads.logits(k, heads.hidden(k, h[valid], embeds), parts.logits).float()
        target = ahead[valid, k]
        total = total + decay ** k * F.cross_entropy(logits, target)
        stats.append((int((logits.argmax(-1) == target).sum()), int(valid.sum())))
    return total, stats


def train_medusa_stage(heads: MedusaHeads, parts: TargetParts, settings: TrainSettings, stage: Stage, index: int,
                       train_set: list[dict], decay: float, log=print) -> list[dict]:
    epochs = max(1, math.ceil(stage.epochs))
    plan = []
    for epoch in range(epochs):
        plan += medusa_batches(train_set, settings, heads.cfg.heads, settings.seed * 1000 + index * 100 + epoch)
    plan = plan[:max(1, round(len(plan) * stage.epochs / epochs))]
    trainable = [p for p in heads.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=stage.lr, betas=settings.betas, weight_decay=0.0)
    history = []
    heads.train()
    with flushed_denormals():
        for step, batch in enumerate(plan):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, len(plan), stage, settings.warmup_steps)
            began = time.perf_counter()
            loss, stats = medusa_loss(heads, parts, batch, decay)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_value_(trainable, settings.clip_value)
            optimizer.step()
            row = {"step": step + 1, "of": len(plan), "loss": loss.item(), "seconds": time.perf_counter() - began,
                   "tokens": len(batch["h"]), "top1": [round(hit / max(n, 1), 4) for hit, n in stats]}
            history.append(row)
            if (step + 1) % 10 == 0 or step + 1 == len(plan):
                log(f"[heads] stage {index}: step {step + 1}/{len(plan)} loss {row['loss']:.4f} "
                    f"top-1 per head {row['top1']}")
    heads.eval()
    return history


@torch.no_grad()
def evaluate_medusa(heads: MedusaHeads, parts: TargetParts, sequences: list[dict], settings: TrainSettings) -> dict:
    """Held-out top-1 of each head k (x_{t+k+1} from h_t; Hydra teacher-forced), and the expected τ of a chain
    drafted by the heads' top-1 if their hits were independent (1 + Σ_d Π_{k<=d} top1_k)."""
    hits = [0] * heads.cfg.heads
    counts = [0] * heads.cfg.heads
    for batch in medusa_batches(sequences, settings, heads.cfg.heads, seed=0):
        for k, (hit, n) in enumerate(medusa_loss(heads, parts, batch, 1.0)[1]):
            hits[k] += hit
            counts[k] += n
    top1 = [h / max(n, 1) for h, n in zip(hits, counts)]
    tau, run = 1.0, 1.0
    for p in top1:
        run *= p
        tau += run
    return {"heads": [{"head": k + 1, "top1": p, "positions": n} for k, (p, n) in enumerate(zip(top1, counts))],
            "expected_chain_tau": tau}
