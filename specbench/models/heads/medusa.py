"""Medusa heads (Cai et al. 2024) and Hydra heads (Ankner et al. 2024): K extra decoding heads on the target's last
hidden state, and their artifacts (ours, and Medusa's and Hydra's published formats).

Notation: h_t is the target's feature at position t (last hidden state after the final norm, before lm_head), so
lm_head(h_t) ranks x_{t+1} (the target's own next token, x0 of the next step). Head k (k = 1..K) ranks x_{t+k+1}.

- Medusa: head k is L residual blocks u <- u + SiLU(W_k u) on u = h_t, then an lm_head. The paper's Medusa-1 gives
  each head its own lm_head initialised from the target's; heads trained here share the target's frozen lm_head
  (``own_lm_head: false``: V×H parameters less per head, which is most of a head on a small target), published ones
  carry their own.
- Hydra (the paper's MLP heads, ``hydra_head_arch: mlp``; not Hydra++'s prefix decoder layer): head k also reads the
  embeddings of the tokens before the one it ranks, x_{t+1} (x0) and the drafts d_1..d_{k-1} on its candidate path.
  Its first block is Hydra's grounded residual block on X = [h_t; e(x_{t+1}); ...; e(x_{t+k})] ((k+1)H):
  u = R_k X + SiLU(W_k X + b_k) (R_k: (k+1)H -> H, initialised to read h_t alone; W_k, b_k zero, so an untrained
  Hydra head starts on h_t as a Medusa head does), then L-1 residual blocks and the lm_head. Heads are
  sequentially dependent: a tree's children of a node come from that node's own path.

Artifacts use the head format of models/heads/artifact.py (head.json with ``config`` = MedusaConfig, the weights' sha256
and provenance; head.safetensors). Published Medusa heads (FasterDecoding/medusa-vicuna-7b-v1.3: config.json with
medusa_num_heads / medusa_num_layers, medusa_lm_head.safetensors or .pt with ``{k}.{j}.linear.*`` and
``{k}.{L}.weight``) and published Hydra heads (zankner/Hydra's release: config.json with hydra_num_heads,
hydra_num_layers, hydra_head_arch, grounded_heads; hydra_lm_head.pt with ``hydra_mlp.{k}.{j}.linear.*``,
``hydra_mlp.{k}.0.res_connection.*`` and ``hydra_lm_head.{k}.*``, lm_heads with a bias) load by Hugging Face id
through ``load_medusa``; offline and uncached, a ConfigError. Hydra++'s other head architectures are refused by name.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from ...errors import ConfigError
from .artifact import CONFIG_FILE, TrainedHead, looks_like_hub_id, read_artifact, save_artifact, weights_digest

KINDS = ("medusa", "hydra")


@dataclass
class MedusaConfig:
    kind: str                  # medusa | hydra
    hidden_size: int           # H: the target's
    vocab_size: int            # V: the target's
    heads: int = 4             # K
    layers: int = 1            # L residual blocks per head
    own_lm_head: bool = False  # each head its own (V, H) lm_head (published Medusa-1), else the target's frozen one
    lm_head_bias: bool = False  # own lm_heads with a bias (published Hydra heads)
    target: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"head kind {self.kind!r}; valid: {list(KINDS)}")

    @classmethod
    def for_target(cls, model_config, kind: str, **options) -> "MedusaConfig":
        return cls(kind=kind, hidden_size=model_config.hidden_size, vocab_size=model_config.vocab_size,
                   target={"model_type": model_config.model_type, "name": getattr(model_config, "_name_or_path", "")},
                   **options)

    def as_dict(self) -> dict:
        return asdict(self)

    def mismatch(self, model_config) -> str | None:
        for key in ("hidden_size", "vocab_size"):
            if getattr(self, key) != getattr(model_config, key):
                return f"{key} {getattr(self, key)} but the target's is {getattr(model_config, key)}"
        return None


class ResBlock(nn.Module):
    """u + SiLU(W u + b) (Medusa's ResBlock; W zero-initialised so a new head starts as the identity)."""

    def __init__(self, size: int):
        super().__init__()
        self.linear = nn.Linear(size, size)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x):
        return x + F.silu(self.linear(x))


