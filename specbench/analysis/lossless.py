"""Is a divergence from greedy a bug, or rounding at a near-tie? (docs/design.md, *Identical to greedy: near-ties and
mismatches*)

Four checks, at temperature 0, after the clocks stopped; ``check`` in a verdict names the one that decided:

1. **own_forward — every token is its own forward's argmax.** Each emitted token carries its margin under the row of
   logits it was taken from (decoding/evidence.py). A negative margin, or an output token other than the one its row
   was kept for, is a token the method's own verify forward did not rank first: a MISMATCH with no tolerance at all
   (a verifier accepting the second-best token).
2. **agreement — where both chose alike, the rows agree within the noise.** Over the tokens both outputs share, the
   method's row at each position is compared with greedy's by the calibration's own statistic (below): a forward fed
   at the wrong positions or over a stale cache entry moves its rows further than rounding does, whether or not an
   argmax flipped, so a bug that has not (yet) changed a token is caught too.
3. **divergence — a divergence is judged on both forwards' own logits.** Where the method's output first leaves
   greedy's (greedy took g, the method m), greedy's one-token row preferred g by gap_greedy = l_g(g) − l_g(m) >= 0
   and the method's own block row preferred m by gap_method = l_m(m) − l_m(g) >= 0. Their sum, the **gap**, equals
   Δ(m) − Δ(g) with Δ = l_m − l_g: how far the two forwards disagree about this pair of tokens. For a correct method
   that is numerical noise between a one-token row and a block row; for a buggy one it is the bug's own
   perturbation (planted bugs on llama.cpp Q4 and transformers fp32/bf16: tests/test_lossless*.py).
4. **continuation — past a near-tie, the rows still agree.** A bug can first diverge at a genuine near-tie, before
   its drift has grown (shifted positions on prompt lookup, bf16 on an AMX CPU: a gap of 0.125 at the eighth
   token, its rows 23 logits off further on). Past a near-tie the method's rows for its next CONTINUATION
   tokens are compared, by check 2's statistic and tolerance, with one-token rows recomputed along its own output
   (greedy's path over the method's text: ``continuation_rows``); a later choice of another token is weighed by
   check 3's gap. It runs only where a divergence was judged a near-tie and the method's rows were kept.

The noise is measured, never assumed (``measure_noise``): calibration prompts' greedy continuations fed one token at
a time and in blocks (BLOCKS: causal 2/4/8/32, tree-masked 4/32; lookahead's 31 is the largest block a method
here feeds), and for each position the pair disagreement |Δ(b) − Δ(a)| between the step row's argmax a and each of
its next ``PAIR_RANKS`` tokens b (the tokens a near-tie is between). The tolerance for a divergence from a forward
that fed k tokens is ``TOLERANCE_FACTOR`` times the largest pair disagreement calibrated at the smallest block size
>= k (both masks): a high quantile of the right statistic (the calibration's largest of thousands of samples) with
room for its tail, not 4x the largest single-logit difference over the whole vocabulary, which on llama.cpp Q4 was
2.48 logits, wide enough to pass a second-best token. The calibration is cached per (pair, weights, dtype, linear
kernel, threads, torch, device and its name) under ``$SPECBENCH_CACHE/noise/``. A run first calibrates on the first
text alone (a sixth of the cost; the full one takes minutes for a float32 1.5B target on one core): a largest value over
fewer samples is never larger, so a check that passes under it passes under the full calibration, and only a check
that does not pays for the full one (``LosslessCheck._passing``); the verdicts are the full calibration's. A check
that fails on it over more positions than it sampled, or twice as deep, is judged on it extended to them
(``LosslessCheck._extension``: the largest of more samples is larger), a tolerance raised to at most
EXTENSION_CAP times the full one's.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..backends.torch.cached_lm import CachedLM
from ..decoding.evidence import TokenEvidence, evidence_of
from ..environment import device_name
from .lossless_rows import PAIR_RANKS, agreement, disagreements, preference, worst_ratio
from .metrics import first_divergence
from ..files import write_json

CALIBRATION_TEXTS = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Summarize the following passage in one sentence. The city council met on Tuesday to discuss the new budget, "
    "which includes funding for road repairs, two new parks and a larger library.",
    "Translate to German: The weather is nice today, so we are going for a walk by the river.",
    "Question: Why is the sky blue? Answer in detail, with the physics behind it.",
    "Write a long story about a dragon who learns to program in Python, with many details.",
)
IDENTICAL, NEAR_TIE, MISMATCH = "identical", "near-tie", "MISMATCH"
# blocks fed after the prompt, causal ("causal-k") and through the tree-mask path ("tree-k"): noise changes little
# beyond 4 tokens here (llama.cpp Q4, bf16), so 16 is left out and the tree path measured at 4 and 32 only
BLOCKS = (("causal", 2), ("causal", 4), ("causal", 8), ("causal", 32), ("tree", 4), ("tree", 32))
POSITIONS = 64  # greedy positions per calibration text: long enough for the noise a longer context adds
TOLERANCE_FACTOR = 1.5  # tolerance = 1.5 x the largest calibrated pair disagreement (docs/design.md says why)
NOISE_VERSION = 2  # 2: pair disagreements per block (1: the largest single-logit difference, 4x)
# tokens past a near-tie divergence whose rows check 4 compares with one-token rows along the method's own output:
# a bug that first diverged at a genuine near-tie goes on moving rows (shifted positions' drift grows over tens of
# tokens on the embedded pair); the recomputation costs one-token steps over the output up to there
CONTINUATION = 64
REFERENCES_KEPT = 64  # outputs whose recomputed rows check 4 keeps for repeats (64 rows of top-16 each)
QUICK_TEXTS = 1  # a first calibration on the first text alone, enough to pass what passes (LosslessCheck._passing)
# an extended calibration (LosslessCheck._extended) runs to a multiple of this many positions and context depth, so
# that checks of nearby lengths share one (and its cache file)
EXTEND_STEP = 256
# an extension may raise a tolerance to at most this many times the full calibration's: noise varied within 1.0-1.7x
# from 64 to 2,800 tokens deep on the tiny pair, while a bug in the forward path the extension itself runs through
# (measured only when a check fails, by the code running then) would read as noise of any size
EXTENSION_CAP = 2.0


@dataclass
class NoiseProfile:
    """What the calibration measured, per block ("causal-<k>" / "tree-<k>")."""

    max_abs_diff: float  # the largest |logit(one-token steps) - logit(block)| over every vocabulary entry
    per_block: dict  # block -> that, per block
    positions: int
    pair_max: dict = field(default_factory=dict)  # block -> the largest pair disagreement |Δ(b) - Δ(a)|
    pair_p999: dict = field(default_factory=dict)  # block -> its 99.9th percentile
    pair_samples: int = 0  # pair disagreements per block
    version: int = 1
    depth: int | None = None  # the deepest context a sample was read at (prompt + positions; None: not recorded)

    def merged(self, other: "NoiseProfile", cap: float | None = None) -> "NoiseProfile":
        """Both calibrations' samples as one: every largest value the larger of the two, the counts added (a 99.9th
        percentile the larger of the two, an upper bound of the pooled one); with ``cap``, no value above ``cap``
        times this profile's own."""
        def larger(a: dict, b: dict) -> dict:
            both = {k: max(a.get(k, 0.0), b.get(k, 0.0)) for k in a.keys() | b.keys()}
            return both if cap is None else {k: min(v, cap * a.get(k, 0.0)) if k in a else v for k, v in both.items()}

        return NoiseProfile(max_abs_diff=max(self.max_abs_diff, other.max_abs_diff),
                            per_block=larger(self.per_block, other.per_block),
                            positions=self.positions + other.positions, pair_max=larger(self.pair_max, other.pair_max),
                            pair_p999=larger(self.pair_p999, other.pair_p999),
                            pair_samples=self.pair_samples + other.pair_samples, version=self.version,
                            depth=max(self.depth or 0, other.depth or 0))

    def tolerance(self, block: int | None) -> float:
        """The largest pair disagreement a correct forward that fed ``block`` tokens can show, with room for the tail:
        TOLERANCE_FACTOR x the largest calibrated at the smallest calibrated block size >= ``block`` or any smaller
        one (either mask: a larger block is allowed at least the noise a smaller one showed, which keeps a block's
        tolerance from resting on one noisy sample maximum); beyond the largest size, or unknown (None), every
        size's."""
        sizes = sorted({size_of(key) for key in self.pair_max})
        reach = next((k for k in sizes if block is not None and k >= block), sizes[-1])
        return TOLERANCE_FACTOR * max(v for key, v in self.pair_max.items() if size_of(key) <= reach)


