"""The servers the harness starts: how each is launched on 127.0.0.1, where it answers health checks, and which API
adapter (client.py) talks to it. Each is launched with and without speculation from the same settings, so the
speculative server and its baseline differ in nothing else.

- ``LlamaServer``: llama.cpp's ``llama-server`` (``make llama-server`` builds it from the llama.cpp our bindings
  compile), the pair's GGUF files, speculation by its draft model (``--spec-type draft-simple``, ``--spec-draft-n-max
  γ``) or by n-grams of the context (``ngram-*``, no draft model); ``--parallel`` slots = the most requests it
  decodes at once (the highest concurrency level), one shared context of ``ctx_per_slot`` tokens each.
- ``VllmServer``: vLLM's OpenAI-compatible server (``vllm.entrypoints.openai.api_server``, this Python's vLLM: the
  CPU build here, the CUDA one on a GPU), the pair's checkpoints, speculation by vLLM's ``--speculative-config``
  (engines/vllm_methods.py, as engine=vllm maps our methods), ``--max-num-seqs`` slots. Sampling defaults come from
  vLLM, not the checkpoint's generation config (``--generation-config vllm``: a chat model's repetition penalty
  would otherwise apply to every request), and prefix caching is off unless asked for (timings would depend on
  order). Its speculation counters are server-wide (Prometheus ``/metrics``), read before and after each level.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ...conf_dir import CONF
from ...errors import ConfigError, require
from .client import LlamaServerCompletion, OpenAICompletions
from .process import ServerProcess, free_port

LLAMA_SERVER_BINARY = CONF.parent / ".venv" / "llama-server" / "llama-server"  # make llama-server
LLAMA_SPEC_TYPES = ("draft-simple", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


def llama_server_binary(path: str | None = None) -> Path:
    """The llama-server to run: ``path``, else the one ``make llama-server`` built, else one on the PATH."""
    candidates = [Path(path)] if path else [LLAMA_SERVER_BINARY, shutil.which("llama-server")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise ConfigError(f"engine.binary: no llama-server at {path or LLAMA_SERVER_BINARY}: build it with `make "
                      "llama-server` (llama.cpp's server from the source the bindings compile), or give its path")


def on_free_port(label: str, command, log_path: Path, start_timeout_s: float,
                 env: dict | None = None) -> tuple[ServerProcess, str]:
    """A server as a process on a free port of 127.0.0.1 (not started), health-checked at ``/health``, and its base
    URL; ``command(port)`` is its argv."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    return ServerProcess(label, command(port), base + "/health", log_path, env=env,
                         start_timeout_s=start_timeout_s), base


@dataclass(frozen=True)
class LlamaServer:
    target_gguf: Path
    draft_gguf: Path | None          # the draft model (spec_type draft-simple)
    spec_type: str | None            # None: the baseline, no speculation
    gamma: int = 4                   # --spec-draft-n-max: tokens drafted per step, at most
    gamma_min: int = 0               # --spec-draft-n-min
    ngram_size: int = 12             # ngram-simple: the lookup n-gram's length (--spec-ngram-simple-size-n)
    threads: int = 2
    slots: int = 1                   # --parallel: requests decoded at once
    ctx_per_slot: int = 2048
    binary: Path = LLAMA_SERVER_BINARY
    name: str = "llama_server"

    def __post_init__(self):
        if self.spec_type is not None:
            require(self.spec_type in LLAMA_SPEC_TYPES, "engine.spec_type",
                    f"must be one of {list(LLAMA_SPEC_TYPES)} (or null: no speculation), got {self.spec_type!r}")
            require(self.spec_type != "draft-simple" or self.draft_gguf is not None, "engine.spec_type",
                    "draft-simple speculates with a draft model: the pair has no draft GGUF")
        require(isinstance(self.gamma, int) and self.gamma >= 1, "engine.gamma", f"must be >= 1, got {self.gamma!r}")
        require(isinstance(self.slots, int) and self.slots >= 1, "engine.slots", f"must be >= 1, got {self.slots!r}")

    @property
    def speculative(self) -> bool:
        return self.spec_type is not None

    def command(self, port: int) -> list[str]:
        args = [str(self.binary), "--host", "127.0.0.1", "--port", str(port), "--offline", "--no-ui",
                "--model", str(self.target_gguf), "--threads", str(self.threads), "--parallel", str(self.slots),
                "--ctx-size", str(self.ctx_per_slot * self.slots), "--metrics", "--no-warmup"]
        if self.spec_type is not None:
            if self.spec_type == "draft-simple":
                args += ["--model-draft", str(self.draft_gguf), "--threads-draft", str(self.threads)]
            if self.spec_type == "ngram-simple":  # the lookup n-gram, and drafts of γ tokens
                args += ["--spec-ngram-simple-size-n", str(self.ngram_size),
                         "--spec-ngram-simple-size-m", str(self.gamma)]
            args += ["--spec-type", self.spec_type, "--spec-draft-n-max", str(self.gamma),
                     "--spec-draft-n-min", str(self.gamma_min)]
        return args

    @property
    def label(self) -> str:
        return f"{self.name}{' (' + self.spec_type + ')' if self.spec_type else ''}"

    def process(self, log_path: Path, start_timeout_s: float = 300.0) -> tuple[ServerProcess, str]:
        return on_free_port(self.label, self.command, log_path, start_timeout_s)

    def counters(self, base_url: str) -> dict | None:
        """Server-wide speculation counters (llama-server reports them per request instead: client.py)."""
        return None

    api = LlamaServerCompletion()


