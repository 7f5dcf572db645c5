"""EAGLE-3 heads in the ``speculators`` format (the layout vLLM's ``speculative_config`` reads, and the one released
EAGLE-3 heads are converted to): a head trained here runs in vLLM, and a published one runs here.

A directory holds ``config.json`` (``speculators_model_type: eagle3``; ``transformer_layer_config``: the decoder
layer as a Llama config; ``draft_vocab_size``; the target's feature layers as ``eagle_aux_hidden_state_layer_ids``;
the verifier's name) and ``model.safetensors``:

    fc.weight                          (H, 3H)   fc3: [low; mid; high] -> g            (ours: layer_fc)
    layers.0.input_layernorm.weight    (H,)      norm(e)                               (fusion.embed_norm)
    layers.0.hidden_norm.weight        (H,)      norm(g)                               (fusion.hidden_norm)
    layers.0.self_attn.{q,k,v}_proj    (·, 2H)   attention over [norm(e); norm(g)]     (self_attn.*)
    layers.0.self_attn.o_proj, layers.0.post_attention_layernorm, layers.0.mlp.*       (the same names)
    norm.weight                        (H,)      the final norm before lm_head         (norm)
    lm_head.weight                     (V_d, H)  the draft vocabulary's rows
    d2t (V_d,) int64, t2d (V,) bool    target id = i + d2t[i]; which target ids are drafted
    embed_tokens.weight                (V, H)    the target's embeddings (written; ours reads the target's own)

Only EAGLE-3's released layer has this layout (``fusion: norm_concat``, ``final_norm``, one layer, residual g:
``norm_before_residual`` false); heads trained with EAGLE's fc layer (conf/head/eagle3.yaml) cannot be written,
and a checkpoint with speculators' other options (``norm_before_fc``, ``fc_norm``, ``norm_output``,
``norm_before_residual``, more than one layer) is refused by name. Qwen2's q/k/v biases go into a Llama layer
with ``attention_bias`` (whose o_proj has a bias too: written as zeros, refused on load unless zero).
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch

from ...errors import ConfigError
from .draft_head import DraftHead, HeadConfig
from ...files import read_weights

CONFIG, WEIGHTS = "config.json", "model.safetensors"
LAYER = "layers.0."
# speculators' names -> ours (models/draft_head.DraftHead); the rest of the layer keeps its name
NAMES = {"fc.": "layer_fc.", f"{LAYER}input_layernorm.": "fusion.embed_norm.",
         f"{LAYER}hidden_norm.": "fusion.hidden_norm.", LAYER: "", "norm.": "norm."}
UNSUPPORTED = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")  # speculators' other layers


def is_speculators(directory: Path) -> bool:
    path = Path(directory) / CONFIG
    if not path.is_file():
        return False
    try:
        return "speculators_model_type" in json.loads(path.read_text())
    except (json.JSONDecodeError, TypeError):
        return False


def exportable(config: HeadConfig) -> str | None:
    """Why a head cannot be written in the speculators format (None: it can)."""
    if config.kind != "eagle3" or config.fusion != "norm_concat" or not config.final_norm:
        return (f"a {config.kind} head with fusion {config.fusion} (final_norm {config.final_norm}); the speculators "
                "format holds EAGLE-3's released layer: kind eagle3, fusion norm_concat, final_norm "
                "(train one with head=eagle3_published)")
    return None


def layer_config(config: HeadConfig, max_positions: int) -> dict:
    """The head's decoder layer as a Llama config (speculators' ``transformer_layer_config``)."""
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
            "num_hidden_layers": 1, "num_attention_heads": config.num_heads,
            "num_key_value_heads": config.num_kv_heads, "head_dim": config.head_dim, "hidden_act": "silu",
            "rms_norm_eps": config.rms_eps, "attention_bias": config.attention_bias, "mlp_bias": False,
            "max_position_embeddings": max_positions, "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
            "rope_theta": config.rope_theta}


def save_speculators(directory: Path, head: DraftHead, lm_head: torch.Tensor, draft_ids: torch.Tensor | None,
                     embed: torch.Tensor, verifier: str, verifier_architecture: str, max_positions: int = 32768,
                     provenance: dict | None = None):
    """Write ``head`` (with the (V_d, H) ``lm_head`` rows it ranks, its draft vocabulary's target ids and the
    target's (V, H) embeddings) as a speculators EAGLE-3 checkpoint for the target ``verifier`` (its name or path,
    as vLLM is given it, and its architecture, e.g. Qwen2ForCausalLM). The embeddings are written although they are
    the target's: speculators' model initializes a missing embed_tokens at random instead of reading the
    verifier's (found by tests/test_speculators_format.py)."""
    from safetensors.torch import save_file

    cfg = head.cfg
    problem = exportable(cfg)
    if problem:
        raise ConfigError(f"head: cannot write {problem}")
    ours_to_theirs = {new: old for old, new in NAMES.items() if new}
    tensors = {}
    for name, tensor in head.state_dict().items():
        prefix = next((p for p in ours_to_theirs if name.startswith(p)), None)
        theirs = ours_to_theirs[prefix] + name[len(prefix):] if prefix else LAYER + name
        tensors[theirs] = tensor.detach().float().cpu().contiguous()
    if cfg.attention_bias:  # a Llama layer with attention_bias has an o_proj bias: ours is none, i.e. zero
        tensors[f"{LAYER}self_attn.o_proj.bias"] = torch.zeros(cfg.hidden_size)
    ids = torch.arange(cfg.vocab_size) if draft_ids is None else draft_ids.long().cpu()
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    tensors.update({"lm_head.weight": lm_head.detach().float().cpu().contiguous(),
                    "d2t": (ids - torch.arange(len(ids))).contiguous(), "t2d": t2d,
                    "embed_tokens.weight": embed.detach().float().cpu().contiguous()})
    config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
              "transformer_layer_config": layer_config(cfg, max_positions), "draft_vocab_size": len(ids),
              "norm_before_residual": False, "norm_before_fc": False, "fc_norm": False, "norm_output": False,
              "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": list(cfg.feature_layers),
              "embed_requires_grad": False, "torch_dtype": "float32",
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                     "verifier": {"name_or_path": verifier,
                                                  "architectures": [verifier_architecture]}},
              "specbench": provenance or {}}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / (WEIGHTS + ".tmp")))
    (directory / (WEIGHTS + ".tmp")).replace(directory / WEIGHTS)
    (directory / (CONFIG + ".tmp")).write_text(json.dumps(config, indent=1))
    (directory / (CONFIG + ".tmp")).replace(directory / CONFIG)


