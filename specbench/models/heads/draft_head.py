"""Feature-level draft heads: EAGLE's (Li et al. 2024) and GRIFFIN's (2025), one decoder layer on the target.

Notation (GRIFFIN §3): F_t is the target's feature at position t (its last hidden state, after the final norm,
before lm_head); x_t the token there. Head position t reads (F_t, x_{t+1}) and predicts F̂_{t+1}, whose
logits lm_head(F̂_{t+1}) rank x_{t+2}. The target's embeddings and lm_head are frozen and not part of the head
(``TargetParts``); the head's own weights are:

- EAGLE: ``fc([e(x_{t+1}); F_t])`` (2H -> H), one Llama/Qwen decoder layer without its input norm; its output is
  both the next feature and the input to lm_head.
- EAGLE-3 (Li et al. 2025): as EAGLE's, but the feature the first step reads is the fusion of the target's low,
  middle and high layers, g_t = fc3([l_t; m_t; h_t]) (3H -> H, ``fuse_layers``; ``feature_layers`` says which
  layers: the inputs of decoder layers 2, L/2 and L-3, as EAGLE-3's code), and its output only feeds lm_head
  over the draft vocabulary (no feature regression: it is trained on tokens alone, models/eagle3.py); later
  steps read the head's own output in place of g. Published EAGLE-3 heads have another layer input
  (``fusion: norm_concat``: attention reads [norm(e); norm(g)], 2H, its residual is g) and their own final norm
  and lm_head over the draft vocabulary (``final_norm``; the lm_head rows go to TargetParts): loaded, or trained
  here with the target's lm_head rows frozen (conf/head/eagle3_published.yaml); both save and load in the
  ``speculators`` format vLLM reads (models/heads/speculators_format.py).
- GRIFFIN: token-guided fusion (TGF) instead of ``fc``: u = fc([e; F]); h = u + down(silu(up([norm(u); norm(e)])))
  (up 2H -> 3H, down 3H -> H; N an RMSNorm); and a dual head (TEH): the layer's MLP projects to 2H, split into the
  *predict* feature (-> lm_head) and the *regress* feature (-> the next step's input F̂): with the layer's
  residual a, predict = a + mlp[:H], regress = a + mlp[H:].

Shapes: features, embeddings (b, n, H); the attention has the target's head layout (heads, kv heads, head dim,
RoPE θ) by default; a head fits a target of the same hidden size and vocabulary (``HeadConfig.mismatch``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from ...errors import ConfigError

KINDS = ("eagle", "griffin", "eagle3")


@dataclass
class HeadConfig:
    kind: str                      # eagle | griffin | eagle3
    hidden_size: int               # H: the target's
    intermediate_size: int         # the decoder layer's MLP width
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    vocab_size: int                # the target's vocabulary V
    attention_bias: bool = False   # q/k/v biases (Qwen2 has them)
    fusion: str = ""               # fc | tgf (default: the kind's)
    dual: bool | None = None       # predict/regress split (default: the kind's)
    draft_vocab_size: int = 0      # V_d: rows of lm_head the head ranks (0: all V)
    fc_bias: bool = True           # the fusion fc's bias (both papers' code has one)
    tgf_width: int = 0             # GRIFFIN's TGF expansion width (0: 3H, the paper's)
    tgf_second: str = "token"      # what TGF's secondary fusion reads beside norm(u): token | feature | fused
    target: dict = field(default_factory=dict)  # what it was made for: model name, type
    feature_layers: list = field(default_factory=list)  # eagle3: the decoder layers whose inputs it fuses
    final_norm: bool = False       # an RMSNorm before lm_head (published EAGLE-3 heads, and eagle3 ones trained here)
    layer_norm: bool = False       # eagle3: an RMSNorm on fc3's output g (heads trained here; see ``fuse_layers``)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"head kind {self.kind!r}; valid: {list(KINDS)}")
        if self.tgf_second not in ("token", "feature", "fused"):
            raise ValueError(f"tgf_second {self.tgf_second!r}; valid: token, feature, fused (GRIFFIN Table 5)")
        if self.fusion not in ("", "fc", "tgf", "norm_concat"):
            raise ValueError(f"fusion {self.fusion!r}; valid: fc, tgf, norm_concat")
        self.fusion = self.fusion or ("tgf" if self.kind == "griffin" else "fc")
        self.dual = (self.kind == "griffin") if self.dual is None else bool(self.dual)
        self.feature_layers = [int(i) for i in self.feature_layers]
        if self.layer_norm and self.kind != "eagle3":
            raise ValueError("layer_norm normalizes fc3's fused low/mid/high features: eagle3 heads only")
        if self.fusion == "norm_concat" and (self.kind != "eagle3" or self.layer_norm or self.dual):
            raise ValueError("fusion norm_concat is EAGLE-3's layer: kind eagle3, no layer_norm (its hidden_norm "
                             "normalizes g) and no dual head")
        if self.kind == "eagle3" and len(self.feature_layers) != 3:
            raise ValueError(f"an eagle3 head fuses three layers (low, mid, high), got {self.feature_layers}")

    @classmethod
    def for_target(cls, model_config, kind: str, intermediate_size: int | None = None, draft_vocab_size: int = 0,
                   **overrides) -> "HeadConfig":
        """A head shaped for a Hugging Face Llama-family target config (Llama, Qwen2, Mistral, ...)."""
        c = model_config
        if not all(hasattr(c, key) for key in ("intermediate_size", "num_attention_heads", "rms_norm_eps")):
            raise ConfigError(f"model: feature-level draft heads draft for Llama-family targets (Llama, Qwen2, "
                              f"Mistral: RMSNorm, rotary attention, gated MLP); this target is {c.model_type!r}")
        heads = c.num_attention_heads
        if kind == "eagle3" and not overrides.get("feature_layers"):
            overrides["feature_layers"] = eagle3_layers(c.num_hidden_layers)
        rope = getattr(c, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
        return cls(kind=kind, hidden_size=c.hidden_size,
                   intermediate_size=intermediate_size or c.intermediate_size, num_heads=heads,
                   num_kv_heads=getattr(c, "num_key_value_heads", None) or heads,
                   head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads, rope_theta=float(theta),
                   rms_eps=float(getattr(c, "rms_norm_eps", 1e-6)), vocab_size=c.vocab_size,
                   attention_bias=bool(getattr(c, "attention_bias", c.model_type == "qwen2")),
                   draft_vocab_size=draft_vocab_size,
                   target={"model_type": c.model_type, "name": getattr(c, "_name_or_path", "")}, **overrides)

    def as_dict(self) -> dict:
        return asdict(self)

    def mismatch(self, model_config) -> str | None:
        """Why this head cannot draft for a target with ``model_config`` (None: it fits)."""
        want = HeadConfig.for_target(model_config, self.kind)
        for key in ("hidden_size", "vocab_size"):  # the head's attention is its own (its own cache)
            if getattr(self, key) != getattr(want, key):
                return f"{key} {getattr(self, key)} but the target's is {getattr(want, key)}"
        layers = getattr(model_config, "num_hidden_layers", 0)
        if self.feature_layers and max(self.feature_layers) >= layers:
            return f"feature_layers {self.feature_layers} but the target has {layers} decoder layers"
        return None


def eagle3_layers(layers: int) -> list[int]:
    """EAGLE-3's low / mid / high features: the inputs of decoder layers 2, L // 2 and L - 3 (clamped into
    0..L-1 for the tiny targets of the tests)."""
    return [min(2, layers - 1), layers // 2, max(layers - 3, 0)]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE (rotate-half layout, as Llama/Qwen): x (b, heads, n, d), positions (b, n)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = positions[:, None, :, None].float() * inv  # (b, 1, n, d/2)
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(x.dtype), torch.cat([angles.sin()] * 2, -1).to(x.dtype)
    half = torch.cat([-x[..., d // 2:], x[..., :d // 2]], dim=-1)
    return x * cos + half * sin


class HeadCache:
    """The head's keys and values (1, kv heads, L, d): committed positions, then any tree nodes being drafted."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def append(self, k, v):
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys, self.values = torch.cat([self.keys, k], -2), torch.cat([self.values, v], -2)
        return self.keys, self.values

    def crop(self, length: int) -> None:
        if self.keys is not None and length < self.length:
            self.keys, self.values = self.keys[..., :length, :], self.values[..., :length, :]


