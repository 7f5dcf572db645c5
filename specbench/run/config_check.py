"""The whole composed config checked before anything loads: every bad key or value is a ConfigError naming it.

Two passes, both before a model pair is built (``benchmark.run`` calls them):

``check_settings(cfg)`` — the run's own settings: the top-level keys, ``runner`` against ``RunnerConfig``
(a typed dataclass), and that ``runner.records_dir`` is a directory this process can write.

``check_components(cfg, pair)`` — what one benchmark is made of: ``sampling`` against ``SamplingConfig``,
then every node with a ``_target_`` (model, data, method, baseline, logger, and nested ones such as
``method.policy`` or ``data.components.*``) against its target's constructor: a key that is not a
parameter is an error listing the valid ones, a missing required parameter is named, and each value is
checked against the parameter's annotation (specbench/config_types.py: a bool must be a real bool, an int is never
a bool, ...). Then the range and cross-field checks the constructors themselves make (γ >= 1, a
greedy-only method at temperature 0, a DISCO classifier file that loads ...) run by *constructing* the
data, method, baseline and logger once with a ``ConfigOnlyPair`` standing in for the model pair: method
constructors check their settings before anything that needs the loaded pair (methods/base.py), so their
own checks are the single source of truth and report before gigabytes load; a check that does need the
pair (hf_assisted's vocabulary sizes) stops the stand-in build there (ModelNotLoaded) and runs when the
real method is built. The pair's own values (dtype, device, linear kernel) are resolved by
``precision_of_config`` without loading.
"""
from __future__ import annotations

import inspect
import os
import tempfile
import typing
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Annotated, Literal

from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, OmegaConf

from . import components
from ..config_types import Range, describe, problem, unknown
from ..analysis.summary import numeric_keys
from ..environment import check_threads
from ..errors import ConfigError, require
from ..backends.choice import backend_of_config
from ..backends.execution import execution_of_config
from ..backends.torch.static_support import check_config_attention
from ..backends.precision import precision_of_config


@dataclass
class SamplingConfig:
    """``sampling``: how every method (and its baseline) picks tokens. Values come from conf/config.yaml."""

    temperature: Annotated[float, Range(ge=0)]  # 0: greedy decoding
    top_p: Annotated[float, Range(gt=0, le=1)]
    seed: int  # prompt i is decoded with seed + i


@dataclass
class RunnerConfig:
    """``runner``: where records go and how each prompt is timed (conf/config.yaml says what each one does)."""

    records_dir: str
    warmup: Annotated[int, Range(ge=0)]
    warmup_max_new_tokens: Annotated[int, Range(ge=0)]
    repeats: Annotated[int, Range(ge=1)]
    baseline: Literal["auto", "skip"]
    pairing: Literal["interleaved", "separate"]
    strict_lossless: bool
    threads: Annotated[int, Range(ge=1)] | None  # null: the cores this process may use
    progress: bool
    oversubscribe: bool = False  # true: allow more threads than the CPUs this process may use
    batch_size: Annotated[int, Range(ge=1)] = 1  # requests in flight per round (engine=vllm; engine=hf: 1)
    bound: bool = True  # measure T(k) after the run and print the speed-up the forward costs allow beside it
    cost_tables: Literal["reuse", "measure"] = "reuse"  # the bound's T(k): kept tables where they hold


# Top-level keys of a composed config: "target" nodes are checked against their _target_'s constructor.
TOP_LEVEL = {"model": "target", "data": "target", "method": "target", "baseline": "target", "logger": "target",
             "engine": "target",  # what decodes: our loops (hf) or vLLM (conf/engine/)
             "sampling": SamplingConfig, "runner": RunnerConfig, "objective": str, "external_data": str,
             "paths": dict,       # where runs/ outputs go (conf/paths/)
             "experiment": dict,  # a paper table's rows, columns and sweep (report metadata, +experiment=...)
             "hydra": dict}       # present only when composed with return_hydra_config
REQUIRED = ("model", "data", "method", "baseline", "sampling", "runner")
HYDRA_KEYS = {"_target_", "_partial_", "_convert_", "_recursive_", "_args_"}
# Arguments components.build passes to a method at run time: never keys of the method's config.
METHOD_RUNTIME = {"pair": "the model pair is chosen with model=<pair>",
                  **{k: f"set by sampling.{k}" for k in ("temperature", "top_p", "seed")}}


class ModelNotLoaded(AttributeError):
    """A constructor used the model pair while the config was checked before loading."""