def size_of(block_key: str) -> int:
    """"causal-4" -> 4."""
    return int(block_key.rsplit("-", 1)[1])


def _rows_by_blocks(lm: CachedLM, prompt_length: int, tokens: list[int], k: int, tree: bool) -> torch.Tensor:
    """The rows of ``tokens`` fed in blocks of ``k`` after the prompt ``lm`` holds (its first ``prompt_length``
    entries), the cache cropped back to the prompt after: the prompt's entries are the ones every block mode reads,
    prefilled once per calibration text."""
    rows = []
    for i in range(0, len(tokens), k):
        block = tokens[i:i + k]
        parents = list(range(-1, len(block) - 1)) if tree else None  # a chain fed through the explicit-mask path
        rows.append(lm.forward(block, keep_last=len(block), parents=parents))
    lm.crop(prompt_length)
    return torch.cat(rows)


def lm_maker(model_or_pair) -> Callable[[], CachedLM]:
    """A new CachedLM per call: of a bare model (eager), or of a pair's target in the pair's execution mode (a
    static cache of its own, role ``check``), so the noise is that of the forwards the run measured."""
    if hasattr(model_or_pair, "lm"):
        return lambda: model_or_pair.lm("check")
    return lambda: CachedLM(model_or_pair)


def greedy_steps(model, prompt: list[int], n: int, lm: CachedLM | None = None) -> tuple[list[int], torch.Tensor]:
    """Greedy's next ``n`` tokens after ``prompt``, fed one at a time, and the logits each one-token step
    returned ([n, vocab]: row i follows token i, as a block forward's row i does). ``model``: a model or a pair
    (lm_maker); ``lm``: a CachedLM of it to use (left holding the prompt and the n tokens)."""
    lm = lm or lm_maker(model)()
    logits = lm.forward(prompt, keep_last=1)[-1]
    tokens, rows = [], []
    for _ in range(n):
        tokens.append(int(logits.argmax()))
        logits = lm.forward([tokens[-1]])[-1]
        rows.append(logits)
    return tokens, torch.stack(rows)