class Attention(nn.Module):
    def __init__(self, cfg: HeadConfig, inputs: int | None = None):
        super().__init__()
        self.cfg = cfg
        h, d = inputs or cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, cfg.hidden_size, bias=False)

    def forward(self, x, positions, mask, cache: HeadCache | None, streams: list | None = None):
        """x (b, n, H); positions (b, n); mask additive (b or 1, 1, n, past + n) or None (causal, no cache).

        streams (training, GRIFFIN's token-alignable passes): the (keys, values) of the earlier passes over the
        same positions, detached; this pass's are appended. Query t of pass p (p streams) then sees what it
        would see while drafting p - 1 tokens ahead: stream 0 (the target's features) up to t - (p - 1), and
        stream s >= 1 (fed the head's own regressed features) only at t - (p - 1 - s) (``stream_mask``).
        """
        b, n, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(b, n, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, c.num_kv_heads, c.head_dim).transpose(1, 2)
        q, k = rotate(q, positions, c.rope_theta), rotate(k, positions, c.rope_theta)
        if cache is not None:
            k, v = cache.append(k, v)
        if streams:
            earlier = list(streams)
            streams.append((k.detach(), v.detach()))
            k, v = torch.cat([s[0] for s in earlier] + [k], -2), torch.cat([s[1] for s in earlier] + [v], -2)
            mask = stream_mask(n, len(streams), x.device)
        elif streams is not None:
            streams.append((k.detach(), v.detach()))
        groups = c.num_heads // c.num_kv_heads
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask if mask.dtype == torch.bool
                                                 else mask.to(q.dtype))
        return self.o_proj(out.transpose(1, 2).reshape(b, n, c.num_heads * c.head_dim))  # (b, n, H)


