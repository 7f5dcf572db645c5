"""DISCO (Mamou et al. 2024, §3): a trained classifier decides the speculation lookahead token by token.

Right after the draft proposes d_i from its distribution y_i^D, a 2-layer FFN gives the confidence

    C_i = FFN(Concat(Top_k(y_i^D), Ent(y_i^D), i))        (k = 10; i = d_i's index in the generated output)

that the target accepts d_i; the draft stops (and the target verifies) when C_i < τ, and never drafts more
than SL_max tokens. Verification is unchanged, so the output is exactly greedy's at temperature 0 whatever
the classifier says. Training, F1, and the tuning of τ and SL_max live in ``specbench.training.disco``.

Classifier artifacts are ``classifier-<sha256 prefix>.pt`` files (the hash of the weights, so a path
names one classifier for good), written by ``save_classifier`` with a JSON sidecar describing how they
were trained.
"""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import torch
from torch import nn

from ..errors import ConfigError, require
from ..backends.torch.graphs import GraphedCall
from ..errors import positive_int
from .sl_policies import StaticSL

ARTIFACT_FORMAT = 1


def disco_features(draft_logits: torch.Tensor, positions: torch.Tensor | int, top_k: int = 10) -> torch.Tensor:
    """[Top_k(y^D) sorted high to low, Ent(y^D) in nats, i] for each row: (..., V) logits -> (..., k + 2)."""
    log_probs = torch.log_softmax(draft_logits.float(), dim=-1)
    probs = log_probs.exp()
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1).values  # (..., k)
    if top.shape[-1] < top_k:  # a vocabulary smaller than k (tiny test models): pad with zero probabilities
        top = torch.nn.functional.pad(top, (0, top_k - top.shape[-1]))
    entropy = -(probs * log_probs).nan_to_num().sum(-1, keepdim=True)  # 0 * log 0 = 0
    position = torch.as_tensor(positions, dtype=torch.float32, device=entropy.device)
    position = position.expand(entropy.shape[:-1]).unsqueeze(-1)
    return torch.cat([top, entropy, position], dim=-1)


class DiscoClassifier(nn.Module):
    """Standardise (train-set mean/std) -> Linear(k+2, hidden) -> ReLU -> Linear(hidden, 2); class 1 = accepted."""

    def __init__(self, top_k: int = 10, hidden: int = 32):
        super().__init__()
        self.top_k = positive_int(top_k, "disco.features.top_k", "top-k draft probabilities")
        self.hidden = positive_int(hidden, "disco.classifier.hidden", "hidden units")
        width = top_k + 2
        self.register_buffer("mean", torch.zeros(width))
        self.register_buffer("std", torch.ones(width))
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def fit_standardisation(self, features: torch.Tensor) -> None:
        self.mean.copy_(features.mean(0))
        self.std.copy_(features.std(0).clamp_min(1e-6) if len(features) > 1 else torch.ones_like(self.std))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(N, k+2) features -> (N, 2) logits."""
        return self.net((features - self.mean) / self.std)

    @torch.no_grad()
    def confidence(self, features: torch.Tensor) -> torch.Tensor:
        """C_i: probability of acceptance, (N, k+2) -> (N,)."""
        return torch.softmax(self(features), dim=-1)[..., 1]


def save_classifier(classifier: DiscoClassifier, directory: Path, metadata: dict) -> Path:
    """Write classifier-<hash>.pt (+ .json metadata) under ``directory``; the hash covers the weights."""
    payload = {"format": ARTIFACT_FORMAT, "top_k": classifier.top_k, "hidden": classifier.hidden,
               "state_dict": {k: v.detach().cpu() for k, v in classifier.state_dict().items()}}
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()[:12]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"classifier-{digest}.pt"
    path.write_bytes(buffer.getvalue())
    path.with_suffix(".json").write_text(json.dumps({"artifact": path.name, "sha256_prefix": digest,
                                                     "format": ARTIFACT_FORMAT, **metadata}, indent=2))
    return path


def load_classifier(path: str | Path, key: str = "method.policy.classifier") -> DiscoClassifier:
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"{key}: no classifier file at '{path}'; train one with `python -m specbench.training.disco "
                          "disco=<experiment>` (it prints the path) or give the path of a classifier-<hash>.pt")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same config error
        raise ConfigError(f"{key}: '{path}' is not a DISCO classifier file ({exc})") from exc
    require(isinstance(payload, dict) and payload.get("format") == ARTIFACT_FORMAT, key,
            f"'{path}' is not a DISCO classifier of format {ARTIFACT_FORMAT}")
    classifier = DiscoClassifier(payload["top_k"], payload["hidden"])
    classifier.load_state_dict(payload["state_dict"])
    return classifier.eval()


class DiscoSL(StaticSL):
    """Stop drafting when C_i < τ (``threshold``), at most SL_max (``sl_max``) tokens per step.

    classifier: the path of a trained artifact (configs) or a DiscoClassifier (tests, the pipeline).
    """

    def __init__(self, classifier: str | Path | DiscoClassifier | None = None, threshold: float = 0.5,
                 sl_max: int = 10):
        super().__init__(positive_int(sl_max, "method.policy.sl_max", "most draft tokens per step, SL_max"))
        require(classifier is not None, "method.policy.classifier",
                "DISCO needs a trained classifier: set it to the classifier-<hash>.pt path that "
                "`python -m specbench.training.disco` printed (see docs/disco.md)")
        require(isinstance(threshold, (int, float)) and 0 <= threshold <= 1, "method.policy.threshold",
                f"must be a probability τ in [0, 1], got {threshold!r}")
        self.classifier = classifier if isinstance(classifier, DiscoClassifier) else load_classifier(classifier)
        self.threshold = float(threshold)
        self.graphs = False
        self.confidence = GraphedCall(self._confidence, None)

    def use_execution(self, execution) -> None:
        """With CUDA graphs (model.execution: graphs) the classifier (features of the draft's distribution and the
        FFN, a dozen small kernels per draft token) runs from one captured graph too."""
        self.graphs = execution.graphs

    def _confidence(self, draft_logits: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        features = disco_features(draft_logits, position, self.classifier.top_k).unsqueeze(0)
        return self.classifier.confidence(features)[0]

    def keep_drafting(self, position: int, draft_logits: torch.Tensor, token: int) -> bool:
        if self.classifier.mean.device != draft_logits.device:  # loaded on the CPU; the draft may be on a GPU
            self.classifier.to(draft_logits.device)
        if self.graphs and self.confidence.capture is None and draft_logits.device.type == "cuda":
            from ..backends.torch.graphs import cuda_capture

            self.confidence = GraphedCall(self._confidence, cuda_capture)
        # the feature i: d_i's place in the generated output, as in extraction
        index = torch.tensor(float(self.output_index(position)), device=draft_logits.device)
        return float(self.confidence(draft_logits, index)) >= self.threshold
