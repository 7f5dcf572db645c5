"""Datasets: rows from an offline source -> sampled examples -> prompts in the papers' templates."""
from .dataset import Example, PromptDataset

__all__ = ["Example", "PromptDataset"]
