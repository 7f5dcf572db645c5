"""``engine=vllm_server``: vLLM's OpenAI-compatible server under load, speculative against itself without speculation.

Two servers are started as separate processes on the pair's checkpoints (engines/checkpoints.py, as engine=vllm
locates them): the baseline (no speculation) and the method's, whose ``--speculative-config`` is the one engine=vllm
gives the same ``method=`` (engines/vllm_methods.py). Everything else is engine=vllm's settings (``VllmEngine``:
dtype, max_model_len, eager or compiled, the CPU KV cache and cores, checked before anything starts) plus the load
every serving engine has (engine.load, engine.slo, engine.slots; load.ServingEngine). Each round is one load level
over the run's prompts, sent to both servers back to back (rounds.py), as token ids encoded by the pair's own
tokenizer and chat template, stopping at the pair's EOS ids.

At T = 0 each output is judged against the baseline server's by engine=vllm's near-tie rule (engines/vllm_lossless.py)
with the log-probabilities read from the baseline server itself (``ServerLogprobs``, untimed): the noise between its
decode steps and its prefill, and the gap at a divergence. vLLM's speculation counters are server-wide; the method
server's totals are read before and after each level (servers.VllmServer.counters) and kept with the level's records.
"""
from __future__ import annotations

from pathlib import Path

import httpx
from omegaconf import DictConfig, OmegaConf

from ...errors import ServerError, require
from ...run.runner import Entry, RunSpec
from ..vllm import VllmEngine
from .load import ServingEngine
from .served_run import ServedRun
from .servers import ServerHandle, VllmServer


# engine arguments the server command sets itself (servers.VllmServer.command), and what sets them
SET_BY_US = {"max_num_seqs": "engine.slots (null: the concurrency level)",
             "generation_config": "always vllm: sampling defaults are vLLM's, not the checkpoint's"}


class VllmServerEngine(ServingEngine, VllmEngine):
    """conf/engine/vllm_server.yaml: engine=vllm's keys (VllmEngine) and the serving ones (ServingEngine)."""

    def __init__(self, name: str = "vllm_server", slots: int | None = None, start_timeout_s: float = 900.0,
                 load: dict | None = None, slo: dict | None = None, **vllm):
        VllmEngine.__init__(self, name=name, **vllm)
        self.slots, self.start_timeout_s = slots, start_timeout_s
        self.load, self.slo = dict(load or {}), dict(slo or {})

    def identity(self, cfg: DictConfig) -> dict:
        """Added to the run key: the servers' settings and the load (numbers differ with both)."""
        return {"engine": OmegaConf.to_container(cfg.engine, resolve=True)}

    def check(self, cfg: DictConfig, pair=None) -> None:
        VllmEngine.check(self, cfg, pair)
        self.check_load(cfg)
        for key, ours in SET_BY_US.items():
            require(key not in self.options, f"engine.options.{key}", f"set by specbench for a served run: {ours}")

    def open(self, cfg: DictConfig, inputs, spec: RunSpec, pair=None) -> "VllmServerRun":
        return VllmServerRun(self, cfg, inputs, spec)


class ServerLogprobs:
    """The log-probabilities the losslessness check reads (engines/vllm_lossless.py), asked of a vLLM server through
    its completions API (token ids in, ``token_id:<id>`` keys out); started on first use, untimed."""

    def __init__(self, handle: ServerHandle, model: str):
        self.handle, self.model = handle, model

    def post(self, body: dict) -> dict:
        server = self.handle.started()
        response = httpx.post(server.base_url + "/v1/completions", json={"model": self.model, **body}, timeout=None)
        if response.status_code != 200:
            raise ServerError(f"{server.label}: a log-probability request failed (HTTP {response.status_code}): "
                              f"{response.text[:300]}")
        return response.json()["choices"][0]

    def decode_logprobs(self, prompt: list[int], positions: int, top: int) -> tuple[list[int], list[dict]]:
        choice = self.post({"prompt": list(prompt), "max_tokens": positions, "temperature": 0.0, "logprobs": top,
                            "return_tokens_as_token_ids": True, "return_token_ids": True})
        steps = [{int(key.removeprefix("token_id:")): lp for key, lp in step.items()}
                 for step in choice["logprobs"]["top_logprobs"]]
        return list(choice["token_ids"]), steps

    def prefill_logprobs(self, sequence: list[int], top: int) -> list[dict | None]:
        choice = self.post({"prompt": list(sequence), "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": top})
        return [None if block is None else {int(t): v["logprob"] for t, v in block.items()}
                for block in choice["prompt_logprobs"]]

    def prompt_logprobs(self, sequences: list[list[int]]) -> list[float]:
        """log p(last token | the ones before) for each sequence, by one prefill each."""
        return [self.prefill_logprobs(s, 1)[-1][s[-1]] for s in sequences]


