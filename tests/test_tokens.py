"""Hand-built token cases: accounting, greedy verification, divergence, the record store."""
import json

import torch

from specbench.decoding.generation import finalize_tokens, is_finished
from specbench.decoding.proposal import Proposal
from specbench.decoding.verify import verify_tree_argmax
from specbench.analysis.metrics import first_divergence
from specbench.records.store import RecordStore


def one_hot_logits(tokens, vocab=10):
    logits = torch.full((len(tokens), vocab), -5.0)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


def verify_greedy(draft, target_logits):
    """Greedy verification of a chain: (draft tokens accepted, the target's next token)."""
    path, nxt = verify_tree_argmax(Proposal.chain(draft), target_logits.argmax(dim=-1).tolist())
    return len(path), nxt


def test_finalize_cuts_after_first_eos_and_caps():
    assert finalize_tokens([5, 6, 2, 7, 2], 10, {2}) == [5, 6, 2]
    assert finalize_tokens([5, 6, 7, 8], 3, {2}) == [5, 6, 7]
    assert finalize_tokens([5, 2], 1, {2}) == [5]
    assert finalize_tokens([], 4, {2}) == []
    assert finalize_tokens([1, 2, 3], 5, set()) == [1, 2, 3]


def test_is_finished():
    assert is_finished([1, 2], 2, set())
    assert is_finished([1, 9], 5, {9})
    assert not is_finished([1, 3], 5, {9})


def test_verify_greedy_accepts_matching_prefix_then_corrects():
    # target argmax after each position: 3, 4, 7, 8 ; draft 3, 4, 5
    n, nxt = verify_greedy([3, 4, 5], one_hot_logits([3, 4, 7, 8]))
    assert (n, nxt) == (2, 7)


def test_verify_greedy_all_accepted_gives_bonus():
    assert verify_greedy([3, 4], one_hot_logits([3, 4, 9])) == (2, 9)


def test_verify_greedy_first_rejected_and_empty_draft():
    assert verify_greedy([1, 4], one_hot_logits([3, 4, 9])) == (0, 3)
    assert verify_greedy([], one_hot_logits([6])) == (0, 6)


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_record_store_repairs_truncated_line(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl")
    store.append({"prompt_id": "a", "repeat": 0})
    store.append({"prompt_id": "b", "repeat": 0})
    with open(store.path, "ab") as fh:  # a crash in the middle of writing the third record
        fh.write(b'{"prompt_id": "c", "rep')
    size = store.path.stat().st_size
    records = store.load()
    assert [r["prompt_id"] for r in records] == ["a", "b"]
    assert store.path.stat().st_size == size  # reading never writes: the line may be a write in progress
    with store.lock():  # the writer's lock repairs the file first, as the runner takes it before appending
        store.append({"prompt_id": "c", "repeat": 0})
    lines = store.path.read_text().splitlines()
    assert [json.loads(line)["prompt_id"] for line in lines] == ["a", "b", "c"]
