"""A draft head named by its name: ``method=griffin method.head=griffin_top5`` decodes with the head that
``python -m specbench.training.heads head=griffin_top5`` trains (conf/head/griffin_top5.yaml) and writes to
``${paths.heads}/${model.name}/griffin_top5`` (the method's ``heads_dir``). A directory or a Hugging Face id
(anything with a ``/``, or starting with ``.`` or ``~``) is taken as it is.

Two resolvers give a method named by its head the name and kind the head has (conf/method/eagle.yaml), so the rows of
GRIFFIN's ablations (method.name) stay apart and an eagle-kind head decodes as method=eagle does:

- ``${specbench.head_name:<head>,<default>}``: the head's name when it is named bare, else ``default`` (the method's);
- ``${specbench.head_kind:<head>,<default>}``: the kind conf/head/<head>.yaml trains (following its defaults list,
  griffin_top5 -> griffin), else ``default``.

No torch here: registered by cli.register_configs, before a program composes or resolves a config.
"""
from __future__ import annotations

from functools import lru_cache

from omegaconf import OmegaConf

from ...conf_dir import CONF

HEAD_CONFIGS = CONF / "head"


def is_head_name(head) -> bool:
    """A bare name (``griffin_top5``), not a directory or a Hugging Face id."""
    return isinstance(head, str) and head.strip() != "" and "/" not in head and not head.startswith((".", "~"))


def head_location(head, heads_dir) -> str:
    """Where ``head`` is: ``<heads_dir>/<head>`` for a bare name (when the method has a heads_dir), else as given."""
    return f"{heads_dir}/{head}" if heads_dir and is_head_name(head) else head


@lru_cache(maxsize=None)
def trained_kind(name: str) -> str | None:
    """The ``kind`` conf/head/<name>.yaml trains, from it or the configs its defaults list extends; None when no
    head config has that name."""
    seen = set()
    while name and name not in seen and (HEAD_CONFIGS / f"{name}.yaml").is_file():
        seen.add(name)
        node = OmegaConf.load(HEAD_CONFIGS / f"{name}.yaml")
        if node.get("kind") is not None:
            return str(node.kind)
        parents = [d for d in node.get("defaults") or [] if isinstance(d, str) and d != "_self_"]
        name = parents[0] if parents else None
    return None


def head_name(head, default: str) -> str:
    return head if is_head_name(head) else default


def head_kind(head, default: str) -> str:
    return (trained_kind(head) if is_head_name(head) else None) or default


def register() -> None:
    OmegaConf.register_new_resolver("specbench.head_name", head_name, replace=True)
    OmegaConf.register_new_resolver("specbench.head_kind", head_kind, replace=True)
