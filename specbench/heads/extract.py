"""Training data for a draft head: the target answers the training prompts itself (self-distillation, greedy,
in the pair's dtype) and its features F (last hidden state after the final norm) are kept for every position.

One ``generate`` call per batch of prompts returns both: with ``output_hidden_states`` a greedy generate yields
the final-norm hidden state of every position it feeds (the prompt at its first step, then each new token), so
no second pass reads the sequence again. Batches are left-padded; the features of a row are its own up to the
bf16 rounding that batching brings (the head is trained on them, nothing is verified against them). A row ends
after its first EOS or the budget; the last generated token has no feature (it was never fed) and is dropped.

Resumable: each batch is written as one shard (``shard-00000.pt``: ids, answer start, features per sequence)
and then named in ``manifest.jsonl``; a re-run skips the prompts the manifest lists. The directory's
``data.json`` holds what the data depends on (target, dtype, prompts, budget); a different one is refused.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from ..errors import ConfigError

MANIFEST, IDENTITY = "manifest.jsonl", "data.json"


def check_identity(directory: Path, identity: dict) -> None:
    """Write data.json for a new directory; refuse one made for something else."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / IDENTITY
    if path.exists():
        old = json.loads(path.read_text())
        if old != identity:
            changed = sorted(k for k in set(old) | set(identity) if old.get(k) != identity.get(k))
            raise ConfigError(f"heads.data: {directory} holds data made with other settings ({', '.join(changed)}); "
                              "remove it or change heads.out_dir")
    else:
        path.write_text(json.dumps(identity, indent=1, sort_keys=True))


def done_prompts(directory: Path) -> set[str]:
    path = directory / MANIFEST
    if not path.exists():
        return set()
    done = set()
    for line in path.read_text().splitlines():
        if line.strip():
            done.update(json.loads(line)["prompts"])
    return done


@torch.inference_mode()
def generate_with_features(model, prompts: Sequence[list[int]], max_new_tokens: int, eos_ids: set[int],
                           pad_id: int) -> list[dict]:
    """Greedy answers and per-position features for a batch: [{ids (n,) int32, start, hidden (n, H)}]."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        attention[row, width - len(prompt):] = 1
    out = model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=sorted(eos_ids), pad_token_id=pad_id, output_hidden_states=True,
                         return_dict_in_generate=True)
    hidden = torch.cat([step[-1] for step in out.hidden_states], dim=1)  # (B, width + T - 1, H)
    rows = []
    for row, prompt in enumerate(prompts):
        answer = out.sequences[row, width:].tolist()
        end = next((i + 1 for i, t in enumerate(answer) if t in eos_ids), len(answer))
        answer = answer[:end]
        keep = min(len(answer), hidden.shape[1] - width)  # the last generated token was never fed
        sequence = list(prompt) + answer[:keep]
        features = hidden[row, width - len(prompt):width + keep]
        rows.append({"ids": torch.tensor(sequence, dtype=torch.int32), "start": len(prompt),
                     "hidden": features.clone()})
    return rows


def extract(pair, prompts: Sequence[tuple[str, str]], directory: Path, max_new_tokens: int, batch_size: int,
            max_prompt_tokens: int, identity: dict, log=print) -> Path:
    """Regenerate and store every (id, text) prompt not yet in ``directory``'s manifest."""
    directory = Path(directory)
    check_identity(directory, identity)
    done = done_prompts(directory)
    encoded, too_long = [], 0
    for pid, text in prompts:
        if pid in done:
            continue
        ids = pair.encode(text)
        if len(ids) > max_prompt_tokens:
            too_long += 1
            continue
        encoded.append((pid, ids))
    shard = len(list(directory.glob("shard-*.pt")))
    log(f"[heads] extract: {len(done)} prompt(s) kept, {len(encoded)} to run, {too_long} longer than "
        f"{max_prompt_tokens} tokens skipped")
    encoded.sort(key=lambda item: len(item[1]))  # similar lengths share a batch (less padding)
    pad = pair.tokenizer.pad_token_id if pair.tokenizer.pad_token_id is not None else min(pair.eos_ids)
    for first in range(0, len(encoded), batch_size):
        batch = encoded[first:first + batch_size]
        start = time.perf_counter()
        rows = generate_with_features(pair.target, [ids for _, ids in batch], max_new_tokens, pair.eos_ids, pad)
        for (pid, _), row in zip(batch, rows):
            row["id"] = pid
        path = directory / f"shard-{shard:05d}.pt"
        torch.save(rows, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
        answer = sum(len(r["ids"]) - r["start"] for r in rows)
        with open(directory / MANIFEST, "a") as f:
            f.write(json.dumps({"shard": path.name, "prompts": [pid for pid, _ in batch], "answer_tokens": answer,
                                "tokens": sum(len(r["ids"]) for r in rows)}) + "\n")
        shard += 1
        log(f"[heads] extract: {first + len(batch)}/{len(encoded)} prompts, {answer} answer tokens in "
            f"{time.perf_counter() - start:.0f} s")
    return directory


def load_sequences(directory: Path) -> list[dict]:
    """Every stored sequence, in manifest order (shards a crash left unlisted are ignored)."""
    path = Path(directory) / MANIFEST
    if not path.exists():
        raise ConfigError(f"heads: no extracted data in {directory} ({MANIFEST} missing); run the extract stage "
                          "first (python -m specbench.heads stage=extract)")
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            rows += torch.load(Path(directory) / json.loads(line)["shard"], weights_only=False)
    if not rows:
        raise ConfigError(f"heads: {directory} holds no sequences; run the extract stage")
    return rows


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
