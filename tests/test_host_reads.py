"""Device-to-host reads per decoding step (decoding/host_reads.py), counted on a CPU: what a GPU run would sync on.
The losslessness evidence (each token's top-K row) stays on the device during the step and is read after the
clocks stop: greedy reads once per token (its argmax), as a fast greedy loop does."""
import torch

from specbench.decoding.evidence import TokenEvidence, evidence_of, rows_at
from specbench.decoding.host_reads import count_host_reads
from specbench.methods.greedy import Greedy
from specbench.methods.speculative import SpeculativeDecoding
from specbench.models.tiny import build_tiny_pair

PROMPT = list(range(5, 30))


def test_the_counter_counts_reads_where_they_are_made_and_restores_torch():
    x = torch.arange(6)
    with count_host_reads() as reads:
        x.tolist(), int(x[2]), float(x[3]), bool(x[1]), [0, 1, 2][x[1]]
    assert sum(reads.values()) == 5
    assert {name for name, _ in reads} == {"tolist", "__int__", "__float__", "__bool__", "__index__"}
    assert all("test_host_reads.py:" in where for _, where in reads)
    x.tolist()
    assert sum(reads.values()) == 5  # restored


def test_greedy_reads_once_per_token_its_evidence_none_until_the_clocks_stop():
    pair = build_tiny_pair()
    with count_host_reads() as reads:
        generation = Greedy(pair, "greedy").generate(PROMPT, 24, set())
    assert len(generation.tokens) == 24 and sum(reads.values()) == 24, reads.most_common(5)
    with count_host_reads() as reads:
        margins = [e.margin for e in generation.evidence]  # read now, after the generation
    assert sum(reads.values()) > 0 and all(m >= 0 for m in margins)


def test_a_speculative_chain_reads_once_per_drafted_token_and_once_per_verify():
    """The draft's argmax per drafted token and the verify's one read per step (γ + 1 per step here; issue 53's
    target, drafting on the device, is 1): the evidence adds none."""
    pair = build_tiny_pair()
    with count_host_reads() as reads:
        generation = SpeculativeDecoding(pair, "speculative", gamma=4).generate(PROMPT, 24, set())
    steps = len(generation.accept_lengths)
    assert sum(reads.values()) == generation.drafted + steps, reads.most_common(5)


def test_evidence_read_later_equals_the_row_read_at_once():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 300, generator=generator)
    logits[3, 17] = logits[3].max() + 1.0  # row 3's token 17 is its argmax; row 1's token 17 is not
    evidence = evidence_of(rows_at(logits, [0, 1, 3]), [int(logits[0].argmax()), 17, 17], block=4)
    for row, item in zip((logits[0], logits[1], logits[3]), evidence):
        top = row.topk(16)
        assert item.top_ids == top.indices.tolist() and item.top_logits == top.values.tolist()
        best_other = max(v for i, v in enumerate(row.tolist()) if i != item.token)
        assert abs(item.margin - (float(row[item.token]) - best_other)) < 1e-6 and item.block == 4
    assert evidence[1].margin < 0 < evidence[2].margin
    assert torch.equal(rows_at(logits, [0, 2, 3]), logits[[0, 2, 3]])  # not a run of rows: stacked
    assert torch.equal(rows_at(logits, [1, 2, 3]), logits[1:4])
    made = TokenEvidence(7, 0.5, [7, 3], [2.0, 1.5], 1)  # made by hand (tests, read-back records): as given
    assert made.margin == 0.5 and made.chosen_logit == 2.0