class VllmServerRun(ServedRun):
    """engine=vllm_server's side of one benchmark: the pair's files and tokenizer, the two servers (started on first
    use), the round backend, the losslessness check on the baseline server; ``close`` stops the servers."""

    def __init__(self, engine: VllmServerEngine, cfg: DictConfig, inputs, spec: RunSpec):
        from ...environment import environment
        from ..checkpoints import PromptCodec
        from ..vllm_lossless import VllmLosslessCheck
        from ..vllm_methods import speculative_config
        from .rounds import ServerBackend

        import torch

        model = OmegaConf.to_container(cfg.model, resolve=True)
        device, files = engine.resolved_device(), engine.files(cfg)
        self.engine, self.threads, self.device, self.level = engine, inputs.threads, device, engine.level(cfg)
        self.precision = engine.precision(cfg)
        codec = PromptCodec.load(files, model)
        is_baseline = inputs.base_spec.key == spec.key
        speculative = None if is_baseline else speculative_config(OmegaConf.to_container(cfg.method, resolve=True),
                                                                  files)
        speculative = engine.drafting(speculative) if speculative is not None else None
        if device == "cpu":  # before any server starts: the weights and KV caches of both must fit
            engine.check_weights_memory(files, drafts=bool(speculative) and speculative.get("model") == files.draft,
                                        engines=1 if is_baseline else 2)
        slots = engine.slots_of(self.level)
        cpu_env = (("VLLM_CPU_KVCACHE_SPACE", str(engine.kv_cache_space_gib)),
                   ("VLLM_CPU_OMP_THREADS_BIND", engine.threads_bind(inputs.threads))) if device == "cpu" else ()

        def server(role: str, config: dict | None) -> ServerHandle:
            settings = VllmServer(
                target=files.target, tokenizer=files.tokenizer, dtype=engine.resolved_dtype(files),
                speculative=config, max_model_len=engine.max_model_len, slots=slots, seed=engine.seed,
                enforce_eager=engine.enforce_eager, prefix_caching=engine.prefix_caching,
                tensor_parallel_size=engine.tensor_parallel_size, pipeline_parallel_size=engine.pipeline_parallel_size,
                gpu_memory_utilization=engine.gpu_memory_utilization / 2 if device == "cuda" else None,
                env=cpu_env, options=tuple(sorted(engine.options.items())), stop_ids=tuple(sorted(codec.eos_ids)))
            log = Path(str(spec.store.path).removesuffix(".jsonl") + f".{role}-server.log")
            return ServerHandle(settings, log, engine.start_timeout_s)

        self.base = server("baseline", None)
        self.method = self.base if is_baseline else server("method", speculative)
        self.label = f" (vllm server, {self.level.label})"
        self.engine_label = f"vllm {engine.version} server"
        env = {**environment(torch.device(device)), "threads": inputs.threads, "engine": self.engine_label,
               "precision": self.precision.as_record(), "model_info": {"target": files.target, "draft": files.draft},
               "load": {**self.level.as_record(), "requests": self.level.requests, "slots": slots}}
        check = None
        if inputs.sampling["temperature"] == 0 and not is_baseline:
            check = VllmLosslessCheck(ServerLogprobs(self.base, self.base.settings.served_name), codec, {
                "files": files, "engine": OmegaConf.to_container(cfg.engine), "threads": inputs.threads,
                "vllm": engine.version, "device": device, "api": "openai server"})
        self.backend = ServerBackend(codec, self.level, inputs.dataset.max_new_tokens, inputs.sampling,
                                     warmup=cfg.runner.warmup,
                                     warmup_max_new_tokens=cfg.runner.warmup_max_new_tokens, config=inputs.config,
                                     chat=inputs.dataset.chat_template, env=env, check=check,
                                     warmup_slots=slots)

    def after(self, method: Entry, records: list, baseline_records) -> dict:
        """How the run was measured, and its serving numbers (served_run.ServedRun.served)."""
        return {"precision": self.precision.as_record(), "dtype": self.precision.dtype, "threads": self.threads,
                "engine": self.engine_label, "device": self.device, **self.served(records, baseline_records)}