@dataclass(frozen=True)
class VllmServer:
    target: str                      # checkpoint directory or hub id
    tokenizer: str
    dtype: str
    speculative: dict | None = None  # vLLM's speculative_config; None: the baseline
    max_model_len: int = 4096
    slots: int = 1                   # --max-num-seqs: requests decoded at once
    seed: int = 0
    enforce_eager: bool = True
    prefix_caching: bool = False
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_utilization: float | None = None  # CUDA: the fraction of the GPU this server may take
    env: tuple = ()                  # (name, value) pairs added to the server's environment (the CPU backend's)
    options: tuple = ()              # (EngineArgs name, value) pairs passed as --kebab-case flags
    stop_ids: tuple = ()             # the pair's EOS ids: every request stops at them
    served_name: str = "specbench"
    name: str = "vllm_server"

    @property
    def label(self) -> str:
        return f"{self.name}{' (' + self.speculative['method'] + ')' if self.speculative else ''}"

    def command(self, port: int) -> list[str]:
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port",
                str(port), "--model", self.target, "--tokenizer", self.tokenizer, "--served-model-name",
                self.served_name, "--dtype", self.dtype, "--max-model-len", str(self.max_model_len),
                "--max-num-seqs", str(self.slots), "--seed", str(self.seed), "--generation-config", "vllm",
                "--tensor-parallel-size", str(self.tensor_parallel_size),
                "--pipeline-parallel-size", str(self.pipeline_parallel_size),
                "--enforce-eager" if self.enforce_eager else "--no-enforce-eager",
                "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching",
                "--disable-uvicorn-access-log"]
        if self.gpu_memory_utilization is not None:
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.speculative is not None:
            args += ["--speculative-config", json.dumps(self.speculative)]
        for key, value in self.options:
            flag = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + key.replace("_", "-"))
            else:
                args += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
        return args

    def process(self, log_path: Path, start_timeout_s: float = 600.0) -> tuple[ServerProcess, str]:
        env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), **dict(self.env)}
        return on_free_port(self.label, self.command, log_path, start_timeout_s, env)

    def counters(self, base_url: str) -> dict | None:
        """vLLM's speculation totals since it started (summed over its engines), from ``/metrics``; None without
        speculation."""
        if self.speculative is None:
            return None
        import httpx

        return prometheus_totals(httpx.get(base_url + "/metrics", timeout=30.0).text, VLLM_SPEC_COUNTERS)

    @property
    def api(self) -> OpenAICompletions:
        return OpenAICompletions(self.served_name, self.stop_ids)


# vLLM's Prometheus counters -> ours: verification steps that had a draft, tokens drafted, drafted tokens accepted
VLLM_SPEC_COUNTERS = {"vllm:spec_decode_num_drafts_total": "steps",
                      "vllm:spec_decode_num_draft_tokens_total": "drafted",
                      "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
PROMETHEUS_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def prometheus_totals(text: str, names: dict[str, str]) -> dict[str, float]:
    """The sums over label sets of the Prometheus samples named in ``names`` (renamed to its values)."""
    totals = dict.fromkeys(names.values(), 0.0)
    for line in text.splitlines():
        match = PROMETHEUS_LINE.match(line)
        if match and match.group(1) in names:
            totals[names[match.group(1)]] += float(match.group(3))
    return totals


class ServerHandle:
    """One server of a run, started on first use (a re-run whose records are all kept starts none), stopped by
    ``close``."""

    def __init__(self, settings, log_path: Path, start_timeout_s: float):
        self.settings, self.log_path, self.start_timeout_s = settings, log_path, start_timeout_s
        self.process: ServerProcess | None = None
        self.base_url = ""
        self.api = settings.api
        self.label = settings.label

    def started(self) -> "ServerHandle":
        if self.process is None:
            self.process, self.base_url = self.settings.process(self.log_path, self.start_timeout_s)
            print(f"[specbench] starting {self.label}: {' '.join(self.process.command[1:])}", file=sys.stderr)
            self.process.start()
        return self

    def check(self) -> None:
        if self.process is not None:
            self.process.check()

    def counters(self) -> dict | None:
        """The server's own speculation totals so far (servers.py), None where it has none."""
        return self.settings.counters(self.base_url) if self.process is not None else None

    def close(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
