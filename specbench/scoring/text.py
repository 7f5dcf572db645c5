"""Text scorers: GSM8K final-number exact match, ROUGE (rouge-score), corpus BLEU (sacrebleu), none."""
from __future__ import annotations

import re
import statistics
from decimal import Decimal, InvalidOperation
from functools import lru_cache

from .registry import mean_percent, register

# A number as models and GSM8K write them: optional sign or currency, thousands commas, decimals.
NUMBER = re.compile(r"[-−]?\s?\$?\s?\d[\d,]*(?:\.\d+)?")
ANSWER_IS = re.compile(r"answer\s+is\s*:?\s*", re.IGNORECASE)
BOXED = re.compile(r"\\boxed\{([^}]*)\}")


def parse_number(text: str) -> Decimal | None:
    """'$1,234.50' -> 1234.50, '−7' -> -7; None when no number can be read."""
    cleaned = text.replace("−", "-").replace("$", "").replace(",", "").replace(" ", "").rstrip(".")
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        return None


def _first_number(text: str) -> Decimal | None:
    match = NUMBER.search(text)
    return parse_number(match.group()) if match else None


def extract_answer(text: str) -> Decimal | None:
    """The final answer of a solution, by priority: the last 'The answer is N', the last '#### N',
    the last \\boxed{N}, else the last number in the text."""
    for pattern in (ANSWER_IS, re.compile(r"####\s*")):
        hits = list(pattern.finditer(text))
        for hit in reversed(hits):
            number = _first_number(text[hit.end(): hit.end() + 40])
            if number is not None:
                return number
    boxed = BOXED.findall(text)
    if boxed and (number := _first_number(boxed[-1])) is not None:
        return number
    numbers = NUMBER.findall(text)
    return parse_number(numbers[-1]) if numbers else None


def gsm8k_reference(answer: str) -> Decimal | None:
    """GSM8K's reference solution ends with '#### N'."""
    _, sep, final = answer.rpartition("####")
    return parse_number(final.strip()) if sep else extract_answer(answer)


@register("gsm8k_exact_match", primary="accuracy", aggregate=mean_percent(accuracy="correct"))
def gsm8k_exact_match(outputs: list[str], example) -> dict:
    expected = gsm8k_reference(str(example.reference))
    if expected is None:
        raise ValueError(f"no number in the reference of {example.id}")
    predicted = extract_answer(outputs[-1])
    return {"correct": float(predicted is not None and predicted == expected),
            "predicted": None if predicted is None else str(predicted), "expected": str(expected)}


@lru_cache(maxsize=8)
def _rouge(types: tuple[str, ...], use_stemmer: bool):
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(types), use_stemmer=use_stemmer)


def _rouge_aggregate(values: list[dict]) -> dict:
    keys = [k for k in values[0] if k.startswith("rouge")]
    return {k: 100 * statistics.fmean(v[k] for v in values) for k in keys}


@register("rouge", primary="rouge1", aggregate=_rouge_aggregate)
def rouge(outputs: list[str], example, types=("rouge1", "rouge2", "rougeL"), use_stemmer: bool = True) -> dict:
    """ROUGE F-measures against the reference (rouge-score, Porter stemming); the summary prints percent."""
    scores = _rouge(tuple(types), use_stemmer).score(str(example.reference), outputs[-1])
    return {k: scores[k].fmeasure for k in types}


@register("rouge_l", primary="rougeL", aggregate=_rouge_aggregate)
def rouge_l(outputs: list[str], example, use_stemmer: bool = True) -> dict:
    return rouge(outputs, example, types=("rougeL",), use_stemmer=use_stemmer)


@lru_cache(maxsize=8)
def _bleu(tokenize: str, effective_order: bool = False):
    from sacrebleu.metrics import BLEU

    return BLEU(tokenize=tokenize, effective_order=effective_order)


def _bleu_aggregate(values: list[dict]) -> dict:
    """Corpus BLEU from summed sufficient statistics (identical to sacrebleu's corpus_score)."""
    from sacrebleu.metrics import BLEU

    tokenize = values[0]["tokenize"]
    stats = [sum(column) for column in zip(*(v["bleu_stats"] for v in values))]
    # A fresh metric, not the one scoring used: the values may all come from disk (records of an earlier
    # process), and its signature needs the number of references, which sacrebleu learns only from scoring.
    bleu = BLEU(tokenize=tokenize)
    bleu.num_refs = 1  # every prompt has one reference
    return {"bleu": bleu._compute_score_from_stats(stats).score,
            "bleu_sentence_mean": statistics.fmean(v["bleu_sentence"] for v in values),
            "signature": str(bleu.get_signature())}


@register("bleu", primary="bleu", aggregate=_bleu_aggregate)
def bleu(outputs: list[str], example, tokenize: str = "13a") -> dict:
    """Per prompt: sentence BLEU and the n-gram statistics that corpus BLEU sums (sacrebleu)."""
    hypothesis, reference = outputs[-1].strip(), str(example.reference)
    stats = _bleu(tokenize)._extract_corpus_statistics([hypothesis], [[reference]])[0]
    sentence = _bleu(tokenize, effective_order=True).sentence_score(hypothesis, [reference]).score
    return {"bleu_sentence": sentence, "bleu_stats": [int(x) for x in stats], "tokenize": tokenize}


@register("none", primary=None, aggregate=lambda values: {})
def not_scored(outputs: list[str], example, reason: str = "no automatic metric") -> None:
    """No automatic metric (e.g. MT-Bench without a judge): reported as not scored, never as a number."""
    return None