def pair_disagreements(steps: torch.Tensor, rows: torch.Tensor, ranks: int = PAIR_RANKS) -> torch.Tensor:
    """Per position, the largest |Δ(b) - Δ(a)|, Δ = rows - steps: a = the step row's argmax, b = each of its next
    ``ranks`` tokens (what ``row_disagreement`` computes from two kept rows). (positions,)."""
    order = steps.topk(ranks + 1, dim=-1).indices  # (n, 1 + ranks)
    delta = (rows.float() - steps.float()).gather(1, order)
    return torch.nan_to_num((delta[:, 1:] - delta[:, :1]).abs(), nan=0.0, posinf=0.0).max(dim=-1).values


def measure_noise(model, prompts: list[list[int]], positions: int = POSITIONS, blocks=BLOCKS) -> NoiseProfile:
    """Feed each prompt's greedy continuation one token at a time and in blocks of k (``blocks``: (mask, k)); per
    block: the largest absolute logit difference over every vocabulary entry, and per position the largest pair
    disagreement between the step row's argmax and its next PAIR_RANKS tokens (their largest and 99.9th percentile
    over positions). ``model``: a model, or a pair (its target in the pair's execution mode: lm_maker)."""
    per_block: dict[str, float] = {}
    pairs: dict[str, list[torch.Tensor]] = {}
    for prompt in prompts:
        lm = lm_maker(model)()  # one prefill of the prompt per text: the steps and every block mode read it
        tokens, steps = greedy_steps(model, prompt, positions, lm)
        lm.crop(len(prompt))
        for mask, k in blocks:
            rows = _rows_by_blocks(lm, len(prompt), tokens, k, mask == "tree")
            key = f"{mask}-{k}"
            per_block[key] = max(per_block.get(key, 0.0), float((rows - steps).abs().max()))
            pairs.setdefault(key, []).append(pair_disagreements(steps, rows))
    samples = {key: torch.cat(values) for key, values in pairs.items()}
    return NoiseProfile(max_abs_diff=max(per_block.values()), per_block=per_block, positions=positions * len(prompts),
                        pair_max={k: float(v.max()) for k, v in samples.items()},
                        pair_p999={k: float(v.quantile(0.999)) for k, v in samples.items()},
                        pair_samples=min(len(v) for v in samples.values()), version=NOISE_VERSION,
                        depth=max(len(p) for p in prompts) + positions)


