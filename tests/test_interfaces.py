"""Every implementation of a declared interface against its protocol: the engine (engines/base.Engine), its run
(engines/base.EngineRun), the runner's round backend (runner.RoundBackend) and the language model the loops drive
(decoding/language_model.LanguageModel). A method the protocol declares must exist with the protocol's parameters
(names and defaults, in order); an attribute must be a class attribute, a property, or assigned in ``__init__``."""
from __future__ import annotations

import inspect
import re
from typing import Protocol

import pytest

from specbench.backends.torch.cached_lm import CachedLM, FeatureLM
from specbench.backends.language_model import LanguageModel
from specbench.backends.torch.static_lm import StaticLM
from specbench.engines.base import Engine, EngineRun
from specbench.engines.hf import HfEngine, HfRun
from specbench.engines.loops import LoopBackend
from specbench.engines.serving.llama_server import LlamaServerEngine, LlamaServerRun
from specbench.engines.serving.rounds import ServerBackend
from specbench.engines.serving.vllm_server import VllmServerEngine, VllmServerRun
from specbench.engines.vllm import VllmEngine
from specbench.engines.vllm_rounds import VllmBackend, VllmRun
from specbench.methods.swift_draft import SkipDraftLM
from specbench.run.runner import RoundBackend


def members(protocol: type) -> tuple[dict, set]:
    """The protocol's methods (name -> function) and attributes (annotated names), its own only."""
    methods = {name: value for name, value in vars(protocol).items()
               if callable(value) and not name.startswith("_")}
    properties = {name for name, value in vars(protocol).items() if isinstance(value, property)}
    return methods, set(protocol.__annotations__) | properties


def assigned(cls: type, name: str) -> bool:
    """Whether ``cls`` (or a base) sets attribute ``name``: a class attribute or property, or ``self.name = ...``
    (alone or in a tuple assignment) in its source."""
    if any(name in vars(klass) for klass in cls.__mro__):
        return True
    alone = rf"self\.{name}\b\s*(?:,\s*self\.\w+\s*)*(?::[^=\n]+)?=(?!=)"  # self.name = / self.name, self.b =
    later = rf"self\.\w+\s*,[^=\n]*\bself\.{name}\b[^=\n]*=(?!=)"  # self.a, self.name = ...
    pattern = re.compile(f"{alone}|{later}")
    return any(pattern.search(inspect.getsource(klass)) for klass in cls.__mro__
               if klass.__module__.startswith("specbench"))


def violations(cls: type, protocol: type) -> list[str]:
    """What ``cls`` lacks of ``protocol``: missing attributes and methods, and parameters that differ."""
    methods, attributes = members(protocol)
    found = [f"{cls.__name__}.{name}: not set" for name in sorted(attributes) if not assigned(cls, name)]
    for name, declared in methods.items():
        implemented = getattr(cls, name, None)
        if not callable(implemented):
            found.append(f"{cls.__name__}.{name}: missing")
            continue
        want = [(p.name, p.default) for p in list(inspect.signature(declared).parameters.values())[1:]]
        have = [(p.name, p.default) for p in list(inspect.signature(implemented).parameters.values())[1:]]
        if have[:len(want)] != want or any(p[1] is inspect.Parameter.empty for p in have[len(want):]):
            found.append(f"{cls.__name__}.{name}{inspect.signature(implemented)}: the protocol says "
                         f"{name}{inspect.signature(declared)}")
    return found


IMPLEMENTATIONS = [
    (Engine, HfEngine), (Engine, VllmEngine), (Engine, LlamaServerEngine), (Engine, VllmServerEngine),
    (EngineRun, HfRun), (EngineRun, VllmRun), (EngineRun, LlamaServerRun), (EngineRun, VllmServerRun),
    (RoundBackend, LoopBackend), (RoundBackend, VllmBackend), (RoundBackend, ServerBackend),
    (LanguageModel, CachedLM), (LanguageModel, FeatureLM), (LanguageModel, StaticLM), (LanguageModel, SkipDraftLM),
]


@pytest.mark.parametrize("protocol,cls", IMPLEMENTATIONS, ids=lambda x: x.__name__)
def test_each_implementation_has_its_interface(protocol, cls):
    assert violations(cls, protocol) == []


def test_llamacpp_language_model_has_the_interface():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (make llamacpp)")
    from specbench.backends.llamacpp.lm import LlamaCppLM

    assert violations(LlamaCppLM, LanguageModel) == []


def test_the_lms_a_pair_hands_out_are_language_models():
    from specbench.models.tiny import build_tiny_pair

    for execution in ("eager", "static"):
        pair = build_tiny_pair(name="tiny-llama", execution=execution)
        for lm in (pair.lm("target"), pair.lm("draft"), pair.lm("target", features=True)):
            assert isinstance(lm, LanguageModel), (execution, type(lm))


def test_the_check_finds_what_an_implementation_lacks():
    class Declared(Protocol):
        name: str
        width: int

        def run(self, ids: list, keep_last: int | None = None) -> None: ...

        def stop(self) -> None: ...

    class Partial:
        def __init__(self):
            self.name = "x"

        def run(self, ids: list, keep: int | None = None) -> None:  # renamed parameter
            pass

    class Extra:
        name, width = "x", 1

        def run(self, ids: list, keep_last: int | None = None, depth: int = 0) -> None:  # an optional one more
            pass

        def stop(self, now) -> None:  # a required one more
            pass

    found = violations(Partial, Declared)
    assert "Partial.width: not set" in found and "Partial.stop: missing" in found
    assert any(v.startswith("Partial.run(") for v in found)
    assert [v.split("(")[0] for v in violations(Extra, Declared)] == ["Extra.stop"]
