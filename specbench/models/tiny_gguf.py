"""Tiny random GGUF pairs for the llama.cpp backend's tests and demos, written in-process (no files shipped, no
network): the tiny Llama pair of tiny.py (same seed, same weights, same byte-level tokenizer) written as float32 GGUF
files with the ``gguf`` package, so the llama.cpp backend is exercised, and compared with transformers on the very
same weights, without the embedded pair's 1.6 GB.

Written once per settings under ``$SPECBENCH_CACHE/tiny_gguf/``.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from .tiny import byte_tokenizer, perturbed_copy, tie_output_rows, tiny_model

# transformers' Llama parameter names -> llama.cpp's GGUF tensor names (per block: blk.{i}.<name>)
BLOCK_TENSORS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}


def interleave_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """(heads * d, H) query/key rows from transformers' rotate-half layout (pairs i, i + d/2) to the adjacent-pair
    layout llama.cpp's ``llama`` architecture rotates (pairs 2i, 2i + 1)."""
    rows, cols = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def write_llama_gguf(model: torch.nn.Module, tokenizer, path: Path) -> Path:
    """A transformers LlamaForCausalLM (float32, untied head) and its tokenizer as an F32 GGUF file llama.cpp loads."""
    import gguf

    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("specbench tiny llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(config.hidden_size // heads)
    writer.add_rope_freq_base(float((getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_file_type(0)  # all F32
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    special = set(tokenizer.all_special_tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])  # 3: control, 1: normal
    writer.add_token_merges(["a b"])  # llama.cpp requires the key; byte tokens only, so one unused merge
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_add_bos_token(False)
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    for i in range(config.num_hidden_layers):
        for ours, theirs in BLOCK_TENSORS.items():
            weight = state[f"model.layers.{i}.{ours}.weight"]
            if ours in ("self_attn.q_proj", "self_attn.k_proj"):
                weight = interleave_rope_rows(weight, heads if ours == "self_attn.q_proj" else kv_heads)
            writer.add_tensor(f"blk.{i}.{theirs}.weight", np.ascontiguousarray(weight))
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_gguf_files(hidden_size: int = 64, layers: int = 2, seed: int = 0, draft_noise: float = 0.05,
                    init_range: float = 0.2, lm_head_ties: list | None = None, root: Path | None = None) -> dict:
    """{"target": path, "draft": path} of the tiny Llama pair (tiny.build_tiny_pair's weights), written once."""
    from ..files import cache_root, publish, staging_path

    settings = dict(hidden_size=hidden_size, layers=layers, seed=seed, draft_noise=draft_noise, init_range=init_range,
                    lm_head_ties=lm_head_ties or [])
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    folder = (root or cache_root()) / "tiny_gguf" / digest
    paths = {"target": folder / "target.gguf", "draft": folder / "draft.gguf"}
    if all(p.exists() for p in paths.values()):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    tok = byte_tokenizer()
    target = tiny_model("llama", len(tok), hidden_size, layers, seed, init_range, tok)
    tie_output_rows(target, lm_head_ties or [])
    draft = perturbed_copy(target, draft_noise, seed + 1)
    for role, model in (("target", target), ("draft", draft)):
        staged = staging_path(paths[role])
        write_llama_gguf(model, tok, staged)
        publish(staged, paths[role])
    return paths
