"""Tiny randomly initialised model pairs built in-process (no files, no network) for tests and demos.

The tokenizer is byte-level (256 byte tokens + <bos>/<eos>/<pad>), so any text round-trips. The
draft is the target with Gaussian noise added to every weight: noise 0 gives a draft that always
agrees, larger noise gives partial acceptance, which is what the property tests want to exercise.
"""
from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from ..errors import require
from ..backends.choice import resolve_backend
from ..backends.execution import resolve_attention, resolve_execution
from .pair import ModelPair, attention_of, prepare_for_inference
from ..backends.precision import resolve_precision

SPECIALS = ["<pad>", "<bos>", "<eos>"]


def byte_tokenizer() -> PreTrainedTokenizerFast:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


def tiny_model(arch: str, vocab_size: int, hidden_size: int, layers: int, seed: int, init_range: float, tok,
               attention: str | None = "eager"):
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  initializer_range=init_range)
    if arch == "llama":
        config = LlamaConfig(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                             tie_word_embeddings=False, **common)
        model = LlamaForCausalLM(config)
    elif arch == "gpt2":
        config = GPT2Config(n_embd=hidden_size, n_layer=layers, n_head=4, n_positions=4096, **common)
        model = GPT2LMHeadModel(config)
    else:
        raise ValueError(f"model.arch: unknown tiny architecture {arch!r}; valid: ['gpt2', 'llama']")
    model.config._attn_implementation = attention or "eager"
    return model


def tie_output_rows(model: torch.nn.Module, ties) -> None:
    """Make token b's logit equal token a's at every position, for each [a, b] in ``ties``."""
    head = model.get_output_embeddings()
    with torch.no_grad():
        for a, b in ties:
            head.weight[b] = head.weight[a]
            if getattr(head, "bias", None) is not None:
                head.bias[b] = head.bias[a]


def perturbed_copy(model: torch.nn.Module, noise: float, seed: int) -> torch.nn.Module:
    """Same architecture and weights + N(0, noise * std(weight)) noise: a draft that mostly agrees."""
    draft = type(model)(model.config)
    draft.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            scale = float(param.std()) if param.numel() > 1 else 0.0
            param.add_(torch.randn(param.shape, generator=gen) * noise * scale)
    return draft


def build_tiny_pair(name: str = "tiny-llama", arch: str = "llama", hidden_size: int = 64, layers: int = 2,
                    seed: int = 0, draft_noise: float = 0.05, init_range: float = 0.2, dtype: str = "float32",
                    device: str = "cpu", chat_template: bool = False, linear_kernel: str = "auto",
                    lm_head_ties: list | None = None, load_draft: bool = True, execution: str = "auto",
                    buckets: list[int] | None = None, cache_length: int | None = None,
                    attn_implementation: str | None = "auto", backend: str = "transformers", **_) -> ModelPair:
    """lm_head_ties: [[a, b], ...] copies token a's output row onto token b's, so the two always tie exactly
    (a hand-made near-tie for testing the losslessness classification). load_draft=False: no draft (no method
    of the run uses it; ``components.needs_draft_model``)."""
    require(draft_noise >= 0, "model.draft_noise", f"must be >= 0, got {draft_noise}")
    resolve_backend(backend, device, gguf=False, pair=name)  # llamacpp: model=tiny_gguf has these weights as GGUF
    precision = resolve_precision(dtype, device, linear_kernel)
    runs = resolve_execution(execution, device, buckets, cache_length)
    attention = resolve_attention(attn_implementation, device)
    tok = byte_tokenizer()
    target = tiny_model(arch, len(tok), hidden_size, layers, seed, init_range, tok, attention)
    tie_output_rows(target, lm_head_ties or [])
    draft = (prepare_for_inference(perturbed_copy(target, draft_noise, seed + 1).to(precision.torch_dtype), device,
                                   precision) if load_draft else None)
    target = prepare_for_inference(target.to(precision.torch_dtype), device, precision)
    return ModelPair(
        name=name, target=target, draft=draft, tokenizer=tok, eos_ids={tok.eos_token_id}, precision=precision,
        chat_template=chat_template, execution=runs,
        info={"target": f"tiny-{arch}-random(seed={seed})",
              "draft": f"target+noise({draft_noise})" if load_draft else None,
              "attn_implementation": attention_of(target)},
    )
