"""Helpers for the sampling tests (not a test module): a tiny-vocabulary model pair, the target's exact
distribution over whole generations by enumeration, and a pooled chi-square goodness-of-fit test."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from specbench.models.pair import ModelPair, prepare_for_inference
from specbench.backends.precision import resolve_precision
from specbench.models.tiny import perturbed_copy, tiny_model

VOCAB, EOS = 6, 3
PROMPT = [1, 2, 4]
MAX_NEW = 3  # 1 + 5 + 150 = 156 possible generations ([EOS], [x, EOS], [x, y, z] with x, y != EOS)


class IdsOnlyTokenizer:
    """Token ids only (the tests feed ids): what a ModelPair and tiny_model ask of a tokenizer."""

    def __init__(self, size: int, eos: int):
        self.size, self.eos_token_id, self.bos_token_id, self.pad_token_id = size, eos, None, None

    def __len__(self) -> int:
        return self.size


def small_vocab_pair(vocab: int = VOCAB, eos: int = EOS, init_range: float = 0.3, draft_noise: float = 0.15,
                     seed: int = 0) -> ModelPair:
    """A 1-layer Llama with a 6-token vocabulary (fp32, eager) and a noisy copy as its draft.

    init_range 0.3 gives spread-out next-token distributions (no token above ~0.45) and EOS (token 3) ~0.2
    likely after the prompt, so generations of 1, 2 and 3 tokens all occur; draft noise 0.15 gives an
    acceptance rate near 0.8 at temperature 1, i.e. frequent rejections.
    """
    tok = IdsOnlyTokenizer(vocab, eos)
    precision = resolve_precision("float32", "cpu", "auto")
    target = tiny_model("llama", vocab, 16, 1, seed, init_range, tok)
    draft = perturbed_copy(target, draft_noise, seed + 1)
    target, draft = (prepare_for_inference(m, "cpu", precision) for m in (target, draft))
    return ModelPair(name=f"tiny-v{vocab}", target=target, draft=draft, tokenizer=tok, eos_ids={eos},
                     precision=precision)


def reference_probs(logits: torch.Tensor, temperature: float, top_p: float) -> list[float]:
    """Next-token distribution of (V,) logits at ``temperature`` with nucleus ``top_p``, written independently of
    sampling.py: the smallest set of most likely tokens whose mass reaches top_p, renormalised."""
    probs = torch.softmax(logits.double() / temperature, dim=-1).tolist()
    order = sorted(range(len(probs)), key=lambda v: -probs[v])
    kept, mass = [], 0.0
    for v in order:
        if mass >= top_p:
            break
        kept.append(v)
        mass += probs[v]
    return [probs[v] / mass if v in kept else 0.0 for v in range(len(probs))]


@torch.inference_mode()
def exact_sequence_distribution(model, temperature: float, top_p: float, prompt: list[int], max_new_tokens: int,
                                eos_ids: set[int]) -> dict[tuple, float]:
    """P(generation) under ``model`` sampled autoregressively at (temperature, top_p): every sequence of new
    tokens that stops at the first EOS or at the budget, with its probability (product of the processed
    next-token probabilities, each from a fresh full forward: no KV cache involved)."""
    dist: dict[tuple, float] = {}

    def walk(seq: list[int], prob: float) -> None:
        if len(seq) == max_new_tokens or (seq and seq[-1] in eos_ids):
            dist[tuple(seq)] = prob
            return
        p = reference_probs(model(torch.tensor([prompt + seq])).logits[0, -1], temperature, top_p)
        for token, pt in enumerate(p):
            if pt > 0:
                walk(seq + [token], prob * pt)

    walk([], 1.0)
    return dist


def sample_generations(method, prompt: list[int], max_new_tokens: int, eos_ids: set[int], n: int):
    """n generations, generation i after ``method.reset(i)``; returns (Counter of token tuples, list of Generations)."""
    counts, gens = Counter(), []
    for seed in range(n):
        method.reset(seed)
        gen = method.generate(prompt, max_new_tokens, eos_ids)
        counts[tuple(gen.tokens)] += 1
        gens.append(gen)
    return counts, gens


def outputs_by_seed(method, prompt: list[int], max_new_tokens: int, seeds=range(6)) -> set[tuple[int, ...]]:
    """The distinct outputs of ``method`` reset to each seed in turn (no EOS): as many as seeds unless a seed
    is ignored."""
    outputs = set()
    for seed in seeds:
        method.reset(seed)
        outputs.add(tuple(method.generate(prompt, max_new_tokens, set()).tokens))
    return outputs


def goodness_of_fit(counts: Counter, dist: dict[tuple, float], min_expected: float = 5.0) -> float:
    """Pearson chi-square p-value of the observed generations against ``dist``: cells expected below
    ``min_expected`` times are pooled into one (so the chi-square approximation holds); a generation ``dist``
    gives probability 0 (impossible under it) makes the p-value 0."""
    n = sum(counts.values())
    if any(dist.get(seq, 0.0) <= 0.0 for seq in counts):
        return 0.0
    total = sum(dist.values())
    expected = {seq: n * p / total for seq, p in dist.items()}
    big = [seq for seq, e in expected.items() if e >= min_expected]
    small = [seq for seq in expected if seq not in big]
    observed = [counts.get(seq, 0) for seq in big]
    wanted = [expected[seq] for seq in big]
    pooled = sum(expected[seq] for seq in small)
    if pooled > 0:
        observed.append(sum(counts.get(seq, 0) for seq in small))
        wanted.append(pooled)
    scale = n / sum(wanted)  # float rounding only: chisquare wants equal sums
    return float(chisquare(observed, [w * scale for w in wanted]).pvalue)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: one thread is fastest, and on a loaded 2-core machine several spin-waiting OpenMP threads are
    ~10x slower. Autouse in the modules that import it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
