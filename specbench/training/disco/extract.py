"""DISCO's training data (its appendix D.1): one example per token the target generates.

For each prompt the target generates greedily, autoregressively; the draft then reads the prompt plus the
target's tokens (teacher forcing: one causal forward equals feeding it the target's prefix token by
token), and at each position j its distribution y_j^D gives the features [Top_k, Ent, j] and the label
"accepted" = (the draft's top token == the target's token j). The total variation TV(y_j^D, y_j^T)
against the target's distribution at the same position is kept too (a soft label, ``label: tv``).

Each split's features go to one JSONL file (a RecordStore), one line per prompt, appended as produced, so
an interrupted extraction resumes where it stopped.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from ...errors import require
from ...methods.disco import disco_features
from ...methods.greedy import Greedy
from ...records.store import RecordStore


def teacher_forced_logits(pair, role: str, prompt_ids: list[int], tokens: list[int]) -> torch.Tensor:
    """The ``role`` model's logits predicting each of ``tokens`` after prompt + the tokens before it: (n, V), in
    its own vocabulary (either backend: ``pair.lm``)."""
    lm = pair.lm(role)
    lm.vocab = None
    return lm.forward(list(prompt_ids) + tokens[:-1], keep_last=len(tokens))


def extract_prompt(pair, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int], top_k: int = 10) -> dict:
    """Target tokens, per-token features (n, k+2), agreement labels and TV distances for one prompt."""
    tokens = Greedy(pair, "disco-extract").generate(prompt_ids, max_new_tokens, eos_ids).tokens
    draft_logits = teacher_forced_logits(pair, "draft", prompt_ids, tokens)  # y^D_j, (n, V)
    # y^T_j, (n, V), beside the draft's (with device_map=auto the two models' outputs may sit on other devices)
    target_logits = teacher_forced_logits(pair, "target", prompt_ids, tokens).to(draft_logits.device)
    vocab = min(draft_logits.shape[-1], target_logits.shape[-1])  # padded vocabularies may differ in size
    draft_probs = torch.softmax(draft_logits[:, :vocab], dim=-1)
    target_probs = torch.softmax(target_logits[:, :vocab], dim=-1)
    features = disco_features(draft_logits, torch.arange(len(tokens)), top_k)
    labels = (draft_logits.argmax(-1) == torch.tensor(tokens, device=draft_logits.device)).int()
    tv = 0.5 * (draft_probs - target_probs).abs().sum(-1)
    return {"tokens": tokens, "features": features.tolist(), "labels": labels.tolist(), "tv": tv.tolist()}


def extract_split(pair, examples, encode, max_new_tokens: int, path: Path, top_k: int, identity: dict) -> Path:
    """Append one line per example not yet in ``path``; ``encode(example) -> prompt ids``."""
    store = RecordStore(path)
    done = {row["prompt_id"] for row in store.load()}
    todo = [ex for ex in examples if ex.id not in done]
    if done:
        print(f"[disco] {path.name}: {len(done)} prompt(s) kept, {len(todo)} to extract", file=sys.stderr)
    for n, example in enumerate(todo, 1):
        require(len(example.turns) == 1, "disco.splits",
                f"DISCO extraction reads single-turn prompts; '{example.id}' has {len(example.turns)} turns")
        row = {"prompt_id": example.id, "identity": identity,
               **extract_prompt(pair, encode(example), max_new_tokens, pair.eos_ids, top_k)}
        store.append(row)
        print(f"[disco] {path.name}: {len(done) + n}/{len(examples)} prompts, {len(row['tokens'])} tokens, "
              f"{sum(row['labels'])} accepted", file=sys.stderr)
    return path


def feature_table(path: Path, prompt_ids: set[str] | None = None):
    """Stacked (N, k+2) features, (N,) labels and (N,) TV of the selected prompts of a features file."""
    rows = [r for r in RecordStore(path).load() if prompt_ids is None or r["prompt_id"] in prompt_ids]
    require(rows and any(r["tokens"] for r in rows), "disco", f"no extracted tokens in '{path}'")
    features = torch.tensor([f for r in rows for f in r["features"]], dtype=torch.float32)
    labels = torch.tensor([y for r in rows for y in r["labels"]], dtype=torch.long)
    tv = torch.tensor([d for r in rows for d in r["tv"]], dtype=torch.float32)
    return features, labels, tv
