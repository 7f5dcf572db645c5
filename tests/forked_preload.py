"""Imported once by the fork server of ``tests/forked.py``: what every forked CLI run would otherwise import again.
Nothing here runs a model or starts a thread pool (the children fork from this process)."""
import importlib
import pkgutil

import hydra  # noqa: F401
import torch  # noqa: F401
from transformers import AutoModelForCausalLM, GPT2LMHeadModel, LlamaForCausalLM  # noqa: F401 - lazy in transformers

import specbench

# every specbench module (the config checks import each _target_), but not the optional engines' packages: vLLM and
# llama.cpp stay for the runs that use them, imported in the child
for found in pkgutil.walk_packages(specbench.__path__, "specbench."):
    if found.name.endswith("__main__"):
        continue  # runpy executes it as __main__ in each child
    try:
        importlib.import_module(found.name)
    except Exception:  # noqa: BLE001 - a module that cannot import here fails in the child, with its own message
        pass
