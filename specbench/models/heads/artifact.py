"""A trained head on disk, and finding one: our own artifacts and the published EAGLE checkpoints.

Our artifact is a directory:

    head.json           HeadConfig, what it was trained on (provenance) and the weights' sha256
    head.safetensors    the head's weights (+ ``draft_ids``, (V_d,) int64, when the vocabulary is reduced)

Every run that decodes with a head records its kind, path and sha256 (``HeadArtifact.identity``), so two runs
with different heads never share a run key.

Published heads (``method.head=<Hugging Face id>``): EAGLE / EAGLE-2 checkpoints (a Llama ``config.json`` and
``pytorch_model.bin`` or ``model.safetensors`` holding ``fc.*`` and ``layers.0.*``) load through
``published_state`` into the same DraftHead; hub access stays off unless the method says
``local_files_only: false`` (the error names that switch).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import ClassVar
from pathlib import Path

import torch

from ...errors import ConfigError, require
from .draft_head import KINDS, DraftHead, HeadConfig
from ...files import read_weights as read_state
from ...files import sha256_of as sha256_file
from .names import head_location
from .speculators_format import is_speculators, read_speculators

CONFIG_FILE, WEIGHTS_FILE = "head.json", "head.safetensors"
FEATURE_HEAD_METHOD = "specbench.methods.feature_head.FeatureHeadMethod"
MEDUSA_METHOD = "specbench.methods.medusa.MedusaMethod"
# method classes whose ``head`` names a head artifact (located by name, recorded by sha256)
HEAD_METHODS = (FEATURE_HEAD_METHOD, MEDUSA_METHOD)


def save_head(directory: Path, head: DraftHead, draft_ids: torch.Tensor | None, provenance: dict) -> str:
    """Write the artifact (weights first, then head.json naming their hash); returns the sha256."""
    tensors = {name: p.detach().float().cpu().contiguous() for name, p in head.state_dict().items()}
    if draft_ids is not None:
        tensors["draft_ids"] = draft_ids.long().cpu().contiguous()
    return save_artifact(directory, tensors, head.cfg.as_dict(), provenance)


def save_artifact(directory: Path, tensors: dict, config: dict, provenance: dict) -> str:
    """Any head's artifact (EAGLE/GRIFFIN here, Medusa/Hydra in models/heads/medusa.py): weights first, then head.json
    with its ``config`` (``kind`` first among what tells heads apart) and the weights' sha256."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights = directory / WEIGHTS_FILE
    save_file(tensors, str(weights.with_suffix(".tmp")))
    weights.with_suffix(".tmp").replace(weights)
    sha = sha256_file(weights)
    meta = {"config": config, "sha256": sha, "provenance": provenance}
    tmp = directory / (CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
    tmp.replace(directory / CONFIG_FILE)
    return sha


@dataclass
class TrainedHead:
    """A draft head's weights as loaded, whatever its kind: ``config`` (kind, ``mismatch(model_config)``), the
    state dict, the weights' sha256, where they came from and how they were made. ``module`` is the nn.Module
    class the config builds."""

    config: object
    state: dict
    sha256: str
    source: str
    provenance: dict
    module: ClassVar[type] = DraftHead

    @property
    def identity(self) -> dict:
        return {"kind": self.config.kind, "source": self.source, "sha256": self.sha256}

    def build(self, dtype: torch.dtype = torch.float32, device="cpu") -> torch.nn.Module:
        head = self.module(self.config)
        result = head.load_state_dict(self.state, strict=False)
        if result.missing_keys:
            raise ConfigError(f"method.head: {self.source} lacks {result.missing_keys[:6]} for a {self.config.kind} "
                              "head (a checkpoint of another kind or layout)")
        return head.to(device=device, dtype=dtype).eval()

    def check_target(self, model_config, key: str = "method.head") -> None:
        problem = self.config.mismatch(model_config)
        if problem:
            raise ConfigError(f"{key}: {self.source} was made for another target ({problem}); train one for this "
                              f"target with `python -m specbench.training.heads head={self.config.kind} "
                              "model=<this pair>` or pick a head made for it")


@dataclass
class HeadArtifact(TrainedHead):
    """An EAGLE / GRIFFIN head; ``draft_ids``: its reduced vocabulary's target ids, or None (the target's)."""

    draft_ids: torch.Tensor | None = None
    lm_head: torch.Tensor | None = None  # a published EAGLE-3 head's own (V_d, H) lm_head


def missing(directory: Path, key: str) -> ConfigError:
    return ConfigError(f"{key}: no trained head at {directory} (expected {CONFIG_FILE} and {WEIGHTS_FILE}); train one "
                       "with `python -m specbench.training.heads head=<conf/head name>` (make heads trains eagle and "
                       "griffin), or name a published head's Hugging Face id")


def read_artifact(directory: Path, key: str = "method.head") -> tuple[dict, dict, str]:
    """(head.json, the weights, their sha256) of an artifact directory, the hash checked against head.json's."""
    from safetensors.torch import load_file

    directory = Path(directory)
    config_file, weights = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    if not config_file.is_file() or not weights.is_file():
        raise missing(directory, key)
    meta = json.loads(config_file.read_text())
    sha = sha256_file(weights)
    if sha != meta.get("sha256"):
        raise ConfigError(f"{key}: {weights} does not match the sha256 in {config_file} (a partial or edited file); "
                          "re-run the training stage that wrote it")
    return meta, load_file(str(weights)), sha


def load_local(directory: Path, key: str = "method.head") -> HeadArtifact:
    meta, state, sha = read_artifact(directory, key)
    kind = meta["config"].get("kind")
    if kind not in KINDS:  # a Medusa / Hydra head (models/heads/medusa.py)
        raise ConfigError(f"{key}: {directory} is a {kind} head, not a feature-level (eagle/griffin) one "
                          f"(method={kind} runs it)")
    draft_ids = state.pop("draft_ids", None)
    return HeadArtifact(HeadConfig(**meta["config"]), state, sha, str(directory), meta.get("provenance", {}),
                        draft_ids=draft_ids)


def located(method: dict) -> dict:
    """A method config with its head by location: a feature-head method's head named by its name (``griffin_top5``)
    becomes ``<heads_dir>/griffin_top5`` and ``heads_dir`` goes (the location holds it). Runs are identified and
    recorded so, as they were when a method config named its head by its path: their run keys are unchanged."""
    if not isinstance(method, dict) or method.get("_target_") not in HEAD_METHODS or "heads_dir" not in method:
        return method
    method = dict(method)
    method["head"] = head_location(method.get("head"), method.pop("heads_dir"))
    return method


def recorded_sha256(method: dict) -> str | None:
    """The sha256 a head artifact's head.json records, for a method config naming one (None otherwise): part of
    the run's identity, so retraining a head at the same path starts a new run instead of mixing records."""
    head = located(method).get("head")
    if not isinstance(head, str) or method.get("_target_") not in HEAD_METHODS:
        return None
    if is_speculators(Path(head).expanduser()):
        return weights_digest(Path(head).expanduser())
    path = Path(head).expanduser() / CONFIG_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("sha256")


def looks_like_hub_id(name: str) -> bool:
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and not Path(name).exists()


def load_head(name: str, kind: str, local_files_only: bool = True, key: str = "method.head") -> HeadArtifact:
    """Our artifact directory, or a published EAGLE-format head by Hugging Face id (kind: the method's)."""
    path = Path(name).expanduser()
    if is_speculators(path):  # a speculators EAGLE-3 checkpoint on disk (vLLM's format)
        return speculators_artifact(path, str(path), kind, key)
    if (path / CONFIG_FILE).exists() or not looks_like_hub_id(name):
        artifact = load_local(path, key)
        if artifact.config.kind != kind:
            raise ConfigError(f"{key}: {path} is a {artifact.config.kind} head; method {kind} needs a {kind} head "
                              f"(method={artifact.config.kind} runs it)")
        return artifact
    return load_published(name, kind, local_files_only, key)


def load_published(repo_id: str, kind: str, local_files_only: bool, key: str) -> HeadArtifact:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError
    from transformers import AutoConfig

    try:
        directory = Path(snapshot_download(repo_id, local_files_only=local_files_only,
                                           allow_patterns=["*.json", "*.bin", "*.safetensors"]))
    except LocalEntryNotFoundError:
        raise ConfigError(f"{key}: {repo_id} is not in the local Hugging Face cache and hub access is off; set "
                          "method.local_files_only=false on a machine with hub access (or HF_HUB_OFFLINE unset), "
                          "or pass a local directory") from None
    if is_speculators(directory):
        return speculators_artifact(directory, repo_id, kind, key)
    config = AutoConfig.from_pretrained(directory)  # the head's own (its attention may differ from the target's)
    state = read_state(directory)
    if kind == "eagle3":
        return published_eagle3(repo_id, directory, config, state, key)
    fc = "fc.fc" if kind == "griffin" else "fc"
    options = {"fc_bias": f"{fc}.bias" in state}
    if kind == "griffin" and "fc.mlp.up_proj.weight" in state:
        options["tgf_width"] = state["fc.mlp.up_proj.weight"].shape[0]  # the released code: intermediate_size
    head_config = HeadConfig.for_target(config, kind, **options)
    return HeadArtifact(head_config, published_state(state, kind), weights_digest(directory), repo_id,
                        {"published": repo_id})


def published_eagle3(repo_id: str, directory: Path, config, state: dict, key: str) -> HeadArtifact:
    """A released EAGLE-3 head: fc (3H -> H), midlayer.* (its layer reads [norm(e); norm(g)]), norm, lm_head over
    the draft vocabulary and d2t (draft index -> target id offset: id = i + d2t[i]). Its feature layers are the
    target's 2, L/2, L-3, set when the target is known (FeatureHeadMethod)."""
    for name in ("fc.weight", "lm_head.weight", "d2t"):
        if name not in state:
            raise ConfigError(f"{key}: {repo_id} has no {name}; it is not a released EAGLE-3 head "
                              f"(keys: {sorted(state)[:8]} ...)")
    lm_head, d2t = state.pop("lm_head.weight"), state.pop("d2t").long()
    draft_ids = torch.arange(len(d2t)) + d2t
    head_config = HeadConfig.for_target(config, "eagle3", fusion="norm_concat", final_norm=True,
                                        draft_vocab_size=len(d2t))
    return HeadArtifact(head_config, published_state(state, "eagle3"), weights_digest(directory), repo_id,
                        {"published": repo_id, "feature_layers": "target's"}, draft_ids=draft_ids, lm_head=lm_head)


def speculators_artifact(directory: Path, source: str, kind: str, key: str) -> HeadArtifact:
    """A speculators-format EAGLE-3 checkpoint (models/heads/speculators_format.py), local or from the hub cache."""
    if kind != "eagle3":
        raise ConfigError(f"{key}: {source} is a speculators EAGLE-3 checkpoint; method=eagle3 runs it, not {kind}")
    config, state, lm_head, draft_ids, named = read_speculators(directory, key)
    provenance = {"speculators": source, **({} if named else {"feature_layers": "target's"})}
    return HeadArtifact(config, state, weights_digest(directory), source, provenance, draft_ids=draft_ids,
                        lm_head=lm_head)


def weights_digest(directory: Path, patterns=("*.safetensors", "*.bin")) -> str:
    digest = hashlib.sha256()
    for f in sorted(f for pattern in patterns for f in directory.glob(pattern)):
        digest.update(sha256_file(f).encode())
    return digest.hexdigest()


# Released checkpoints' names -> ours. EAGLE: its single decoder layer is ``layers.0``, the fusion ``fc``.
# GRIFFIN (its Model's ``fc`` is the whole TGF: fc.fc, fc.post_attention_layernorm = norm(u), fc.mlp.input_layernorm
# = the shared N, fc.mlp.up/down_proj). Copies of embed_tokens / lm_head are dropped: the target's own are used.
PUBLISHED_NAMES = {
    "eagle": {"fc.": "fusion.fc.", "layers.0.": ""},
    # EAGLE-3 (its t2d and any embed_tokens copy dropped; lm_head and d2t are read by published_eagle3)
    "eagle3": {"fc.": "layer_fc.", "midlayer.input_layernorm.": "fusion.embed_norm.",
               "midlayer.hidden_norm.": "fusion.hidden_norm.", "midlayer.": "", "norm.": "norm."},
    "griffin": {"fc.fc.": "fusion.fc.", "fc.post_attention_layernorm.": "fusion.fused_norm.",
                "fc.mlp.input_layernorm.": "fusion.shared_norm.", "fc.mlp.up_proj.": "fusion.up_proj.",
                "fc.mlp.down_proj.": "fusion.down_proj.", "layers.0.": ""},
}


def published_state(state: dict, kind: str) -> dict:
    out = {}
    for name, tensor in state.items():
        for old, new in PUBLISHED_NAMES[kind].items():
            if name.startswith(old):
                out[new + name[len(old):]] = tensor
                break
    if kind != "eagle3" and "fusion.fc.weight" not in out:
        raise ConfigError(f"method.head: the checkpoint has no {'fc.fc' if kind == 'griffin' else 'fc'}.weight; it is "
                          f"not a released {kind} head (keys: {sorted(state)[:8]} ...)")
    return out


def head_source(head: str | None, heads_dir: str | None, needs: str) -> str:
    """Where a head method's ``method.head`` points: a head trained here by its name (runs/heads/<pair>/<name>), a
    directory, or a Hugging Face id. ConfigError naming method.head when none is given (``needs``: what to give)
    or a local one is missing, before any model loads."""
    require(isinstance(head, str) and head.strip() != "", "method.head", needs)
    head = head_location(head, heads_dir)
    local = Path(head).expanduser()
    if not looks_like_hub_id(head) and not (local / CONFIG_FILE).is_file() and not is_speculators(local):
        raise missing(Path(head).expanduser(), "method.head")
    return head
