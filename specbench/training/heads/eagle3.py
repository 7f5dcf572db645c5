"""Training an EAGLE-3 head (Li et al. 2025): fused low/mid/high features, tokens only, training-time test.

EAGLE-3 trains the head on the target's next-token distribution alone (no feature regression: its output need
not match any target feature) and, to train it on what it will read while drafting, unrolls it during training
("training-time test"): step 1 reads g_t = fc3([l_t; m_t; h_t]) and x_{t+1} at every position t and predicts
x_{t+2}; step j >= 2 reads, at position t, the head's own step-(j-1) output at t - 1 in place of g_t (with the
token x_{t+1} still from the data), and its attention sees, as while drafting j - 1 tokens ahead, the target's
fused features up to t - (j - 1) and its own earlier steps' keys only on its chain (models/draft_head.stream_mask,
the streams GRIFFIN's multi-pass training already uses). Loss, over answer positions whose next token is in the
draft vocabulary: Σ_j 0.8^(j-1) · CE(p_t, q_t^(j)), p_t = softmax(lm_head_d(F_{t+1})) the target's distribution
over the draft vocabulary (EAGLE-3's code weights its steps 0.8^j the same way).

What we do differently, at CPU scale: a few (2-3) unrolled steps instead of 7; the draft lm_head is the target's
own rows of the draft vocabulary, frozen (EAGLE-3 trains its own), after the head's own final norm; g is
RMS-normalized after fc3 (``layer_norm``: the target's residual stream has channels of ~10^3, which EAGLE-3's layer
meets with its hidden_norm and ours, EAGLE's layer without an input norm, would carry into attention and logits);
the head starts from the target's last decoder layer (``init: target_layer``); positions t < j - 1 of
step j, whose chain would start before the sequence, are left out of its loss; the low/mid/high features are
computed from the stored token ids by one target forward per batch (the heads pipeline's extracted data keeps
only the last hidden state), so training needs the target in memory.
"""
from __future__ import annotations

import torch

from ...backends.torch.cached_lm import layer_inputs
from ...models.heads.draft_head import DraftHead, TargetParts
from .train import epoch_plan, token_groups

STEP_DECAY = 0.8  # the weight of unrolled step j is 0.8^(j-1)


@torch.no_grad()
def target_features(target, ids: torch.Tensor, attention: torch.Tensor, layers: list[int]):
    """One forward of the target over right-padded ``ids`` (B, n): (its low/mid/high layer inputs (B, n, 3H),
    its last hidden state F after the final norm (B, n, H)), float32."""
    with layer_inputs(target, layers) as states:
        out = target.base_model(input_ids=ids, attention_mask=attention, use_cache=False)
    return torch.cat(states, dim=-1).float(), out.last_hidden_state.float()


def unrolled_loss(head: DraftHead, parts: TargetParts, ids: torch.Tensor, starts: list[int], lengths: list[int],
                  states: torch.Tensor, final: torch.Tensor, steps: int, t2d: torch.Tensor):
    """The training-time-test loss of one batch (module docstring) and per-step statistics.

    ids (B, n) right-padded; states (B, n, 3H) and final (B, n, H) from ``target_features``; head positions
    t = 0..n-3 read x_{t+1}, and count when x_{t+2} is an answer token inside the draft vocabulary."""
    b, n = ids.shape
    m = n - 2
    device = parts.device
    embeds = parts.embed(ids[:, 1:n - 1].to(device)).float()                    # (B, m, H) e(x_{t+1})
    features = head.fuse_layers(states[:, :m].to(device))                        # (B, m, H) g_t
    positions = torch.arange(m, device=device)[None].expand(b, m)
    next_draft = t2d.to(device)[ids[:, 2:].to(device)]                           # (B, m) x_{t+2}'s draft index
    t = torch.arange(m, device=device)[None]
    answer = torch.stack([(t[0] + 2 >= s) & (t[0] + 2 < length) for s, length in zip(starts, lengths)])
    mask = (answer & (next_draft >= 0)).float()                                  # (B, m)
    with torch.no_grad():
        p = torch.softmax(parts.logits(final[:, 1:m + 1].to(device)).float(), dim=-1)  # (B, m, V_d)
    streams: list = []
    total, stats = 0.0, []
    for step in range(1, steps + 1):
        predict, regress = head(embeds, features, positions, streams=streams)  # regress: pre-final-norm output
        logq = torch.log_softmax(parts.logits(predict).float(), dim=-1)          # (B, m, V_d)
        weight = mask * (t >= step - 1).float()  # a chain of step - 1 own outputs needs that many positions before
        counted = weight.sum().clamp_min(1.0)
        ce = -(p * logq).sum(-1)                                                 # (B, m)
        total = total + STEP_DECAY ** (step - 1) * (ce * weight).sum() / counted
        with torch.no_grad():
            hit = (logq.argmax(-1) == next_draft).float()
            stats.append({"step": step, "positions": float(weight.sum()), "top1": float((hit * weight).sum())})
        # position t reads t-1's output, as drafting feeds it (models/heads/runner.py: the regress feature)
        features = torch.cat([torch.zeros_like(regress[:, :1]), regress[:, :-1]], dim=1)
    return total, stats


