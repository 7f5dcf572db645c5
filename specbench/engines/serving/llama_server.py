"""``engine=llama_server``: llama.cpp's own server under load, speculative against itself without speculation.

Two llama-servers are started on the pair's GGUF files (make llama-server builds the binary from the llama.cpp our
bindings compile): the baseline (no speculation) and the method's, from the same settings but the method's
speculation (``method=`` maps below). Each round is one load level (``engine.load``: a closed-loop concurrency or an
open-loop arrival rate) over the run's prompts, sent to both servers back to back (engines/serving/rounds.py). The
pair is also loaded in-process on llama.cpp (untimed, idle while the servers run): it encodes the prompts the servers
are sent as token ids, decodes their outputs, and at T = 0 judges each output against the baseline's by the same
near-tie rule as our own loops (analysis/lossless.LosslessCheck on the same GGUF and llama.cpp).

``method=`` maps by its config's ``_target_``: greedy → no speculation; speculative → ``--spec-type draft-simple``
with ``--spec-draft-n-max γ``; prompt_lookup → ``--spec-type ngram-simple`` with the lookup n-gram of
``method.max_ngram_size`` tokens and drafts of ``method.num_pred_tokens`` (llama.cpp looks up one n-gram length;
our prompt lookup backs off from max_ngram_size to min_ngram_size: the rows are llama.cpp's method, labelled so).
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ...backends.precision import Precision, precision_of_config
from ...errors import ConfigError, require
from ...run.runner import Entry, RunSpec
from .load import ServingEngine
from .served_run import ServedRun
from .servers import LlamaServer, ServerHandle, llama_server_binary

SPECULATIVE = "specbench.methods.speculative.SpeculativeDecoding"
PROMPT_LOOKUP = "specbench.methods.prompt_lookup.PromptLookup"
GREEDY = "specbench.methods.greedy.Greedy"


def speculation(method: dict) -> dict | None:
    """The llama-server settings of ``method`` (a method config), or None for no speculation; ConfigError naming
    the key for a method llama-server does not have."""
    target = method.get("_target_")
    if target == GREEDY:
        return None
    if target == SPECULATIVE:
        require(method.get("policy") is None, "method.policy",
                "llama-server drafts up to a fixed γ each step; speculation-length policies run with engine=hf")
        gamma = method.get("gamma", 4)
        require(isinstance(gamma, int) and gamma >= 1, "method.gamma",
                f"llama-server needs a number of draft tokens >= 1 (auto is our loops' own), got {gamma!r}")
        return {"spec_type": "draft-simple", "gamma": gamma}
    if target == PROMPT_LOOKUP:
        size_m = method.get("num_pred_tokens", 10)
        require(isinstance(size_m, int) and size_m >= 1, "method.num_pred_tokens",
                f"llama-server drafts a fixed number of tokens, got {size_m!r}")
        return {"spec_type": "ngram-simple", "gamma": size_m, "ngram_size": method.get("max_ngram_size", 3)}
    raise ConfigError(f"method: {target}: engine=llama_server runs method=greedy (no speculation), "
                      "method=speculative (its draft-simple) and method=prompt_lookup (its ngram-simple); other "
                      "methods run on our own loops (engine=hf)")


class LlamaServerEngine(ServingEngine):
    """Settings of conf/engine/llama_server.yaml (comments there); ``check``, ``precision`` and ``open`` as every
    engine (engines/base.Engine)."""

    def __init__(self, name: str = "llama_server", binary: str | None = None, slots: int | None = None,
                 ctx_per_slot: int = 4096, start_timeout_s: float = 300.0, load: dict | None = None,
                 slo: dict | None = None):
        self.name, self.binary, self.slots, self.ctx_per_slot = name, binary, slots, ctx_per_slot
        self.start_timeout_s = start_timeout_s
        self.load = dict(load or {})
        self.slo = dict(slo or {})

    def identity(self, cfg: DictConfig) -> dict:
        """Added to the run key: the server's settings and the load (numbers differ with both)."""
        return {"engine": OmegaConf.to_container(cfg.engine, resolve=True)}

    def check(self, cfg: DictConfig, pair=None) -> None:
        from ...backends.choice import backend_of_config
        from ...run.config_check import METHOD_RUNTIME, SamplingConfig, check_node, check_schema, plain

        check_schema(plain(cfg, "sampling"), SamplingConfig, "sampling")
        for key in ("model", "data", "method", "baseline"):
            check_node(plain(cfg, key), key, METHOD_RUNTIME if key in ("method", "baseline") else {})
        require(cfg.runner.baseline == "auto" and cfg.runner.pairing == "interleaved", "runner.pairing",
                "engine=llama_server times its baseline server level by level beside the method's "
                f"(runner.baseline=auto, runner.pairing=interleaved), got baseline={cfg.runner.baseline}, "
                f"pairing={cfg.runner.pairing}")
        require(backend_of_config(OmegaConf.merge(cfg.model, {"backend": "llamacpp"})).llamacpp, "model",
                f"engine=llama_server serves GGUF files: pair '{cfg.model.get('name')}' has none "
                "(model=embedded, model=gguf, model=tiny_gguf)")
        require(speculation(plain(cfg, "baseline")) is None, "baseline",
                "with engine=llama_server the baseline is the server without speculation (baseline=greedy)")
        method = speculation(plain(cfg, "method"))
        require(method is None or method["spec_type"] != "draft-simple" or plain(cfg, "model").get("draft", True),
                "model.draft", "method=speculative drafts with the pair's draft model: this pair loads none")
        self.check_load(cfg)
        llama_server_binary(self.binary)

    def precision(self, cfg: DictConfig) -> Precision:
        return precision_of_config(OmegaConf.merge(cfg.model, {"backend": "llamacpp"}))

    def open(self, cfg: DictConfig, inputs, spec: RunSpec, pair=None) -> "LlamaServerRun":
        return LlamaServerRun(self, cfg, inputs, spec, pair)


