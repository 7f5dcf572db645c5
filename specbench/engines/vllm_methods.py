"""``method=`` under ``engine=vllm``: each of our method configs maps to vLLM's ``speculative_config``.

The map is keyed by the method config's ``_target_`` (the class our own loops would build), so a renamed or
re-parametrised method (``method=speculative method.gamma=6 method.name=spec6``) maps as its class does. A
method with no vLLM counterpart (lookahead, Ouroboros, SpecInfer trees, the speculation-length policies) is a
ConfigError listing what the engine has, before anything starts.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass

from ..errors import ConfigError, require, positive_int


@dataclass(frozen=True)
class ModelFiles:
    """Where an engine finds a pair: checkpoint dirs or hub ids, and how to read its prompts."""

    target: str
    draft: str | None
    tokenizer: str
    dtype: str            # the resolved torch dtype name: bfloat16, float32, float16
    trust_remote_code: bool = False
    local_files_only: bool = True


def no_speculation(method: dict, files: ModelFiles) -> None:
    return None


def draft_model(method: dict, files: ModelFiles) -> dict:
    require(method.get("policy") is None, "method.policy",
            "vLLM's draft-model speculation drafts a fixed γ each step; speculation-length policies (DISCO, "
            "dyn_heur, ...) run with engine=hf")
    require(files.draft is not None, "model.draft", "this pair has no draft model; method=speculative needs one")
    require(method.get("gamma", 4) != "auto", "method.gamma", AUTO_IS_OURS)
    return {"method": "draft_model", "model": files.draft, "num_speculative_tokens": method.get("gamma", 4)}


AUTO_IS_OURS = ("auto is chosen by our own loops from their measured costs (engine=hf); give vLLM a number")


def ngram(method: dict, files: ModelFiles) -> dict:
    require(method.get("num_pred_tokens", 10) != "auto", "method.num_pred_tokens", AUTO_IS_OURS)
    require(method.get("occurrence", "earliest") == "earliest", "method.occurrence",
            "vLLM's ngram proposer takes the earliest occurrence of the longest n-gram: method.occurrence=earliest "
            f"(got {method.get('occurrence')!r}; recent and earliest_whole run on engine=hf)")
    return {"method": "ngram", "num_speculative_tokens": method.get("num_pred_tokens", 10),
            "prompt_lookup_max": method.get("max_ngram_size", 3), "prompt_lookup_min": method.get("min_ngram_size", 1)}


def suffix(method: dict, files: ModelFiles) -> dict:
    """method=suffix: vLLM's suffix decoding (Arctic Inference). vLLM drafts a single path (Arctic's path mode),
    our loops a tree by default (method.tree); the trees, α and the probability floor are the same settings."""
    require(method.get("min_match", 1) == 1, "method.min_match",
            "vLLM's suffix decoding matches suffixes from 1 token; only our loops (engine=hf) have min_match")
    return {"method": "suffix", "num_speculative_tokens": method.get("max_tree_nodes", 24),
            "suffix_decoding_max_tree_depth": method.get("max_depth", 24),
            "suffix_decoding_max_spec_factor": method.get("max_spec_factor", 1.0),
            "suffix_decoding_min_token_prob": method.get("min_token_prob", 0.1),
            "suffix_decoding_max_cached_requests": method.get("max_cached_requests", 10000)}


def engine_method(method: dict, files: ModelFiles) -> dict:
    name = method["engine_method"]
    positive_int(method.get("num_speculative_tokens", 4), "method.num_speculative_tokens")
    needs_head = name in ("eagle", "eagle3", "medusa")
    require(not needs_head or method.get("head"), "method.head",
            f"vLLM's {name} needs a draft head made for this target: method.head=<Hugging Face id or local dir>")
    config = {"method": name, "num_speculative_tokens": method.get("num_speculative_tokens", 4)}
    if method.get("head"):
        config["model"] = method["head"]
    return {**config, **(method.get("options") or {})}


def published_head(method: dict, kinds: tuple[str, ...], other: str, example: str, depth: int) -> dict:
    """vLLM's speculation named by the method's kind (one of ``kinds``: vLLM's method names) with a head in its
    published format (Hugging Face id or its downloaded directory); a head trained here (specbench's format) or a
    kind vLLM lacks (``other``: what to say) is refused."""
    from pathlib import Path

    from ..models.heads.artifact import CONFIG_FILE, located

    name = method.get("kind", kinds[0])
    require(name in kinds, "method.kind", other)
    head = located(method).get("head")
    require(bool(head), "method.head", f"vLLM's {name} needs a draft head made for this target")
    require(not (Path(str(head)).expanduser() / CONFIG_FILE).exists(), "method.head",
            f"{head} is a head trained here (specbench format); vLLM loads {name.upper()} heads in their published "
            f"format (a Hugging Face id such as {example}). Heads trained here run with engine=hf")
    positive_int(method.get("depth", depth), "method.depth")
    return {"method": name, "model": head, "num_speculative_tokens": method.get("depth", depth)}


def feature_head(method: dict, files: ModelFiles) -> dict:
    """method=eagle / eagle3: vLLM's EAGLE / EAGLE-3 with a published head."""
    require(method.get("tree") is None, "method.tree", "vLLM drafts with an EAGLE head along its own proposal, not "
            "EAGLE-1's static tree: method=eagle1 runs with engine=hf")
    example = ("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B" if method.get("kind") == "eagle3"
               else "yuhuili/EAGLE-LLaMA3-Instruct-8B")
    return published_head(method, ("eagle", "eagle3"), "vLLM has no GRIFFIN drafting; method=griffin runs with "
                          "engine=hf", example, 5)


def medusa_heads(method: dict, files: ModelFiles) -> dict:
    """method=medusa: vLLM's Medusa with published heads (Medusa's format); Hydra's run with engine=hf."""
    return published_head(method, ("medusa",), "vLLM has no Hydra drafting; method=hydra runs with engine=hf",
                          "FasterDecoding/medusa-vicuna-7b-v1.3", 4)


SPECULATIVE_CONFIGS = {
    "specbench.methods.greedy.Greedy": no_speculation,
    "specbench.methods.speculative.SpeculativeDecoding": draft_model,
    "specbench.methods.prompt_lookup.PromptLookup": ngram,
    "specbench.methods.suffix.SuffixDecoding": suffix,
    "specbench.methods.engine_only.EngineMethod": engine_method,
    "specbench.methods.feature_head.FeatureHeadMethod": feature_head,
    "specbench.methods.medusa.MedusaMethod": medusa_heads,
}
# our own classes among them, whose constructors check their settings (the others exist only in vLLM)
CONSTRUCTIBLE = set(SPECULATIVE_CONFIGS) - {"specbench.methods.engine_only.EngineMethod",
                                            "specbench.methods.feature_head.FeatureHeadMethod",
                                            "specbench.methods.medusa.MedusaMethod"}
OURS = "greedy, speculative (fixed γ), prompt_lookup, eagle, eagle3, medusa, mtp, suffix"


def installed_methods() -> list[str]:
    """The speculative methods the installed vLLM accepts (its SpeculativeConfig.method Literal)."""
    from vllm.config.speculative import SpeculativeMethod

    def names(tp):
        for arg in typing.get_args(tp):
            yield from names(arg) if typing.get_args(arg) else [arg]
    return sorted(set(names(SpeculativeMethod)))


def speculative_config(method: dict, files: ModelFiles, key: str = "method") -> dict | None:
    """vLLM's ``speculative_config`` for one of our method configs (plain dict); None: no speculation."""
    build = SPECULATIVE_CONFIGS.get(method.get("_target_"))
    if build is None:
        raise ConfigError(f"{key}={method.get('name')}: vLLM has no counterpart of {method.get('_target_')}; "
                          f"with engine=vllm: {OURS}")
    config = build(method, files)
    if config is not None:
        available = installed_methods()
        require(config["method"] in available, f"{key}.engine_method" if "engine_method" in method else key,
                f"the installed vLLM has no speculative method {config['method']!r}; it has: {', '.join(available)}")
    return config