def padded_batch(sequences: list[dict], max_length: int) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    lengths = [min(len(seq["ids"]), max_length) for seq in sequences]
    ids = torch.zeros(len(sequences), max(lengths), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, (seq, n) in enumerate(zip(sequences, lengths)):
        ids[row, :n] = seq["ids"][:n].long()
        attention[row, :n] = 1
    return ids, attention, [int(seq["start"]) for seq in sequences], lengths


def train_eagle3_stage(head: DraftHead, parts: TargetParts, target, sequences: list[dict], t2d: torch.Tensor,
                       *, steps: int, epochs: float, lr: float, batch_tokens: int = 1024, max_length: int = 256,
                       warmup_steps: int = 0, clip_value: float = 0.5, betas=(0.9, 0.95), seed: int = 0,
                       log=None) -> list[dict]:
    """Train ``head`` in place for ``epochs`` passes over ``sequences`` ({ids, start}: the heads pipeline's data)
    with ``steps`` unrolled steps, in batches of at most ``batch_tokens`` padded tokens (length-sorted, shuffled
    per epoch: the groups EAGLE's stages train on, train.token_groups); AdamW, linear warm-up then linear decay,
    gradients clipped by value. Returns one row per optimizer step (loss, per-step top-1 over counted positions)."""
    plan = epoch_plan(epochs, lambda epoch: [[seq for _, seq in group] for group in
                                             token_groups(sequences, max_length, batch_tokens, seed * 1000 + epoch)])
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, betas=tuple(betas))
    total_steps = max(1, len(plan))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(
        (i + 1) / max(1, warmup_steps), max(0.0, (total_steps - i) / max(1, total_steps - warmup_steps))))
    layers = head.cfg.feature_layers
    rows = []
    head.train()
    for index, group in enumerate(plan):
        ids, attention, starts, lengths = padded_batch(group, max_length)
        states, final = target_features(target, ids.to(parts.device), attention.to(parts.device), layers)
        loss, stats = unrolled_loss(head, parts, ids, starts, lengths, states, final, steps, t2d)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_value_(head.parameters(), clip_value)
        optimizer.step()
        schedule.step()
        row = {"step": index + 1, "loss": float(loss.detach()),
               "top1": [s["top1"] / max(1.0, s["positions"]) for s in stats]}
        rows.append(row)
        if log is not None:
            log(f"[heads] eagle3 step {index + 1}/{total_steps}: loss {row['loss']:.3f}, top-1 by unrolled step "
                + ", ".join(f"{x:.2f}" for x in row["top1"]))
    head.eval()
    return rows


def chain_accuracy(head: DraftHead, parts: TargetParts, target, sequences: list[dict], t2d: torch.Tensor,
                   steps: int, max_length: int = 256) -> list[float]:
    """Top-1 agreement with the target's next token per unrolled step, over ``sequences`` (no training)."""
    ids, attention, starts, lengths = padded_batch(sequences, max_length)
    states, final = target_features(target, ids.to(parts.device), attention.to(parts.device),
                                    head.cfg.feature_layers)
    with torch.no_grad():
        _, stats = unrolled_loss(head, parts, ids, starts, lengths, states, final, steps, t2d)
    return [s["top1"] / max(1.0, s["positions"]) for s in stats]