def read_speculators(directory: Path, key: str = "method.head") -> tuple[HeadConfig, dict, torch.Tensor,
                                                                          torch.Tensor, bool]:
    """(HeadConfig, our state dict, lm_head (V_d, H), draft ids (V_d,), whether the checkpoint names its feature
    layers) of a speculators EAGLE-3 checkpoint; without them the target's 2, L/2, L-3 are meant, set when the
    target is known (methods/feature_head.py)."""
    directory = Path(directory)
    meta = json.loads((directory / CONFIG).read_text())
    kind = meta.get("speculators_model_type")
    if kind != "eagle3":
        raise ConfigError(f"{key}: {directory} is a speculators {kind!r} checkpoint; only eagle3 loads here")
    on = [flag for flag in UNSUPPORTED if meta.get(flag)]
    layer = meta.get("transformer_layer_config") or {}
    if on or layer.get("num_hidden_layers", 1) != 1:
        raise ConfigError(f"{key}: {directory} sets {on or ['num_hidden_layers=' + str(layer['num_hidden_layers'])]}"
                          ": the EAGLE-3 layer here is the released one (one layer, residual g, no extra norms)")
    state = read_weights(directory)
    for name in ("fc.weight", "lm_head.weight", "d2t"):
        if name not in state:
            raise ConfigError(f"{key}: {directory} has no {name}; not an EAGLE-3 speculators checkpoint")
    o_bias = state.pop(f"{LAYER}self_attn.o_proj.bias", None)
    if o_bias is not None and bool(o_bias.abs().max() > 0):
        raise ConfigError(f"{key}: {directory}'s layer has an o_proj bias; the EAGLE-3 layer here has none")
    ours = {}
    for name, tensor in state.items():
        prefix = next((p for p in NAMES if name.startswith(p)), None)
        if prefix is not None:
            ours[NAMES[prefix] + name[len(prefix):]] = tensor
    rope = layer.get("rope_parameters") or {}
    layers = [int(i) for i in meta.get("eagle_aux_hidden_state_layer_ids") or []]
    verifier = ((meta.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path") or ""
    shape = SimpleNamespace(**{**layer, "rope_parameters": rope, "num_hidden_layers": 1, "_name_or_path": verifier,
                               "rope_theta": rope.get("rope_theta", layer.get("rope_theta", 10000.0))})
    config = HeadConfig.for_target(shape, "eagle3", fusion="norm_concat", final_norm=True,
                                   draft_vocab_size=int(meta["draft_vocab_size"]), feature_layers=layers or None)
    d2t = state["d2t"].long()
    return config, ours, state["lm_head.weight"], torch.arange(len(d2t)) + d2t, bool(layers)
