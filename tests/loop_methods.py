"""Every method on the one loop, built small for property tests on a tiny pair (any backend or execution mode)."""
from specbench.methods.disco import DiscoClassifier, DiscoSL
from specbench.methods.lookahead import Lookahead
from specbench.methods.ouroboros import Ouroboros
from specbench.methods.prompt_lookup import PromptLookup
from specbench.methods.sam_decoding import SamDecoding
from specbench.methods.sl_policies import ConfidenceSL, HeuristicSL
from specbench.methods.specinfer import SpecInfer
from specbench.methods.speculative import SpeculativeDecoding
from specbench.methods.token_recycling import TokenRecycling
from specbench.methods.swift import Swift
from specbench.models.layer_skip import runs_layer_skipping
from specbench.methods.suffix import SuffixDecoding


def loop_methods(pair, gamma: int) -> dict:
    return {
        "speculative": SpeculativeDecoding(pair, "speculative", gamma=gamma),
        "dyn_heur": SpeculativeDecoding(pair, "dyn_heur", policy=HeuristicSL(initial=gamma)),
        "confidence_sl": SpeculativeDecoding(pair, "confidence_sl", policy=ConfidenceSL(0.3, sl_max=gamma)),
        "disco": SpeculativeDecoding(pair, "disco", policy=DiscoSL(DiscoClassifier().eval(), 0.4, sl_max=gamma)),
        "specinfer": SpecInfer(pair, "specinfer", widths=[2, 2, 1][:max(1, gamma - 1)], max_nodes=8),
        "lookahead": Lookahead(pair, window=3, ngram=3, guesses=3),
        "ouroboros": Ouroboros(pair, gamma=gamma, window=4, beta=3, top_k=2),
        "prompt_lookup": PromptLookup(pair, "prompt_lookup", num_pred_tokens=gamma),
        "token_recycling": TokenRecycling(pair, "token_recycling", tree=[2, 1, 1][:gamma]),
        **({"swift": swift(pair, gamma)} if runs_layer_skipping(pair) else {}),  # torch only
        "sam_decoding": SamDecoding(pair, "sam_decoding", max_draft=gamma),
        "sam_speculative": SamDecoding(pair, "sam_speculative", max_draft=gamma, min_match_length=2,
                                       fallback=SpeculativeDecoding(pair, "speculative", gamma=gamma)),
        "suffix": SuffixDecoding(pair, max_depth=6, max_spec_factor=2.0, max_tree_nodes=gamma + 2),
    }


def swift(pair, gamma: int) -> Swift:
    """SWIFT with its optimisation from the target's cache; a static cache: a fixed set drafting from its own."""
    if pair.execution.static:
        return Swift(pair, gamma=gamma, skip_layers=[1], draft_cache="own")
    return Swift(pair, gamma=gamma, context_window=2, bayes_interval=2)