class ConfigOnlyPair:
    """Stands in for the model pair while constructors are checked before loading: it has the pair's name and
    says whether the pair has a draft (a hub pair's ``model.draft`` may be null), and has ``vocab_size`` where
    the model config fixes it without loading (``vocab_size_before_loading``), and ``num_layers`` (decoder layers)
    for the tiny pairs; anything else raises."""

    def __init__(self, model: dict):
        self.name = model.get("name")
        self.draft = None if "draft" in model and model["draft"] is None else "<draft model, not loaded yet>"
        self.execution = execution_of_config(model)  # resolved without loading (static buckets vs trees)
        self.backend = backend_of_config(model).name  # methods say which backends they run on
        vocab = vocab_size_before_loading(model)
        if vocab is not None:
            self.vocab_size = vocab
        if model.get("_target_") == "specbench.models.tiny.build_tiny_pair":  # its config fixes the layer count
            self.num_layers = int(model.get("layers", 2))  # decoder layers (method=swift checks a skip set)

    def __getattr__(self, attr):
        raise ModelNotLoaded(f"ConfigOnlyPair.{attr}: the model pair is not loaded while the config is checked")


def vocab_size_before_loading(model: dict) -> int | None:
    """The target's vocabulary size (``ModelPair.vocab_size``) when the model config alone fixes it: the tiny
    pairs, whose vocabulary is their byte tokenizer's. None for hub and embedded pairs: it is in the weights'
    config, known once they load (a check that needs it then runs on the loaded pair)."""
    if model.get("_target_") == "specbench.models.tiny.build_tiny_pair":
        from ..models.tiny import byte_tokenizer
        return len(byte_tokenizer())
    return None


def check_settings(cfg: DictConfig) -> None:
    """Top-level keys, ``runner`` and a writable ``runner.records_dir``; ConfigError on the first problem."""
    for key in cfg:
        require(key in TOP_LEVEL, key, unknown(key, TOP_LEVEL, "top-level key"))
    for key in REQUIRED:
        require(cfg.get(key) is not None, key, f"missing; pass {key}=<name>" if TOP_LEVEL[key] == "target"
                else "missing from the config")
    for key in ("objective", "external_data", "paths"):
        if key in cfg:
            message = problem(plain(cfg, key), TOP_LEVEL[key])
            require(message is None, key, message or "")
    if cfg.get("objective") is not None:  # what an optimising sweeper reads: checked before the first job runs
        objectives = numeric_keys()
        require(cfg.objective in objectives, "objective", unknown(cfg.objective, objectives, "summary number"))
    check_schema(plain(cfg, "runner"), RunnerConfig, "runner")
    check_threads(cfg.runner.threads, cfg.runner.get("oversubscribe", False))
    if cfg.get("engine") is not None:
        engine = plain(cfg, "engine")
        require(isinstance(engine, dict) and "_target_" in engine, "engine", "must be a config with a _target_")
        check_node(engine, "engine", {})
    check_records_dir(cfg.runner.records_dir)


def check_components(cfg: DictConfig, pair=None) -> None:
    """``sampling`` and every ``_target_`` node, then the constructors' own checks; ``pair``: a loaded pair
    (pipelines) is used as it is, otherwise a ConfigOnlyPair stands in."""
    check_schema(plain(cfg, "sampling"), SamplingConfig, "sampling")
    model = plain(cfg, "model")
    for key in ("model", "data", "method", "baseline", "logger"):
        node = plain(cfg, key)
        if node is None and key == "logger":
            continue
        require(isinstance(node, dict) and "_target_" in node, key, "must be a config with a _target_")
        check_node(node, key, METHOD_RUNTIME if key in ("method", "baseline") else {})
    precision_of_config(cfg.model)  # a bad dtype / device / linear kernel fails here, before any weights load
    execution_of_config(cfg.model)  # graphs on a CPU, bad buckets: the same
    loader_check = getattr(get_object(model["_target_"]), "check_config", None)
    if loader_check is not None:  # what a loader checks of its own keys before loading (gguf: the files exist)
        loader_check(model)
    if backend_of_config(model).llamacpp:  # llama.cpp runs its own kernels: no static cache or graphs of ours
        from ..models.gguf_pair import check_llamacpp_execution

        check_llamacpp_execution(model.get("execution", "auto"))
    else:  # flash/flex attention under a static cache's own mask: refused here, before anything loads
        check_config_attention(model)
    sampling = plain(cfg, "sampling")
    stand_in = pair if pair is not None else ConfigOnlyPair(model)
    construct(cfg.data, "data")
    for key in ("method", "baseline"):
        method = construct(cfg[key], key, pair=stand_in, **sampling)
        if method is not None and hasattr(method, "check_blocks"):
            method.check_blocks()  # a tree larger than every bucket (static / graphs execution)
    if cfg.get("logger") is not None:
        construct(cfg.logger, "logger")