class GroundedBlock(nn.Module):
    """Hydra's first block of head k: R X + SiLU(W X + b) on X = [h; e(x_{t+1}); ...; e(x_{t+k})] ((k+1)H -> H).
    Initialised as the identity on h (R = [I 0 ... 0], W, b and R's bias zero)."""

    def __init__(self, size: int, inputs: int):
        super().__init__()
        self.linear = nn.Linear(inputs * size, size)
        self.res_connection = nn.Linear(inputs * size, size)
        with torch.no_grad():
            for p in (self.linear.weight, self.linear.bias, self.res_connection.weight, self.res_connection.bias):
                p.zero_()
            self.res_connection.weight[:, :size] = torch.eye(size)

    def forward(self, x):
        return self.res_connection(x) + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K heads; ``hidden(k, h, embeds)`` is head k's (1-based) input to its lm_head, ``logits`` its scores."""

    def __init__(self, cfg: MedusaConfig):
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        hydra = cfg.kind == "hydra"
        if hydra:  # head k's first block reads [h; e(x_{t+1}) .. e(x_{t+k})] ((k+1)H; k = 1..K)
            self.grounded = nn.ModuleList(GroundedBlock(H, k + 2) for k in range(cfg.heads))
        plain = cfg.layers - 1 if hydra else cfg.layers
        self.blocks = nn.ModuleList(nn.Sequential(*(ResBlock(H) for _ in range(plain))) for _ in range(cfg.heads))
        if cfg.own_lm_head:
            self.lm_heads = nn.ModuleList(nn.Linear(H, cfg.vocab_size, bias=cfg.lm_head_bias)
                                          for _ in range(cfg.heads))

    def hidden(self, k: int, h: torch.Tensor, embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Head k (1..K): h (n, H); embeds (n, k, H) the path's tokens x_{t+1}..x_{t+k} (Hydra only) -> (n, H)."""
        u = h
        if self.cfg.kind == "hydra":
            u = self.grounded[k - 1](torch.cat([h, embeds.flatten(1)], dim=-1))
        return self.blocks[k - 1](u)

    def logits(self, k: int, u: torch.Tensor, target_lm_head) -> torch.Tensor:
        """(n, H) -> (n, V): the head's own lm_head, or ``target_lm_head`` (a callable: TargetParts.logits)."""
        return self.lm_heads[k - 1](u) if self.cfg.own_lm_head else target_lm_head(u)

    def init_weights(self, seed: int = 0, std: float = 0.02) -> "MedusaHeads":
        """Random weights (tests: the loop's guarantees may not depend on the heads being any good)."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * std)
        return self


@dataclass
class MedusaArtifact(TrainedHead):
    """Medusa / Hydra heads as loaded (trained here, or Medusa's published format)."""

    module: ClassVar[type] = MedusaHeads


def save_medusa(directory: Path, heads: MedusaHeads, provenance: dict) -> str:
    """Write the artifact (head_artifact's format); returns the weights' sha256."""
    tensors = {name: p.detach().float().cpu().contiguous() for name, p in heads.state_dict().items()}
    return save_artifact(directory, tensors, heads.cfg.as_dict(), provenance)


def load_medusa(name: str, kind: str, local_files_only: bool = True, key: str = "method.head") -> MedusaArtifact:
    """Our artifact directory, or a published Medusa / Hydra head by Hugging Face id."""
    path = Path(name).expanduser()
    if (path / CONFIG_FILE).exists() or not looks_like_hub_id(name):
        meta, state, sha = read_artifact(path, key)
        found = meta["config"].get("kind")
        if found != kind:
            raise ConfigError(f"{key}: {path} is a {found} head; method {kind} needs a {kind} head "
                              f"(method={found} runs it)")
        return MedusaArtifact(MedusaConfig(**meta["config"]), state, sha, str(path), meta.get("provenance", {}))
    return load_published(name, kind, local_files_only, key)


def load_published(repo_id: str, kind: str, local_files_only: bool, key: str) -> MedusaArtifact:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        directory = Path(snapshot_download(repo_id, local_files_only=local_files_only,
                                           allow_patterns=["config.json", f"{kind}_lm_head.*"]))
    except LocalEntryNotFoundError:
        raise ConfigError(f"{key}: {repo_id} is not in the local Hugging Face cache and hub access is off; set "
                          "method.local_files_only=false on a machine with hub access (or HF_HUB_OFFLINE unset), "
                          "or pass a local directory") from None
    return (published_hydra if kind == "hydra" else published_medusa)(directory, repo_id, key)


def read_published(directory: Path, source: str, kind: str, key: str) -> tuple[dict, dict, Path]:
    """config.json and the weights (<kind>_lm_head.safetensors or .pt) of a head in its release format."""
    config_file = directory / "config.json"
    weights = [p for p in (directory / f"{kind}_lm_head.safetensors", directory / f"{kind}_lm_head.pt") if p.is_file()]
    if not config_file.is_file() or not weights:
        raise ConfigError(f"{key}: {source} is not a {kind.capitalize()} head (expected config.json and "
                          f"{kind}_lm_head.safetensors or {kind}_lm_head.pt)")
    meta = json.loads(config_file.read_text())
    if f"{kind}_num_heads" not in meta:
        raise ConfigError(f"{key}: {source}/config.json has no {kind}_num_heads; not a {kind.capitalize()} head")
    if weights[0].suffix == ".safetensors":
        from safetensors.torch import load_file
        raw = load_file(str(weights[0]))
    else:
        raw = torch.load(weights[0], map_location="cpu", weights_only=True)
    return meta, raw, weights[0]


def published_medusa(directory: Path, source: str, key: str = "method.head") -> MedusaArtifact:
    """A directory in Medusa's release format -> our MedusaHeads' state (own lm_heads)."""
    meta, raw, weights = read_published(directory, source, "medusa", key)
    heads, layers = int(meta["medusa_num_heads"]), int(meta.get("medusa_num_layers", 1))
    lm = raw.get(f"0.{layers}.weight")
    if lm is None:
        raise ConfigError(f"{key}: {weights.name} has no 0.{layers}.weight (head 0's lm_head for "
                          f"medusa_num_layers={layers}); keys: {sorted(raw)[:6]} ...")
    state = {}
    for k in range(heads):
        for j in range(layers):
            for part in ("weight", "bias"):
                state[f"blocks.{k}.{j}.linear.{part}"] = raw[f"{k}.{j}.linear.{part}"]
        state[f"lm_heads.{k}.weight"] = raw[f"{k}.{layers}.weight"]
    config = MedusaConfig("medusa", hidden_size=lm.shape[1], vocab_size=lm.shape[0], heads=heads, layers=layers,
                          own_lm_head=True, target={"name": meta.get("base_model_name_or_path", "")})
    return MedusaArtifact(config, state, weights_digest(directory, ("medusa_lm_head.*",)), source,
                          {"published": source})


def published_hydra(directory: Path, source: str, key: str = "method.head") -> MedusaArtifact:
    """A directory in Hydra's release format (its MLP heads, grounded on the path's tokens) -> our MedusaHeads'
    state (kind hydra, own lm_heads with a bias). Hydra++'s prefix-MLP, cross-attention and EAGLE-attention heads
    and ungrounded heads are refused by name."""
    meta, raw, weights = read_published(directory, source, "hydra", key)
    arch = meta.get("hydra_head_arch", "mlp")
    if arch != "mlp":
        raise ConfigError(f"{key}: {source} has hydra_head_arch {arch!r} (Hydra++'s); only the paper's MLP heads "
                          "('mlp') are mapped onto ours")
    if not meta.get("grounded_heads", False):
        raise ConfigError(f"{key}: {source} has grounded_heads false: its heads read h_t alone (Medusa's "
                          "architecture), not the path's tokens as method=hydra's do")
    if meta.get("hidden_state_offset", 0):
        raise ConfigError(f"{key}: {source} reads the hidden state {meta['hidden_state_offset']} positions back "
                          "(hidden_state_offset); ours read h_t")
    heads, layers = int(meta["hydra_num_heads"]), int(meta.get("hydra_num_layers", 1))
    lm = raw.get("hydra_lm_head.0.weight")
    if lm is None or "hydra_mlp.0.0.res_connection.weight" not in raw:
        raise ConfigError(f"{key}: {weights.name} has no hydra_lm_head.0.weight or hydra_mlp.0.0.res_connection "
                          f"(a grounded MLP head's); keys: {sorted(raw)[:6]} ...")
    state = {}
    for k in range(heads):
        for part in ("weight", "bias"):
            state[f"grounded.{k}.linear.{part}"] = raw[f"hydra_mlp.{k}.0.linear.{part}"]
            state[f"grounded.{k}.res_connection.{part}"] = raw[f"hydra_mlp.{k}.0.res_connection.{part}"]
            for j in range(1, layers):
                state[f"blocks.{k}.{j - 1}.linear.{part}"] = raw[f"hydra_mlp.{k}.{j}.linear.{part}"]
            state[f"lm_heads.{k}.{part}"] = raw[f"hydra_lm_head.{k}.{part}"]
    config = MedusaConfig("hydra", hidden_size=lm.shape[1], vocab_size=lm.shape[0], heads=heads, layers=layers,
                          own_lm_head=True, lm_head_bias=True,
                          target={"name": meta.get("base_model_name_or_path", "")})
    return MedusaArtifact(config, state, weights_digest(directory, ("hydra_lm_head.*",)), source,
                          {"published": source})
