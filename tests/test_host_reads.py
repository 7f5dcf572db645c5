"""Device-to-host reads per decoding step (backends/host_reads.py), counted on a CPU: what a GPU run would sync on.
The losslessness evidence (each token's top-K row) stays on the device during the step and is read after the
clocks stop: greedy reads once per token (its argmax), as a fast greedy loop does."""
import pytest
import torch

from specbench.decoding.evidence import TokenEvidence, evidence_of
from specbench.backends.host_reads import count_host_reads
from specbench.backends.staging import rows_at
from specbench.methods.feature_head import FeatureHeadMethod
from specbench.methods.greedy import Greedy
from specbench.methods.medusa import MedusaMethod
from specbench.methods.sl_policies import ConfidenceSL, StaticSL
from specbench.methods.specinfer import SpecInfer
from specbench.methods.speculative import SpeculativeDecoding
from specbench.models.tiny import build_tiny_pair

from .loop_methods import loop_methods
from .test_feature_heads import random_head
from .test_medusa import random_heads

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


def test_a_greedy_speculative_chain_reads_once_per_step():
    """Drafted on the device (the argmax fed back as a tensor), read once with the target's argmax at the verify: one
    read per step; the evidence adds none. Equal output to greedy, and the same counters as drafting on the host."""
    pair = build_tiny_pair()
    greedy = Greedy(pair, "greedy").generate(PROMPT, 24, set())
    with count_host_reads() as reads:
        generation = SpeculativeDecoding(pair, "speculative", gamma=4).generate(PROMPT, 24, set())
    steps = len(generation.accept_lengths)
    assert generation.tokens == greedy.tokens
    assert sum(reads.values()) == steps, reads.most_common(5)


def test_policies_that_judge_each_draft_and_sampling_read_each_drafted_token():
    pair = build_tiny_pair()
    with count_host_reads() as reads:
        generation = SpeculativeDecoding(pair, "confidence", policy=ConfidenceSL(0.0, sl_max=4)).generate(
            PROMPT, 24, set())
    # the argmax and the policy's confidence per drafted token, one read per verify
    assert sum(reads.values()) == 2 * generation.drafted + len(generation.accept_lengths), reads.most_common(5)


class JudgingEachDraft(StaticSL):
    """Static γ, but as a policy that may stop a draft: DraftChain drafts it on the host, reading every token."""

    def keep_drafting(self, drafted, logits, token):
        return True


def test_a_sampled_chain_is_drafted_on_the_device_and_reads_three_times_per_step():
    """T > 0: drafts drawn on the device (read with the verify's argmax), then one read of p and q at every draft for
    the rejection tests and one of the token sampled after them. The same seed gives the same output as drafting on
    the host (the same draws from the same generator, in the same order)."""
    pair = build_tiny_pair()
    on_device = SpeculativeDecoding(pair, "speculative", gamma=4, temperature=1.0)
    on_host = SpeculativeDecoding(pair, "speculative", policy=JudgingEachDraft(4), temperature=1.0)
    assert not on_device.policy.stops_early and on_host.policy.stops_early
    on_device.reset(3)
    with count_host_reads() as reads:
        generation = on_device.generate(PROMPT, 24, set())
    steps = len(generation.accept_lengths)
    assert 2 * steps < sum(reads.values()) <= 3 * steps, reads.most_common(5)
    on_host.reset(3)
    with count_host_reads() as host_reads:
        host = on_host.generate(PROMPT, 24, set())
    assert host.tokens == generation.tokens and host.accept_lengths == generation.accept_lengths
    assert sum(host_reads.values()) == sum(reads.values()) + host.drafted  # the host draft reads each token


ONE_READ_PER_STEP = ["speculative", "dyn_heur", "token_recycling", "prompt_lookup", "lookahead", "sam_decoding",
                     "sam_speculative", "suffix"]


@pytest.mark.parametrize("name", ONE_READ_PER_STEP)
def test_methods_on_the_loop_read_once_per_step(name):
    """Drafts on the device or from host structures (n-gram pools, automata, Token Recycling's matrix in numpy),
    and the verify's argmax, drafted ids and top-k rows in one read."""
    pair = build_tiny_pair()
    method = loop_methods(pair, 4)[name]
    method.reset(0)
    with count_host_reads() as reads:
        generation = method.generate(PROMPT, 24, set())
    assert generation.tokens == Greedy(pair, "greedy").generate(PROMPT, 24, set()).tokens
    assert sum(reads.values()) == len(generation.accept_lengths), reads.most_common(5)


@pytest.mark.parametrize("kind", ["eagle", "medusa", "specinfer", "eagle1", "medusa_template"])
def test_dynamic_trees_read_once_per_depth_static_trees_once_per_step(kind, tmp_path):
    """EAGLE-2 (GRIFFIN's tree is the same code), Medusa's grown tree and SpecInfer: one read per depth expanded (its
    scores and ids together), plus the verify's. EAGLE-1's template: one per depth too (each depth's ranks come from
    the head forward over the one before). Medusa's static template: every head reads h_t alone, one read for all."""
    pair = build_tiny_pair()
    depth = 3
    if kind == "specinfer":
        method = SpecInfer(pair, "specinfer", widths=[2, 2, 1], max_nodes=8)
    elif kind.startswith("medusa"):
        template = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]] if kind == "medusa_template" else None
        method = MedusaMethod(pair, "medusa", head=random_heads(pair, "medusa", tmp_path, heads=depth), top_k=3,
                              depth=depth, max_nodes=10, tree=template)
    else:
        template = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]] if kind == "eagle1" else None
        method = FeatureHeadMethod(pair, kind, kind="eagle", head=random_head(pair, "eagle", tmp_path), top_k=3,
                                   depth=depth, max_nodes=10, tree=template)
    with count_host_reads() as reads:
        generation = method.generate(PROMPT, 24, set())
    assert generation.tokens == Greedy(pair, "greedy").generate(PROMPT, 24, set()).tokens
    steps = len(generation.accept_lengths)
    per_step = 2 if kind == "medusa_template" else depth + 1
    assert steps < sum(reads.values()) <= per_step * steps, reads.most_common(5)


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