def plain(cfg: DictConfig, key: str):
    """cfg[key] resolved to plain Python values; an interpolation that cannot resolve is a ConfigError."""
    try:
        value = cfg[key]
        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True, throw_on_missing=True)
        return value
    except Exception as exc:  # noqa: BLE001 - omegaconf's resolution errors have many types
        raise ConfigError(f"{key}: cannot be resolved ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None


def check_schema(node, schema: type, key: str) -> None:
    """A plain mapping against a typed dataclass: no unknown or missing keys, every value of its field's type."""
    require(isinstance(node, dict), key, f"must be a mapping of {', '.join(f.name for f in fields(schema))}")
    hints = typing.get_type_hints(schema, include_extras=True)
    for name, value in node.items():
        require(name in hints, f"{key}.{name}", unknown(name, hints, f"key of {key}"))
        message = problem(value, hints[name])
        require(message is None, f"{key}.{name}", message or "")
    defaults = {f.name for f in fields(schema) if f.default is not MISSING}
    for name in hints:
        require(name in node or name in defaults, f"{key}.{name}", f"missing; must be {describe(hints[name])}")


def check_node(node: dict, key: str, runtime: dict[str, str]) -> None:
    """A ``_target_`` node against its target's constructor (nested ``_target_`` nodes recursively)."""
    target = node["_target_"]
    try:
        built = get_object(target)
    except Exception as exc:  # noqa: BLE001 - hydra raises ImportError or ValueError
        raise ConfigError(f"{key}._target_: cannot import {target!r} ({str(exc).splitlines()[0]})") from None
    params = parameters(built)
    valid = {name for name in params if name not in runtime}
    for name, value in node.items():
        if name in HYDRA_KEYS:
            continue
        require(name not in runtime, f"{key}.{name}", f"not a {key} setting: {runtime.get(name)}")
        require(name in params, f"{key}.{name}", unknown(name, valid, f"key for {target}"))
        if isinstance(value, dict) and "_target_" in value:
            check_node(value, f"{key}.{name}", nested_runtime(value, runtime))
            continue
        annotation = params[name].annotation
        message = problem(value, annotation) if annotation is not None else None
        require(message is None, f"{key}.{name}", message or "")
        if isinstance(value, dict):  # a mapping of nodes (data.components.<name>)
            for sub, item in value.items():
                if isinstance(item, dict) and "_target_" in item:
                    check_node(item, f"{key}.{name}.{sub}", {})
    for name, param in params.items():
        require(param.default is not inspect.Parameter.empty or name in node or name in runtime, f"{key}.{name}",
                f"missing; {target} needs it ({describe(param.annotation) if param.annotation else 'a value'})")


def nested_runtime(node: dict, runtime: dict[str, str]) -> dict[str, str]:
    """The runtime arguments of a nested node: a method's own (pair, sampling) when a method nests another method
    (``method.fallback`` of sam_decoding, built by it with the same pair and sampling), else none."""
    try:
        nested_is_method = runtime is METHOD_RUNTIME and "pair" in parameters(get_object(node["_target_"]))
    except Exception:  # noqa: BLE001 - a target that does not import is named by check_node itself
        nested_is_method = False
    return METHOD_RUNTIME if nested_is_method else {}


@dataclass
class Param:
    default: object
    annotation: object  # None: not annotated (anything goes)


def parameters(target) -> dict[str, Param]:
    """A target's keyword parameters. For a class: its ``__init__``'s, and while an ``__init__`` passes
    ``**kwargs`` on, its parents' too (SpeculativeDecoding's ``**sampling`` reaches DecodingMethod)."""
    if isinstance(target, type):
        functions = [vars(c)["__init__"] for c in target.__mro__ if c is not object and "__init__" in vars(c)]
    else:
        functions = [target]
    out: dict[str, Param] = {}
    for function in functions:
        function = inspect.unwrap(function)
        try:
            hints = typing.get_type_hints(function, include_extras=True)
        except Exception:  # noqa: BLE001 - an annotation that cannot be evaluated is not checked
            hints = {}
        params = list(inspect.signature(function).parameters.values())[1 if isinstance(target, type) else 0:]
        for p in params:
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                out.setdefault(p.name, Param(p.default, hints.get(p.name)))
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return out


def construct(node: DictConfig, key: str, **kwargs):
    """Build ``node`` once so the constructor's own checks run now, and return it; a constructor that needs the
    loaded model (ModelNotLoaded) is left to check itself when the real one is built (None)."""
    try:
        return components.build(node, key, **kwargs)
    except ModelNotLoaded:  # raised by the constructor itself (build calls it outside Hydra)
        return None
    except ConfigError as exc:  # or wrapped by Hydra, when a nested node's constructor raised it
        cause = exc.__cause__
        while cause is not None and not isinstance(cause, ModelNotLoaded):
            cause = cause.__cause__
        if cause is None:
            raise
        return None


def check_records_dir(path) -> None:
    """``runner.records_dir`` must be a directory this process can create files in (checked with a probe file)."""
    fix = "pass runner.records_dir=<a writable directory>"
    require(path is not None and str(path).strip(), "runner.records_dir",
            f"is empty (records would go into the current directory); {fix}")
    directory = Path(str(path)).expanduser()
    require(not directory.exists() or directory.is_dir(), "runner.records_dir",
            f"'{directory}' is a file, not a directory; {fix}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"runner.records_dir: cannot write to '{directory}' ({exc.strerror or exc}); {fix}") from None
