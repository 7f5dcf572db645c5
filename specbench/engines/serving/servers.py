"""The servers the harness starts: how each is launched on 127.0.0.1, where it answers health checks, and which API
adapter (client.py) talks to it. Each is launched with and without speculation from the same settings, so the
speculative server and its baseline differ in nothing else.

- ``LlamaServer``: llama.cpp's ``llama-server`` (``make llama-server`` builds it from the llama.cpp our bindings
  compile), the pair's GGUF files, speculation by its draft model (``--spec-type draft-simple``, ``--spec-draft-n-max
  γ``) or by n-grams of the context (``ngram-*``, no draft model); ``--parallel`` slots = the most requests it
  decodes at once (the highest concurrency level), one shared context of ``ctx_per_slot`` tokens each.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ...conf_dir import CONF
from ...errors import ConfigError, require
from .client import LlamaServerCompletion
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

    def process(self, log_path: Path, start_timeout_s: float = 300.0) -> tuple[ServerProcess, str]:
        """The server as a process on a free port (not started) and its base URL."""
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        label = f"{self.name}{' (' + self.spec_type + ')' if self.spec_type else ''}"
        return ServerProcess(label, self.command(port), base + "/health", log_path,
                             start_timeout_s=start_timeout_s), base

    api = LlamaServerCompletion()
