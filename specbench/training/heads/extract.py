"""Training data for a draft head: the target answers the training prompts itself (self-distillation, greedy,
in the pair's dtype) and its features F (last hidden state after the final norm) are kept for every position.

One ``generate`` call per batch of prompts returns both: with ``output_hidden_states`` a greedy generate yields
the final-norm hidden state of every position it feeds (the prompt at its first step, then each new token), so
no second pass reads the sequence again. Batches are left-padded; the features of a row are its own up to the
bf16 rounding that batching brings (the head is trained on them, nothing is verified against them). A row ends
after its first EOS or the budget; the last generated token has no feature (it was never fed) and is dropped.

With ``answers=dataset`` the answers are the conversations' own replies instead (how EAGLE's and GRIFFIN's
released training data are made: fixed ShareGPT text, the target's features over it). The target then reads
prompt + reply in one forward pass per batch (right-padded; ``prefill_with_features``): on the embedded pair
~72 positions/s against generation's 25, so the same hour gives ~2.8× more positions. The head still learns
the target's own next-token distribution (its targets are the target's softmax), but its input tokens are
another model's text rather than what the target would have said.

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

from ...errors import ConfigError

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


def padded(sequences: Sequence[list[int]], pad_id: int, left: bool,
           device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), both (B, longest) on ``device``: each row padded on the left (generation) or the
    right."""
    width = max(len(ids) for ids in sequences)
    batch = torch.full((len(sequences), width), pad_id, dtype=torch.long, device=device)
    attention = torch.zeros_like(batch)
    for row, ids in enumerate(sequences):
        cols = slice(width - len(ids), width) if left else slice(0, len(ids))
        batch[row, cols] = torch.tensor(ids)
        attention[row, cols] = 1
    return batch, attention


@torch.inference_mode()
def generate_with_features(model, prompts: Sequence[list[int]], max_new_tokens: int, eos_ids: set[int],
                           pad_id: int) -> list[dict]:
    """Greedy answers and per-position features for a batch: [{ids (n,) int32, start, hidden (n, H)}]."""
    ids, attention = padded(prompts, pad_id, left=True, device=model.device)
    width = ids.shape[1]
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
                     "hidden": features.to("cpu", copy=True)})  # its own storage, on the CPU: shards load anywhere
    return rows


@torch.inference_mode()
def prefill_with_features(model, sequences: Sequence[tuple[list[int], int]], pad_id: int) -> list[dict]:
    """Features of given (ids, answer start) sequences from one right-padded forward pass: the rows
    ``generate_with_features`` gives, for text the target did not choose. The decoder alone runs (no lm_head:
    the features are all that is kept)."""
    batch, attention = padded([ids for ids, _ in sequences], pad_id, left=False, device=model.device)
    hidden = model.base_model(input_ids=batch, attention_mask=attention, use_cache=False).last_hidden_state
    # (B, width, H) after the final norm
    return [{"ids": torch.tensor(ids, dtype=torch.int32), "start": start,
             "hidden": hidden[row, :len(ids)].to("cpu", copy=True)} for row, (ids, start) in enumerate(sequences)]


def answer_eos(pair) -> int:
    """The EOS a given answer ends with: the tokenizer's (a chat model's end of turn) when the pair stops on it."""
    return pair.tokenizer.eos_token_id if pair.tokenizer.eos_token_id in pair.eos_ids else min(pair.eos_ids)


def with_answer(tokenizer, prompt_ids: list[int], answer: str, max_new_tokens: int, eos: int) -> list[int]:
    """prompt ids + the answer's tokens (at most ``max_new_tokens``, ending with ``eos`` when it fits)."""
    tokens = tokenizer(answer, add_special_tokens=False)["input_ids"][:max_new_tokens]
    return list(prompt_ids) + list(tokens) + ([eos] if len(tokens) < max_new_tokens else [])


def extract(pair, prompts: Sequence[tuple], directory: Path, max_new_tokens: int, batch_size: int,
            max_prompt_tokens: int, identity: dict, log=print) -> Path:
    """Store every (id, text) prompt not yet in ``directory``'s manifest with the target's greedy answer, or every
    (id, text, answer) with that answer (``prefill_with_features``)."""
    directory = Path(directory)
    check_identity(directory, identity)
    done = done_prompts(directory)
    encoded, too_long = [], 0
    given_answers = any(len(item) == 3 for item in prompts)
    eos = answer_eos(pair) if given_answers else None
    for pid, text, *answer in prompts:
        if pid in done:
            continue
        ids = pair.encode(text)
        if len(ids) > max_prompt_tokens:
            too_long += 1
            continue
        start = len(ids)  # where the answer begins
        if answer:
            ids = with_answer(pair.tokenizer, ids, answer[0], max_new_tokens, eos)
        encoded.append((pid, ids, start))
    shard = len(list(directory.glob("shard-*.pt")))
    log(f"[heads] extract: {len(done)} prompt(s) kept, {len(encoded)} to run, {too_long} longer than "
        f"{max_prompt_tokens} tokens skipped")
    encoded.sort(key=lambda item: len(item[1]))  # similar lengths share a batch (less padding)
    pad = pair.tokenizer.pad_token_id if pair.tokenizer.pad_token_id is not None else min(pair.eos_ids)
    for first in range(0, len(encoded), batch_size):
        batch = encoded[first:first + batch_size]
        start = time.perf_counter()
        if given_answers:
            rows = prefill_with_features(pair.target, [(ids, at) for _, ids, at in batch], pad)
        else:
            rows = generate_with_features(pair.target, [ids for _, ids, _ in batch], max_new_tokens, pair.eos_ids,
                                          pad)
        for (pid, _, _), row in zip(batch, rows):
            row["id"] = pid
        path = directory / f"shard-{shard:05d}.pt"
        torch.save(rows, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
        answer = sum(len(r["ids"]) - r["start"] for r in rows)
        with open(directory / MANIFEST, "a") as f:
            f.write(json.dumps({"shard": path.name, "prompts": [pid for pid, _, _ in batch], "answer_tokens": answer,
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
                          "first (python -m specbench.training.heads stage=extract)")
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            rows += torch.load(Path(directory) / json.loads(line)["shard"], map_location="cpu", weights_only=False)
    if not rows:
        raise ConfigError(f"heads: {directory} holds no sequences; run the extract stage")
    return rows


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
