"""The planted bugs (tests/planted_bugs.py) on the embedded pair, where the noise is real: llama.cpp's Q4_K_M GGUF
(the default backend) and transformers in bf16 (where the CPU computes bf16 natively). Each bug must make the run
report a MISMATCH, and the correct methods none, on prompts whose answers run the whole budget."""
import pytest
import torch

from specbench.analysis.lossless import MISMATCH
from specbench.methods.prompt_lookup import PromptLookup
from specbench.methods.speculative import SpeculativeDecoding
from specbench.backends.precision import native_bf16

from .planted_bugs import verdicts

pytestmark = pytest.mark.slow

PROMPTS = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
           "clips did Natalia sell altogether in April and May?",
           "Write a Python function that checks whether a string is a palindrome.",
           "Explain what a hash table is.",
           "Describe the water cycle in detail.")
BUDGET = 64
# second_best is planted at the second verification step: its token is among the first 2·(4 + 1) emitted (γ = 4 and
# num_pred_tokens = 4 here) and the own-forward check names it there, so 16 tokens decide; the stale entry's effect
# shows later and varies (indices 2-36 measured on Q4), so it keeps the whole budget
BUDGETS = {"second_best": 16}
METHODS = {"speculative": lambda pair: SpeculativeDecoding(pair, "speculative", gamma=4),
           "prompt_lookup": lambda pair: PromptLookup(pair, "prompt_lookup", num_pred_tokens=4)}


def load(backend: str, dtype: str = "auto"):
    from specbench.models.embedded import load_embedded_pair

    return load_embedded_pair("qwen2.5-coder-1.5b-0.5b", backend=backend, dtype=dtype)


def caught(pair, method: str, bug: str | None) -> list[str]:
    prompts = [pair.encode(text) for text in PROMPTS]
    found = verdicts(pair, lambda: METHODS[method](pair), bug, prompts, BUDGETS.get(bug, BUDGET), pair.eos_ids)
    print(method, bug, [(v["verdict"], v.get("check"), v.get("index"), round(v.get("gap", 0.0), 3)) for v in found])
    return [v["verdict"] for v in found]


@pytest.fixture(scope="module")
def q4_pair():
    return load("llamacpp")


@pytest.mark.parametrize("method", sorted(METHODS))
def test_llamacpp_q4_catches_the_planted_bugs_and_passes_the_correct_methods(q4_pair, method):
    """Q4's noise is the largest here (pair disagreements up to ~0.6 logits): the old 4δ rule (2.48 logits) passed
    these bugs as near-ties. A block fed at shifted positions cannot run on llama.cpp (tests/test_lossless.py)."""
    assert MISMATCH not in caught(q4_pair, method, None)
    for bug in ("second_best", "stale_kv"):
        assert caught(q4_pair, method, bug).count(MISMATCH) >= len(PROMPTS) - 1, bug


@pytest.mark.skipif(not native_bf16(torch.device("cpu"))[0], reason="bf16 is emulated on this CPU (no AVX512-BF16 "
                    "or AMX): the embedded pair's bf16 numerics are not what a run here uses")
def test_transformers_bf16_catches_the_planted_bugs_and_passes_the_correct_methods():
    """bf16's lm_head rounds logits to steps of 0.0625-0.25: the shifted-positions bug moves them by about that much
    on the speculative chain, more on prompt lookup's longer-lived blocks (measured: docs/design.md). On a Sapphire
    Rapids Xeon (AMX, one thread) it first diverged at true near-ties on two prompts, before its drift had grown:
    check 4 (continuation) catches it past them."""
    pair = load("transformers", "bfloat16")
    for method in sorted(METHODS):
        assert MISMATCH not in caught(pair, method, None)
    for bug in ("second_best", "stale_kv"):
        assert caught(pair, "speculative", bug).count(MISMATCH) >= len(PROMPTS) - 1, bug
    assert caught(pair, "prompt_lookup", "shifted_positions").count(MISMATCH) >= len(PROMPTS) - 1