class LlamaServerRun(ServedRun):
    """engine=llama_server's side of one benchmark: the pair in-process (prompts, texts, the near-tie check), the
    two servers (started on first use), the round backend; ``close`` stops the servers."""

    def __init__(self, engine: LlamaServerEngine, cfg: DictConfig, inputs, spec: RunSpec, pair=None):
        from ...analysis.lossless import LosslessCheck
        from ...environment import environment
        from ...run import components
        from .rounds import ServerBackend

        model = OmegaConf.merge(cfg.model, {"backend": "llamacpp"})
        self.pair = pair if pair is not None else components.build(model, "model")
        self.engine, self.threads, self.level = engine, inputs.threads, engine.level(cfg)
        is_baseline = inputs.base_spec.key == spec.key
        method = None if is_baseline else speculation(OmegaConf.to_container(cfg.method, resolve=True))
        slots = engine.slots_of(self.level)
        draft = getattr(self.pair.draft, "path", None)

        def server(role: str, settings: dict | None) -> ServerHandle:
            server_settings = LlamaServer(
                target_gguf=self.pair.target.path, draft_gguf=draft, spec_type=(settings or {}).get("spec_type"),
                gamma=(settings or {}).get("gamma", 4), threads=inputs.threads, slots=slots,
                ctx_per_slot=engine.ctx_per_slot, binary=llama_server_binary(engine.binary),
                ngram_size=(settings or {}).get("ngram_size", 12))
            log = Path(str(spec.store.path).removesuffix(".jsonl") + f".{role}-server.log")
            return ServerHandle(server_settings, log, engine.start_timeout_s)

        self.base = server("baseline", None)
        self.method = self.base if is_baseline else server("method", method)
        self.label = f" (llama-server, {self.level.label})"
        env = {**environment(self.pair.device), "threads": inputs.threads, "engine": "llama-server",
               "precision": self.pair.precision.as_record(), "model_info": self.pair.info,
               "load": {**self.level.as_record(), "requests": self.level.requests, "slots": slots}}
        check = LosslessCheck(self.pair, inputs.threads) if inputs.sampling["temperature"] == 0 else None
        self.backend = ServerBackend(self.pair, self.level, inputs.dataset.max_new_tokens, inputs.sampling,
                                     warmup=cfg.runner.warmup,
                                     warmup_max_new_tokens=cfg.runner.warmup_max_new_tokens, config=inputs.config,
                                     chat=inputs.dataset.chat_template, env=env, check=check,
                                     warmup_slots=slots,
                                     server_counters=draft_counts)

    def after(self, method: Entry, records: list, baseline_records) -> dict:
        """How the run was measured, and its serving numbers (served_run.ServedRun.served)."""
        return {"precision": self.pair.precision.as_record(), "dtype": self.pair.dtype, "threads": self.threads,
                "engine": "llama-server", "device": "cpu", **self.served(records, baseline_records)}


def draft_counts(timeline) -> tuple[int, int]:
    """(drafted, accepted) from llama-server's last event (``timings.draft_n``, ``draft_n_accepted``)."""
    timings = (timeline.server_metrics or {}).get("timings") or {}
    return int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