def fingerprint(model) -> str:
    """A cheap digest of the weights (names, shapes, a few values of each), so a changed model never reuses
    another's noise. A GGUF file (llama.cpp) is named by its sha256."""
    if not isinstance(model, torch.nn.Module):
        return model.describe()["sha256"][:16]
    digest = hashlib.sha1()
    for name, param in model.named_parameters():
        digest.update(f"{name}{tuple(param.shape)}".encode())
        digest.update(param.detach().flatten()[:16].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


CHOICE_KEYS = frozenset({"requested", "reason", "warning"})  # how a setting was chosen, not what it computes


def as_computed(record):
    """A record of how a pair computes (its info, precision, execution) less how each setting was chosen
    (``requested``, ``reason``, ``warning``): ``model.backend=auto`` resolved to llama.cpp and an explicit
    ``llamacpp`` compute alike, so they share one noise calibration and one cost table (before, the CLI's auto and a
    test's explicit load of the same GGUF pair at the same threads calibrated twice)."""
    if not isinstance(record, dict):
        return record
    return {key: as_computed(value) for key, value in record.items() if key not in CHOICE_KEYS}


def noise_cache_path(pair, threads: int, texts: int | None = None, extent: tuple[int, int] | None = None) -> Path:
    """``texts``: a calibration on the first ``texts`` calibration texts only (None: all of them); ``extent``:
    the extended calibration of (positions, depth) (``extended_prompt``)."""
    from ..files import cache_root

    # the profile is the target's alone: what the pair says of its draft (loaded or not) must not split the cache
    identity = {"pair": pair.name, "info": as_computed(pair.target_info),
                "precision": as_computed(pair.precision.as_record()),
                **({"execution": as_computed(pair.execution.as_record())} if pair.execution.static else {}),
                "threads": threads, "torch": torch.__version__, "device": str(pair.device),
                "device_name": device_name(pair.device), "weights": fingerprint(pair.target),
                "calibration": NOISE_VERSION, **({} if texts is None else {"texts": texts}),
                **({} if extent is None else {"positions": extent[0], "depth": extent[1]})}
    digest = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_root() / "noise" / f"{pair.name}-{pair.dtype}-{digest}.json"


def noise_profile(pair, threads: int, texts: int | None = None,
                  extent: tuple[int, int] | None = None) -> NoiseProfile:
    """The pair's measured noise, from the cache or measured now (seconds to minutes on a CPU; outside any timed
    region), on every calibration text or the first ``texts``; with ``extent`` (positions, depth), one continuation
    of that many positions ending that deep (``extended_prompt``)."""
    path = noise_cache_path(pair, threads, texts, extent)
    if path.exists():
        profile = NoiseProfile(**json.loads(path.read_text()))
        if profile.depth is None and extent is None:  # cached before depths were recorded: as measure_noise counts
            profile.depth = max(len(pair.encode(text)) for text in CALIBRATION_TEXTS[:texts]) + POSITIONS
        return profile
    if extent is None:
        chosen = CALIBRATION_TEXTS[:texts]
        print(f"[specbench] measuring the target's logit noise between one-token and block forwards ({pair.dtype}, "
              f"{len(chosen)} of {len(CALIBRATION_TEXTS)} calibration texts); once per pair, dtype and machine",
              file=sys.stderr)
        profile = measure_noise(pair, [pair.encode(text) for text in chosen])  # as the runs encode them
    else:
        positions, depth = extent
        print(f"[specbench] a check compared more positions, or deeper, than the logit noise was calibrated on: "
              f"measuring it over {positions} positions up to {depth} tokens of context before judging "
              f"({pair.dtype}); once per pair, dtype, machine and extent", file=sys.stderr)
        profile = measure_noise(pair, [extended_prompt(pair, depth - positions)], positions=positions)
    write_json(path, asdict(profile))
    return profile


def extended_prompt(pair, length: int) -> list[int]:
    """A context of ``length`` tokens (at least one): the calibration texts, as the pair encodes them, one after
    another and again until long enough."""
    tokens = [t for text in CALIBRATION_TEXTS for t in pair.encode(text)]
    return (tokens * (max(length, 1) // len(tokens) + 1))[:max(length, 1)]


def round_up(n: int, step: int) -> int:
    return -(-int(n) // step) * step


def one_token_row(model, prefix: list[int]) -> torch.Tensor:
    """The target's next-token logits after ``prefix`` by a one-token step after a prefill of the rest (greedy's
    path, recomputed where greedy's own row was not kept: a baseline record read back from disk)."""
    lm = lm_maker(model)()
    if len(prefix) > 1:
        lm.forward(prefix[:-1], keep_last=1)
    return lm.forward(prefix[-1:])[-1]


def continuation_rows(model, prompt_ids: list[int], tokens: list[int], start: int, stop: int) -> list[TokenEvidence]:
    """The reference past a divergence, where greedy's own rows are of another text: one-token rows along
    ``prompt_ids + tokens`` by greedy's own path (a prefill of the prompt, then one token at a time, as the
    calibration's step rows), row i (``start <= i < stop``) the target's next-token row after prompt + tokens[:i],
    kept as the evidence of tokens[i] (block 1). ``model``: a model or a pair (lm_maker)."""
    lm = lm_maker(model)()
    row = lm.forward(prompt_ids, keep_last=1)[-1]
    out = []
    for i in range(stop):
        if i >= start:
            out.append(evidence_of(row[None], [tokens[i]], 1)[0])
        if i + 1 < stop:
            row = lm.forward([tokens[i]])[-1]
    return out


def first_difference(greedy_ids: list[int], method_ids: list[int]) -> dict:
    """{"verdict": identical}, or a MISMATCH at the first differing index with both tokens, to be refined by the
    gap there; a MISMATCH with a ``reason`` when one output stops where the other goes on (no choice between two
    tokens to weigh)."""
    d = first_divergence(greedy_ids, method_ids)
    if d is None:
        return {"verdict": IDENTICAL}
    g = greedy_ids[d] if d < len(greedy_ids) else None
    m = method_ids[d] if d < len(method_ids) else None
    result = {"verdict": MISMATCH, "index": d, "greedy_token": g, "method_token": m}
    if g is None or m is None:
        result["reason"] = "lengths differ with a common prefix"
    return result


@dataclass
class Output:
    """What the check reads of one generation: its token ids, the in-memory evidence per token, the stored margins."""

    output_ids: list[int]
    evidence: list = field(default_factory=list)
    margins: list = field(default_factory=list)


def output_of(x) -> Output:
    """A schema.TurnRecord / RunRecord (``output_ids``), a decoding Generation (``tokens``), or bare token ids."""
    if hasattr(x, "output_ids"):
        return Output(list(x.output_ids), list(x.evidence or []), list(x.margins or []))
    if hasattr(x, "tokens"):
        return Output(list(x.tokens), list(x.evidence or []))
    return Output(list(x))


def own_forward_violation(turn: Output) -> dict | None:
    """The first token the method emitted that its own forward did not rank first — a negative margin, or an output
    token other than the one its row was kept for (changed after the forward chose) — if any."""
    if turn.evidence:
        for index, (token, evidence) in enumerate(zip(turn.output_ids, turn.evidence)):
            if token == evidence.token:
                margin = evidence.margin
            else:
                margin = evidence.logit_of(token)[0] - evidence.top_logits[0]
            if margin < 0 or token != evidence.token:
                return {"index": index, "method_token": token, "margin": margin, "own_argmax": evidence.top_ids[0]}
        return None
    for index, margin in enumerate(turn.margins or []):
        if margin < 0:
            return {"index": index, "method_token": turn.output_ids[index], "margin": margin}
    return None


class LosslessCheck:
    """Classifies a method's output against greedy's on the same prompt: identical / near-tie / MISMATCH, by four
    checks (the module docstring): each token its own forward's argmax; over the tokens both chose alike, the
    method's rows within the noise of greedy's; at the first divergence, the two forwards' disagreement about the
    two tokens within the noise; past a near-tie, the method's rows within the noise of one-token rows along its own
    output. ``check`` in a verdict names the one that decided."""

    def __init__(self, pair, threads: int):
        self.pair, self.threads = pair, threads
        self._profile: NoiseProfile | None = None
        self._first: NoiseProfile | None = None
        self._references: dict = {}  # check 4's recomputed rows of the latest outputs (repeats reuse them)
        self._extended_profiles: dict[tuple[int, int], NoiseProfile] = {}  # (positions, depth) -> full + extension

    @property
    def profile(self) -> NoiseProfile:
        """The full calibration (every calibration text)."""
        if self._profile is None:
            self._profile = noise_profile(self.pair, self.threads)
        return self._profile

    def _passing(self) -> NoiseProfile:
        """The calibration a check may pass on: the full one where it is measured (here or cached), else the one on
        the first calibration text (QUICK_TEXTS), a sixth of the cost. Each of its tolerances is at most the full
        one's (a largest value over a subset of the same samples, measured alike), so what passes under it passes
        under the full one; what does not is judged on the full calibration, measured then (``_judged``). The
        verdicts are the full calibration's either way (or its extension's, ``_extension``);
        ``calibration_positions`` says which one decided."""
        if self._profile is not None or noise_cache_path(self.pair, self.threads).exists():
            return self.profile
        if self._first is None:
            self._first = noise_profile(self.pair, self.threads, QUICK_TEXTS)
        return self._first

    def _judged(self, fails, compared: int = 1, depth: int = 0) -> NoiseProfile:
        """The first calibration under which ``fails(profile)`` is False: the quick one, the full one, then, for a
        check of ``compared`` positions up to ``depth`` tokens of context beyond what the full one sampled, the full
        one extended to them (``_extension``); the last of those that applies at the latest."""
        profile = self._passing()
        if profile is not self._profile and not fails(profile):
            return profile
        profile = self.profile
        extent = self._extension(profile, compared, depth) if fails(profile) else None
        if extent is None:
            return profile
        covering = [e for e in self._extended_profiles if e[0] >= extent[0] and e[1] >= extent[1]]
        if covering:  # one measured for a longer or deeper check covers this one
            return self._extended_profiles[min(covering)]
        extension = noise_profile(self.pair, self.threads, extent=extent)
        self._extended_profiles[extent] = profile.merged(extension, cap=EXTENSION_CAP)
        return self._extended_profiles[extent]

    def _extension(self, profile: NoiseProfile, compared: int, depth: int) -> tuple[int, int] | None:
        """(positions, depth) of the calibration a failing check is judged on before it is called a bug, or None
        when the full one covers it. A tolerance is 1.5x the largest of the calibration's samples, and the largest
        of more samples is larger: a check over more positions than the calibration sampled (the agreement check on
        a long output: 2,937 positions against 384 made a correct tiny-model run a MISMATCH) is judged on at least
        as many; a context over twice as deep as any calibrated is calibrated that deep (a cache holds the run's
        longest context, ``pair.reserved``, so the extension stays within it). The extension raises no tolerance
        above EXTENSION_CAP times the full calibration's (``_judged``)."""
        samples, deepest = profile.pair_samples, profile.depth or POSITIONS
        if compared <= samples and depth <= 2 * deepest:
            return None
        positions = round_up(max(compared, POSITIONS), EXTEND_STEP) if compared > samples else POSITIONS
        reach = round_up(max(depth, positions + 1), EXTEND_STEP)
        capacity = getattr(self.pair, "reserved", 0)
        if capacity:
            reach = min(reach, capacity)
            positions = min(positions, reach - 1)
        return positions, reach

    @torch.inference_mode()
    def classify(self, prompt_ids: list[int], greedy, method) -> dict:
        """``greedy``, ``method``: the two generations (schema.TurnRecords, decoding Generations or bare ids:
        ``output_of``); without the method's evidence only greedy's preference at the divergence is weighed (a
        lower bound of the disagreement)."""
        greedy, method = output_of(greedy), output_of(method)
        own = own_forward_violation(method)
        if own is not None:
            return {"verdict": MISMATCH, "check": "own_forward", "index": own["index"],
                    "reason": "a token its own forward did not rank first", "own_forward": own}
        result = first_difference(greedy.output_ids, method.output_ids)
        shared = result.get("index", len(method.output_ids))
        compared = min(shared, len(greedy.evidence), len(method.evidence))
        profile = self._judged(lambda p: (agreement(greedy, method, shared, p) or {"ratio": 0})["ratio"] > 1,
                               compared, len(prompt_ids) + shared)
        agreed = agreement(greedy, method, shared, profile)
        if agreed is not None:
            agreed["calibration_positions"] = profile.positions
        if agreed is not None and agreed["ratio"] > 1:
            return {"verdict": MISMATCH, "check": "agreement", "index": agreed["index"], "agreement": agreed,
                    "reason": "its forward disagreed with greedy's beyond the measured noise where both chose the "
                              "same token", **({"divergence": result["index"]} if "index" in result else {})}
        if agreed is not None:
            result["agreement"] = agreed
        if result["verdict"] == IDENTICAL:
            return result
        if "reason" in result:
            return {**result, "check": "length"}
        d, g, m = result["index"], result["greedy_token"], result["method_token"]
        if d < len(greedy.evidence):
            gap_greedy, greedy_exact = preference(greedy.evidence[d], m)
            greedy_row = "kept"
        else:  # a baseline read back from disk: greedy's one-token row recomputed
            row = one_token_row(self.pair, list(prompt_ids) + list(greedy.output_ids[:d]))
            gap_greedy, greedy_exact, greedy_row = float(row[g] - row[m]), True, "recomputed"
        theirs = method.evidence[d] if d < len(method.evidence) else None
        if theirs is not None:
            gap_method, method_exact = preference(theirs, g)
        else:  # the method's rows were not kept (hf_assisted's generate()): greedy's preference alone, a lower bound
            gap_method, method_exact = 0.0, False
        block = theirs.block if theirs is not None else None
        gap = gap_greedy + gap_method
        profile = self._judged(lambda p: gap > p.tolerance(block), 1, len(prompt_ids) + d + 1)
        tolerance = profile.tolerance(block)
        judged = dict(gap=gap, gap_greedy=gap_greedy, calibration_positions=profile.positions,
                      gap_method=gap_method if theirs is not None else None, exact=greedy_exact and method_exact,
                      greedy_row=greedy_row, method_row="kept" if theirs is not None else "not recorded", block=block,
                      tolerance=tolerance)
        result.update(check="divergence", **judged, verdict=NEAR_TIE if gap <= tolerance else MISMATCH)
        if result["verdict"] == NEAR_TIE and d + 1 < min(len(method.evidence), len(method.output_ids)):
            beyond = self._continuation(list(prompt_ids), method, d)
            result["continuation"] = beyond
            if beyond is not None and beyond["ratio"] > 1:  # check 3's near-tie kept apart: not this verdict's gap
                return {**{k: v for k, v in result.items() if k not in judged}, "verdict": MISMATCH,
                        "check": "continuation", "index": beyond["index"], "divergence": d,
                        "near_tie_at_divergence": judged,
                        "reason": "past a near-tie, its forward disagreed with one-token rows along its own output "
                                  "beyond the measured noise"}
        return result

    def _continuation(self, prompt_ids: list[int], method: Output, d: int) -> dict | None:
        """Check 4: past a near-tie at ``d``, the method's rows for its next CONTINUATION tokens against one-token
        rows recomputed along its own output (continuation_rows), by check 2's statistic and tolerance."""
        stop = min(len(method.evidence), len(method.output_ids), d + 1 + CONTINUATION)
        key = (tuple(prompt_ids), tuple(method.output_ids[:stop]), d)
        references = self._references.pop(key, None)  # a repeat with the same output: the same rows
        if references is None:
            references = continuation_rows(self.pair, prompt_ids, method.output_ids, d + 1, stop)
        self._references[key] = references
        while len(self._references) > REFERENCES_KEPT:
            self._references.pop(next(iter(self._references)))
        samples = disagreements(references, method.evidence[d + 1:stop], first_index=d + 1)
        profile = self._judged(lambda p: (worst_ratio(samples, p) or {"ratio": 0})["ratio"] > 1, len(samples),
                               len(prompt_ids) + stop)
        beyond = worst_ratio(samples, profile)
        return {**beyond, "calibration_positions": profile.positions} if beyond else None
