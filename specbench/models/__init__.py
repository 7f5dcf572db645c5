"""Model pairs: a target, a draft sharing its tokenizer, and how to load them.

Each conf/model/*.yaml names a loader through `_target_`: hub ids (hub.py), the embedded offline
pair (embedded.py) or tiny random test models (tiny.py). All return a ModelPair.
"""
from .pair import ModelPair

__all__ = ["ModelPair"]
