"""Training DISCO's classifier (cross-entropy) and scoring it with F1 as its Table 5 does.

Labels: ``agreement`` (hard: the draft's top token is the target's token) or ``tv`` (soft: the accepted
class gets probability 1 - TV(y^D, y^T), the paper's "cross-entropy with Total Variance as distance").
F1 is for the positive class "accepted". Static SL drafts on whatever the draft says, i.e. predicts
"accepted" for every token: its F1 is that constant predictor's (Table 5's "F1 static-SL").
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from ...errors import require
from ...methods.disco import DiscoClassifier

LABELS = ("agreement", "tv")


def train_classifier(features: torch.Tensor, labels: torch.Tensor, tv: torch.Tensor | None = None, *,
                     top_k: int = 10, hidden: int = 32, epochs: int = 300, lr: float = 1e-2,
                     weight_decay: float = 0.0, batch_size: int | None = None, seed: int = 0,
                     label: str = "agreement") -> tuple[DiscoClassifier, list[float]]:
    """Adam on cross-entropy; full batch unless ``batch_size``. Returns the classifier and per-epoch loss."""
    require(label in LABELS, "disco.classifier.label", f"{label!r} is not one of {list(LABELS)}")
    require(features.shape[-1] == top_k + 2, "disco.features.top_k",
            f"features have {features.shape[-1]} columns, top_k={top_k} needs {top_k + 2}")
    torch.manual_seed(seed)
    classifier = DiscoClassifier(top_k, hidden)
    classifier.fit_standardisation(features)
    if label == "tv":
        require(tv is not None, "disco.classifier.label", "label 'tv' needs the TV distances of the features file")
        accept = (1 - tv).clamp(0, 1)
        targets = torch.stack([1 - accept, accept], dim=-1)  # class probabilities (N, 2)
    else:
        targets = labels.long()
    optimiser = torch.optim.Adam(classifier.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    size = batch_size or len(features)
    losses = []
    classifier.train()
    for _ in range(epochs):
        order = torch.randperm(len(features), generator=generator)
        total = 0.0
        for start in range(0, len(features), size):
            batch = order[start:start + size]
            loss = F.cross_entropy(classifier(features[batch]), targets[batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += loss.item() * len(batch)
        losses.append(total / len(features))
    return classifier.eval(), losses


def f1_score(predicted: torch.Tensor, labels: torch.Tensor) -> float:
    """F1 of the positive class (accepted = 1); 0 when nothing is predicted or present."""
    predicted, labels = predicted.bool(), labels.bool()
    true_pos = int((predicted & labels).sum())
    denominator = int(predicted.sum()) + int(labels.sum())
    return 2 * true_pos / denominator if denominator else 0.0


def evaluate(classifier: DiscoClassifier, features: torch.Tensor, labels: torch.Tensor,
             threshold: float = 0.5) -> dict:
    """Table 5 on one split: the classifier's F1 (C_i >= threshold means "accepted") and static SL's."""
    predicted = classifier.confidence(features) >= threshold
    return {
        "tokens": len(labels),
        "accepted_fraction": float(labels.float().mean()),
        "threshold": threshold,
        "f1_disco": f1_score(predicted, labels),
        "f1_static_sl": f1_score(torch.ones_like(labels), labels),
        "accuracy_disco": float((predicted == labels.bool()).float().mean()),
    }