def stream_mask(n: int, passes: int, device=None) -> torch.Tensor:
    """(n, passes * n) bool: keys of stream s at position j visible to query t of the newest stream (Attention)."""
    t = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    blocks = [j <= t - (passes - 1)] + [j == t - (passes - 1 - s) for s in range(1, passes)]
    return torch.cat(blocks, dim=1)


class GatedMLP(nn.Module):
    def __init__(self, inputs: int, width: int, outputs: int):
        super().__init__()
        self.gate_proj = nn.Linear(inputs, width, bias=False)
        self.up_proj = nn.Linear(inputs, width, bias=False)
        self.down_proj = nn.Linear(width, outputs, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TokenGuidedFusion(nn.Module):
    """GRIFFIN's TGF (§4.2, Fig. 4): u = fc([e; F]); u + down(silu(up([N(norm(u)); N(e)]))), N one RMSNorm shared
    by both inputs (as the released code has it). up: 2H -> ``tgf_width`` (the paper's 3H; the released code
    uses the decoder's intermediate size), down: back to H."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        h = cfg.hidden_size
        width = cfg.tgf_width or 3 * h
        self.fc = nn.Linear(2 * h, h, bias=cfg.fc_bias)
        self.fused_norm = RMSNorm(h, cfg.rms_eps)
        self.shared_norm = RMSNorm(h, cfg.rms_eps)
        self.up_proj = nn.Linear(2 * h, width, bias=False)
        self.down_proj = nn.Linear(width, h, bias=False)
        self.second = cfg.tgf_second

    def forward(self, embeds, features):
        fused = self.fc(torch.cat([embeds, features], -1))
        second = {"token": embeds, "feature": features, "fused": fused}[self.second]  # Table 5's variants
        mixed = torch.cat([self.shared_norm(self.fused_norm(fused)), self.shared_norm(second)], -1)
        return fused + self.down_proj(F.silu(self.up_proj(mixed)))


class ConcatFusion(nn.Module):
    """EAGLE's input: fc([e; F]) (2H -> H)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=cfg.fc_bias)

    def forward(self, embeds, features):
        return self.fc(torch.cat([embeds, features], -1))


class NormConcat(nn.Module):
    """Published EAGLE-3 heads' layer input: [norm(e); norm(g)] (2H), read by a 2H -> heads attention."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.embed_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)

    def forward(self, embeds, features):
        return torch.cat([self.embed_norm(embeds), self.hidden_norm(features)], -1)


FUSIONS = {"fc": ConcatFusion, "tgf": TokenGuidedFusion, "norm_concat": NormConcat}


class DraftHead(nn.Module):
    """One decoder layer over the fused (token, feature) sequence. ``forward`` -> (predict, regress) (b, n, H):
    predict feeds lm_head, regress is F̂ for the next position's input (the same tensor without a dual head)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fusion = FUSIONS[cfg.fusion](cfg)
        self.self_attn = Attention(cfg, 2 * h if cfg.fusion == "norm_concat" else h)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_eps)
        self.mlp = GatedMLP(h, cfg.intermediate_size, 2 * h if cfg.dual else h)
        if cfg.kind == "eagle3":  # fc3: the target's low/mid/high features (3H) -> g (H)
            self.layer_fc = nn.Linear(3 * h, h, bias=False)
            if cfg.layer_norm:
                self.layer_norm = RMSNorm(h, cfg.rms_eps)
        if cfg.final_norm:
            self.norm = RMSNorm(h, cfg.rms_eps)

    def fuse_layers(self, states: torch.Tensor) -> torch.Tensor:
        """EAGLE-3: (…, 3H) [low; mid; high] target states -> (…, H) g, the feature the head reads; other kinds
        read the target's last hidden state as it is. The states are the target's residual stream, unnormalized:
        in Qwen2 and Llama a few channels reach ~10^3 ("massive activations"), so g is RMS-normalized
        (``layer_norm``) in the heads trained here, whose layer has no input norm; published EAGLE-3 heads
        normalize g inside their layer instead (``fusion: norm_concat``)."""
        if self.cfg.kind != "eagle3":
            return states
        dtype = getattr(self.layer_fc, "dtype", None) or self.layer_fc.weight.dtype  # a PackedLinear has no weight
        g = self.layer_fc(states.to(dtype))
        return self.layer_norm(g) if self.cfg.layer_norm else g

    def forward(self, embeds, features, positions, mask=None, cache: HeadCache | None = None, streams=None):
        x = self.fusion(embeds, features)
        residual = features if self.cfg.fusion == "norm_concat" else x  # EAGLE-3's: g; EAGLE's: the fused input
        x = residual + self.self_attn(x, positions, mask, cache, streams)  # EAGLE's layer has no input norm
        out = self.mlp(self.post_attention_layernorm(x))
        if not self.cfg.dual:
            x = x + out
            return (self.norm(x) if self.cfg.final_norm else x), x
        h = self.cfg.hidden_size
        return x + out[..., :h], x + out[..., h:]

    def init_weights(self, seed: int = 0, std: float = 0.02) -> "DraftHead":
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
                elif name.endswith("bias") and "norm" not in name:
                    p.zero_()
        return self

    def init_from_target(self, target: nn.Module, seed: int = 0, std: float = 0.02) -> "DraftHead":
        """Start from the target's last decoder layer instead of noise (``head.init: target_layer``): its
        attention, MLP and post-attention norm (a dual head's 2H MLP output gets the down projection twice), and
        a fusion fc that passes the feature through (fc([e; F]) = F), or for EAGLE-3's norm-concat layer q/k/v
        that read norm(g) alone ([0 | W]) with the layer's input norm as hidden_norm; the rest (TGF's MLP) as
        ``init_weights``.
        With a few hundred training sequences this starts the head from a layer that already reads the
        target's features instead of learning one from scratch."""
        self.init_weights(seed, std)
        layers = getattr(getattr(target, "model", None), "layers", None)
        if layers is None:
            raise ConfigError("head.init: target_layer needs a Llama-family target with model.layers")
        layer, h = layers[-1], self.cfg.hidden_size
        with torch.no_grad():
            pairs = [(getattr(self.self_attn, n), getattr(layer.self_attn, n)) for n in ("q_proj", "k_proj", "v_proj",
                                                                                       "o_proj")]
            pairs += [(getattr(self.mlp, n), getattr(layer.mlp, n)) for n in ("gate_proj", "up_proj", "down_proj")]
            concat = self.cfg.fusion == "norm_concat"  # q/k/v read [norm(e); norm(g)]: the target's on norm(g)
            for mine, theirs in pairs:
                weight = linear_weight(theirs).float()
                if concat and mine in (self.self_attn.q_proj, self.self_attn.k_proj, self.self_attn.v_proj):
                    weight = torch.cat([torch.zeros_like(weight), weight], 1)  # (out, 2H): the token's half at 0
                if mine.weight.shape[1] != weight.shape[1] or mine.weight.shape[0] % weight.shape[0]:
                    raise ConfigError(f"head.init: target_layer: the head's {tuple(mine.weight.shape)} weight cannot "
                                      f"start from the target's {tuple(weight.shape)} (head.intermediate_size must "
                                      "be the target's)")
                mine.weight.copy_(weight.repeat(mine.weight.shape[0] // weight.shape[0], 1))
                if mine.bias is not None and getattr(theirs, "bias", None) is not None:
                    mine.bias.copy_(theirs.bias.float())
            self.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight.float())
            if self.cfg.kind == "eagle3":  # fc3 starts as the high layer's input alone
                self.layer_fc.weight.zero_()
                self.layer_fc.weight[:, 2 * h:] = torch.eye(h)
            final = getattr(target.model, "norm", None)  # g and the output start at the target's final-norm scale
            for norm in (getattr(self, "layer_norm", None), getattr(self, "norm", None)):
                if norm is not None and final is not None:
                    norm.weight.copy_(final.weight.float())
            if concat:  # norm(g) as the target's last layer normalizes its input
                self.fusion.hidden_norm.weight.copy_(layer.input_layernorm.weight.float())
                return self
            fc = self.fusion.fc
            fc.weight.zero_()
            fc.weight[:, h:] = torch.eye(h)
            if fc.bias is not None:
                fc.bias.zero_()
        return self


class TargetParts:
    """The target's frozen pieces a head uses: its input embeddings and the lm_head rows of the draft
    vocabulary. ``draft_ids`` (V_d,) maps a draft-vocabulary index to the target's token id (EAGLE-3's d2t);
    None: the full vocabulary. ``lm_head`` is an nn.Linear (V_d rows), prepacked like the target's own linears
    when it runs on oneDNN's packed kernel (``linear_kernel``)."""

    def __init__(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor, draft_ids: torch.Tensor | None,
                 linear_kernel: str = "torch"):
        from ...backends.torch.cpu_linear import apply_linear_kernel

        self.embed_weight = embed_weight
        self.draft_ids = None if draft_ids is None else draft_ids.to(embed_weight.device)  # indexed by draft picks
        rows = lm_head_weight if draft_ids is None else lm_head_weight[draft_ids.to(lm_head_weight.device)]
        self.lm_head_weight = rows
        head = nn.Linear(rows.shape[1], rows.shape[0], bias=False, device=rows.device, dtype=rows.dtype)
        head.weight = nn.Parameter(rows, requires_grad=False)
        holder = nn.Sequential(head)
        apply_linear_kernel(holder, linear_kernel)
        self.lm_head = holder[0]

    @classmethod
    def of(cls, target: nn.Module, draft_ids: torch.Tensor | None, dtype: torch.dtype | None = None,
           linear_kernel: str = "torch", lm_head: torch.Tensor | None = None):
        """lm_head: the head's own (V_d, H) rows (a published EAGLE-3 head's) instead of the target's."""
        embed = target.get_input_embeddings().weight.detach()
        head = linear_weight(target.get_output_embeddings()) if lm_head is None else lm_head.to(embed.device)
        if dtype is not None:
            embed, head = embed.to(dtype), head.to(dtype)
        parts = cls(embed, head, draft_ids if lm_head is None else None, linear_kernel)
        if lm_head is not None and draft_ids is not None:
            parts.draft_ids = draft_ids.to(embed.device)  # its rows already are the draft vocabulary's
        return parts

    @property
    def device(self) -> torch.device:
        """Where the target's pieces are, so where a head that uses them drafts and trains."""
        return self.embed_weight.device

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_weight)

    def logits(self, predict: torch.Tensor) -> torch.Tensor:
        """(…, H) -> (…, V_d) draft-vocabulary logits."""
        return self.lm_head(predict.to(self.lm_head_weight.dtype))

    def target_ids(self, draft_index: torch.Tensor) -> torch.Tensor:
        return draft_index if self.draft_ids is None else self.draft_ids[draft_index]


def linear_weight(module: nn.Module) -> torch.Tensor:
    """A linear layer's (out, in) weight, also from a oneDNN-prepacked one (models/cpu_linear.PackedLinear, which
    keeps no plain copy): read back as module(I)ᵀ without its bias, exact, since each output is one weight times 1."""
    if getattr(module, "weight", None) is not None:
        return module.weight.detach()
    eye = torch.eye(module.in_features, dtype=module.dtype)
    bias, module.bias = getattr(module, "bias", None), None  # W·I alone (the bias would be added to every column)
    try:
        with torch.no_grad():
            return module(eye).T.contiguous()
    finally:
        module.bias = bias


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
