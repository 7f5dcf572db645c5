"""The engine group (conf/engine/) and what it checks before anything loads; no vLLM needed (vLLM's side is
stubbed where the engine would import it)."""
import builtins
import functools
import os
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import open_dict

import specbench.engines.vllm as vllm_engine
import specbench.engines.vllm_methods as vllm_methods
from specbench.benchmark import run
from specbench.run.components import build, spec_for
from specbench.run.config_check import check_node, check_settings, plain
from specbench.engines.hf import HfEngine
from specbench.engines.vllm import GIB, VllmEngine, core_ranges
from specbench.engines.vllm_methods import ModelFiles, speculative_config
from specbench.errors import ConfigError

from .conftest import ROOT

CONF = ROOT / "conf"
ENGINES = sorted(p.stem for p in (CONF / "engine").glob("*.yaml"))
FILES = ModelFiles(target="/ckpt/target", draft="/ckpt/draft", tokenizer="/ckpt/target", dtype="bfloat16")
VLLM_METHODS = ["draft_model", "eagle", "eagle3", "medusa", "mtp", "ngram", "suffix"]


def composed(*overrides, hydra=False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)


def method(*overrides) -> dict:
    return plain(composed(*overrides), "method")


@pytest.fixture
def no_model_loads(monkeypatch):
    """Building the tiny pair fails the test: what is checked must fail before any model loads."""
    import specbench.models.tiny as tiny

    @functools.wraps(tiny.build_tiny_pair)  # same signature: config checks read it
    def refuse(*args, **kwargs):
        raise AssertionError("a model pair was built before the config error")
    monkeypatch.setattr(tiny, "build_tiny_pair", refuse)


@pytest.fixture
def vllm_stub(monkeypatch):
    """What VllmEngine.check asks of an installed vLLM, without one."""
    monkeypatch.setattr(vllm_engine, "vllm_version", lambda: "0.0-stub")
    monkeypatch.setattr(VllmEngine, "check_options", lambda self: None)
    monkeypatch.setattr(vllm_methods, "installed_methods", lambda: VLLM_METHODS)


# ----- the group composes and its keys are checked -----
def test_every_engine_composes_and_passes_its_check(tmp_path):
    assert {"hf", "vllm", "llama_server", "vllm_server"} <= set(ENGINES)
    for name in ENGINES:
        cfg = composed(f"engine={name}", f"runner.records_dir={tmp_path}")
        check_node(plain(cfg, "engine"), "engine", {})
        check_settings(cfg)
        built = build(cfg.engine, "engine").name  # its file's name, or a variant's (vllm_cluster: vllm)
        assert built == name or (built == name.split("_")[0] and built in ENGINES), (name, built)


def test_vllm_cluster_is_vllm_on_eight_gpus_with_cuda_graphs():
    engine = composed("engine=vllm_cluster").engine
    assert (engine.device, engine.enforce_eager, engine.tensor_parallel_size) == ("cuda", False, 8)
    assert engine.max_model_len == composed("engine=vllm").engine.max_model_len  # the rest as engine=vllm


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_unknown_engine_key_is_named(engine, tmp_path):
    cfg = composed(f"engine={engine}", "+engine.tensor_paralel_size=2", f"runner.records_dir={tmp_path}")
    with pytest.raises(ConfigError, match=r"^engine\.tensor_paralel_size: unknown key") as exc:
        check_settings(cfg)
    if engine == "vllm":
        assert "did you mean 'tensor_parallel_size'" in str(exc.value)


@pytest.mark.parametrize("override, key", [("engine.tensor_parallel_size=0", "engine.tensor_parallel_size"),
                                           ("engine.gpu_memory_utilization=1.5", "engine.gpu_memory_utilization"),
                                           ("engine.device=tpu", "engine.device")])
def test_bad_engine_value_is_named(override, key, tmp_path):
    cfg = composed("engine=vllm", override, f"runner.records_dir={tmp_path}")
    with pytest.raises(ConfigError, match=rf"^{key}: must be "):
        check_settings(cfg)


def test_hf_refuses_batches_before_any_model_loads(tmp_path, no_model_loads):
    cfg = composed("engine=hf", "model=tiny_llama", "runner.batch_size=2", f"runner.records_dir={tmp_path}")
    with pytest.raises(ConfigError, match=r"^runner\.batch_size: engine=hf decodes one request at a time, got 2; "
                                          r"batch sizes above 1 need engine=vllm"):
        HfEngine().check(cfg)
    with pytest.raises(ConfigError, match=r"^runner\.batch_size: engine=hf"):
        run(cfg)  # the whole path: settings, run key, engine check


def test_vllm_only_method_with_hf_fails_before_any_model_loads(tmp_path, no_model_loads):
    cfg = composed("model=tiny_llama", "method=mtp", f"runner.records_dir={tmp_path}")
    with pytest.raises(ConfigError, match=r"^method=mtp: runs only with engine=vllm \(it is vLLM's 'mtp'\)"):
        run(cfg)


# ----- VllmEngine's own checks and settings -----
def test_vllm_missing_is_one_line_saying_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    cfg = composed("engine=vllm", "model=tiny_llama", f"runner.records_dir={tmp_path}")
    with pytest.raises(ConfigError) as exc:
        build(cfg.engine, "engine").check(cfg)
    message = str(exc.value)
    assert message.startswith("engine=vllm: vLLM is not installed") and "`make install-vllm`" in message
    assert "\n" not in message


def test_vllm_broken_install_with_an_empty_message_is_still_a_config_error(monkeypatch):
    real_import = builtins.__import__

    def broken(name, *args, **kwargs):
        if name == "vllm":
            raise OSError()  # a broken shared library: no message at all
        return real_import(name, *args, **kwargs)
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setattr(builtins, "__import__", broken)
    with pytest.raises(ConfigError, match=r"^engine=vllm: vLLM is not installed.*\(OSError: \)$"):
        vllm_engine.vllm_version()


def test_threads_bind(monkeypatch):
    monkeypatch.setattr(vllm_engine, "affinity_cpus", lambda: {0, 1, 2, 3, 4, 5, 6, 7})
    assert VllmEngine().threads_bind(4) == "0-3"
    assert VllmEngine(tensor_parallel_size=2).threads_bind(2) == "0-1|2-3"
    assert VllmEngine(tensor_parallel_size=2).threads_bind(8) == "0-3|4-7"  # more asked than there are: split
    assert VllmEngine(cpu_threads_bind="2-5").threads_bind(4) == "2-5"  # an explicit list as it is


def test_core_ranges():
    assert core_ranges([0, 1, 2, 5]) == "0-2,5"
    assert core_ranges([7, 3, 4]) == "3-4,7"
    assert core_ranges([6]) == "6"


def test_cpu_environment_is_set_while_starting_and_restored(monkeypatch):
    monkeypatch.setattr(vllm_engine, "affinity_cpus", lambda: {0, 1, 2, 3})
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "40")
    with VllmEngine(device="cpu", kv_cache_space_gib=3).environment(threads=2) as names:
        assert names == {"VLLM_CPU_KVCACHE_SPACE": "3", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "40"


def test_kv_cache_larger_than_free_memory_is_named(monkeypatch):
    monkeypatch.setattr(vllm_engine, "available_memory", lambda: 3 * GIB)
    VllmEngine(kv_cache_space_gib=2).check_memory(None, engines=1)
    with pytest.raises(ConfigError, match=r"^engine\.kv_cache_space_gib: 2 GiB x 2 engine\(s\) = 4\.0 GiB of KV "
                                          r"cache is more than this machine's free memory \(3\.0 GiB\)"):
        VllmEngine(kv_cache_space_gib=2).check_memory(None, engines=2)


def test_vllm_check_reaches_the_memory_check_on_cpu(monkeypatch, tmp_path, vllm_stub):
    monkeypatch.setattr(vllm_engine, "available_memory", lambda: 3 * GIB)
    cfg = composed("engine=vllm", "engine.device=cpu", "model=tiny_llama", f"runner.records_dir={tmp_path}")
    with pytest.raises(ConfigError, match=r"^engine\.kv_cache_space_gib: 2 GiB x 2 engine\(s\)"):
        build(cfg.engine, "engine").check(cfg)  # baseline and method: two engines
    cfg = composed("engine=vllm", "engine.device=cpu", "engine.kv_cache_space_gib=1", "model=tiny_llama",
                   f"runner.records_dir={tmp_path}")
    build(cfg.engine, "engine").check(cfg)


def header_only_checkpoint(path, parameters: int):
    """A safetensors file holding only its header (what checkpoint_parameters reads): a pair's size without weights."""
    import json
    import struct

    path.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [parameters], "data_offsets": [0, 4 * parameters]}}).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return str(path)


def test_the_embedded_pair_in_float32_on_24_gib_is_refused_naming_what_to_set(monkeypatch, tmp_path):
    """The embedded pair's converted checkpoints (1.78B and 0.63B parameters) as float32 need ~26 GiB for the
    baseline and speculative engines; a 24 GiB machine had 22.3 GiB available and the method engine's worker was
    killed mid-run. Now one line before any engine starts, naming the settings that would fit."""
    files = ModelFiles(target=header_only_checkpoint(tmp_path / "t", 1_777_088_000),
                       draft=header_only_checkpoint(tmp_path / "d", 630_167_424), tokenizer="-", dtype="float32")
    monkeypatch.setattr(vllm_engine, "available_memory", lambda: int(22.3 * GIB))
    with pytest.raises(ConfigError, match=r"^engine: 2 vLLM engine\(s\) on this pair's float32 weights need ~26 GiB "
                                          r".* MemAvailable is 22\.3 GiB: set engine\.dtype=bfloat16 \(~15 GiB"):
        VllmEngine(kv_cache_space_gib=2).check_weights_memory(files, drafts=True, engines=2)
    VllmEngine(kv_cache_space_gib=2).check_weights_memory(files, drafts=False, engines=1)  # greedy alone fits
    VllmEngine(dtype="bfloat16", kv_cache_space_gib=2).check_weights_memory(files, drafts=True, engines=2)
    monkeypatch.setattr(vllm_engine, "available_memory", lambda: int(5 * GIB))
    with pytest.raises(ConfigError, match="set model= a smaller pair"):
        VllmEngine(kv_cache_space_gib=2).check_weights_memory(files, drafts=True, engines=2)


def test_vllm_measure_checks_the_weights_before_starting_an_engine(monkeypatch, tmp_path, vllm_stub):
    from specbench.engines.checkpoints import locate

    cfg = composed("engine=vllm", "engine.device=cpu", "engine.kv_cache_space_gib=1", "model=tiny_llama",
                   "method=speculative", "data=humaneval", "data.limit=1", f"runner.records_dir={tmp_path}")
    files = locate(plain(cfg, "model"))
    weights = sum(vllm_engine.checkpoint_parameters(p) for p in (files.target, files.target, files.target,
                                                                 files.draft)) * 4
    monkeypatch.setattr(vllm_engine, "available_memory", lambda: 2 * GIB + weights // 2)  # the KV caches fit
    monkeypatch.setattr(VllmEngine, "start", lambda *a, **k: pytest.fail("an engine started"))
    with pytest.raises(ConfigError, match=r"^engine: 2 vLLM engine\(s\) on this pair's float32 weights"):
        run(cfg)


def test_unknown_engine_option_is_named():
    pytest.importorskip("vllm")
    with pytest.raises(ConfigError, match=r"^engine\.options\.max_num_seqz: not a vllm\.LLM / EngineArgs keyword"):
        VllmEngine(options={"max_num_seqz": 8}).check_options()
    with pytest.raises(ConfigError, match=r"^engine\.options\.seed: set by specbench"):
        VllmEngine(options={"seed": 1}).check_options()
    VllmEngine(options={"max_num_seqs": 8}).check_options()


# ----- method= mapped to vLLM's speculative_config -----
@pytest.fixture
def installed(monkeypatch):
    monkeypatch.setattr(vllm_methods, "installed_methods", lambda: VLLM_METHODS)


def test_greedy_is_no_speculation(installed):
    assert speculative_config(method("method=greedy"), FILES) is None


def test_speculative_is_a_draft_model_with_gamma_tokens(installed):
    assert speculative_config(method("method=speculative", "method.gamma=6"), FILES) == {
        "method": "draft_model", "model": "/ckpt/draft", "num_speculative_tokens": 6}


def test_prompt_lookup_is_ngram(installed):
    config = speculative_config(method("method=prompt_lookup", "method.max_ngram_size=4", "method.min_ngram_size=2",
                                       "method.num_pred_tokens=7"), FILES)
    assert config == {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    # vLLM's proposer is the earliest occurrence of the longest n-gram: the other rules are not what it runs
    for other in ("recent", "earliest_whole"):
        with pytest.raises(ConfigError, match=r"^method\.occurrence: vLLM's ngram proposer takes the earliest"):
            speculative_config(method("method=prompt_lookup", f"method.occurrence={other}"), FILES)


def test_suffix_is_vllms_suffix_decoding_with_the_same_trees(installed):
    """method=suffix is our own loop's class; under engine=vllm its settings become vLLM's suffix_decoding_*."""
    assert speculative_config(method("method=suffix"), FILES) == {
        "method": "suffix", "num_speculative_tokens": 24, "suffix_decoding_max_tree_depth": 24,
        "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1,
        "suffix_decoding_max_cached_requests": 10000}
    config = speculative_config(method("method=suffix", "method.max_depth=32", "method.max_tree_nodes=8",
                                       "method.max_spec_factor=2.5", "method.min_token_prob=0.2",
                                       "method.max_cached_requests=0"), FILES)
    assert config == {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 32,
                      "suffix_decoding_max_spec_factor": 2.5, "suffix_decoding_min_token_prob": 0.2,
                      "suffix_decoding_max_cached_requests": 0}
    with pytest.raises(ConfigError, match=r"^method\.min_match: vLLM's suffix decoding matches suffixes from 1 token"):
        speculative_config(method("method=suffix", "method.min_match=2"), FILES)


def test_speculation_length_policy_has_no_vllm_counterpart(installed):
    with pytest.raises(ConfigError, match=r"^method\.policy: vLLM's draft-model speculation drafts a fixed γ"):
        speculative_config(method("method=dyn_heur"), FILES)


def test_method_without_vllm_counterpart_lists_what_vllm_has(installed):
    with pytest.raises(ConfigError, match=r"^method=lookahead: vLLM has no counterpart of "
                                          r"specbench\.methods\.lookahead\.Lookahead; with engine=vllm: greedy, "
                                          r"speculative \(fixed γ\), prompt_lookup, eagle"):
        speculative_config(method("method=lookahead"), FILES)


def test_eagle_needs_a_published_head(installed, tmp_path):
    with pytest.raises(ConfigError, match=r"^method\.head: vLLM's eagle needs a draft head made for this target"):
        speculative_config(method("method=eagle", "method.head=null"), FILES)
    assert speculative_config(method("method=eagle", "method.head=org/eagle-head"), FILES) == {
        "method": "eagle", "num_speculative_tokens": 4, "model": "org/eagle-head"}
    (tmp_path / "head.json").write_text("{}")  # a head trained here: specbench's format, not vLLM's
    with pytest.raises(ConfigError, match=r"^method\.head: .* is a head trained here \(specbench format\)"):
        speculative_config(method("method=eagle", f"method.head={tmp_path}"), FILES)
    with pytest.raises(ConfigError, match=r"^method\.kind: vLLM has no GRIFFIN drafting"):
        speculative_config(method("method=griffin"), FILES)


def test_eagle3_is_ours_on_hf_and_vllms_eagle3_with_a_published_head(installed, tmp_path):
    """method=eagle3 was an engine=vllm-only EngineMethod; it is now our FeatureHeadMethod with an eagle3 head
    (trained here, engine=hf), and under engine=vllm it maps to vLLM's eagle3 with a published head."""
    assert method("method=eagle3")["_target_"] == "specbench.methods.feature_head.FeatureHeadMethod"
    assert method("method=eagle3")["kind"] == "eagle3"
    assert speculative_config(method("method=eagle3", "method.head=yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"), FILES) == {
        "method": "eagle3", "num_speculative_tokens": 4, "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}
    with pytest.raises(ConfigError, match=r"^method\.head: vLLM's eagle3 needs a draft head made for this target"):
        speculative_config(method("method=eagle3", "method.head=null"), FILES)
    (tmp_path / "head.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"^method\.head: .* is a head trained here \(specbench format\); vLLM "
                                          r"loads EAGLE3 heads"):
        speculative_config(method("method=eagle3", f"method.head={tmp_path}"), FILES)


def test_medusa_is_ours_on_hf_and_vllms_medusa_with_a_published_head(installed, tmp_path):
    """method=medusa was an engine=vllm-only EngineMethod; it is now our MedusaMethod (heads trained here, engine=hf),
    and under engine=vllm it maps to vLLM's medusa with a published head, as method=eagle does."""
    assert method("method=medusa")["_target_"] == "specbench.methods.medusa.MedusaMethod"
    assert speculative_config(method("method=medusa", "method.head=FasterDecoding/medusa-vicuna-7b-v1.3"), FILES) == {
        "method": "medusa", "num_speculative_tokens": 4, "model": "FasterDecoding/medusa-vicuna-7b-v1.3"}
    (tmp_path / "head.json").write_text("{}")  # heads trained here: specbench's format, not vLLM's
    with pytest.raises(ConfigError, match=r"^method\.head: .* is a head trained here \(specbench format\)"):
        speculative_config(method("method=medusa", f"method.head={tmp_path}"), FILES)
    with pytest.raises(ConfigError, match=r"^method\.kind: vLLM has no Hydra drafting"):
        speculative_config(method("method=hydra"), FILES)


def test_method_the_installed_vllm_lacks_lists_the_installed_ones(monkeypatch):
    monkeypatch.setattr(vllm_methods, "installed_methods", lambda: ["draft_model", "ngram"])
    # method=suffix is our own class (no engine_method key): the error names method, as for speculative below
    with pytest.raises(ConfigError, match=r"^method: the installed vLLM has no speculative method "
                                          r"'suffix'; it has: draft_model, ngram$"):
        speculative_config(method("method=suffix"), FILES)
    with pytest.raises(ConfigError, match=r"^method\.engine_method: the installed vLLM has no speculative method "
                                          r"'mtp'; it has: draft_model, ngram$"):  # vLLM's own methods name the key
        speculative_config(method("method=mtp"), FILES)
    monkeypatch.setattr(vllm_methods, "installed_methods", lambda: ["eagle"])
    with pytest.raises(ConfigError, match=r"^method: the installed vLLM has no speculative method 'draft_model'; "
                                          r"it has: eagle$"):  # speculative has no engine_method key to name
        speculative_config(method("method=speculative"), FILES)


# ----- Slurm and run identity -----
@pytest.mark.parametrize("overrides, gpus", [(["engine=vllm", "engine.tensor_parallel_size=4"], 4),
                                             (["engine=vllm_cluster"], 8), (["engine=hf"], 1)])
def test_slurm_vllm_launcher_asks_for_the_engines_gpus(overrides, gpus):
    cfg = composed(*overrides, "hydra/launcher=slurm_vllm", "hydra.launcher.partition=gpu", hydra=True)
    assert cfg.hydra.launcher.gpus_per_node == gpus
    launcher = instantiate(cfg.hydra.launcher)  # as Hydra builds it: these are what sbatch gets
    assert type(launcher).__name__ == "SlurmLauncher"
    params = launcher.params
    assert (params["gpus_per_node"], params["nodes"], params["partition"]) == (gpus, 1, "gpu")


def test_hf_adds_nothing_to_the_run_key():
    cfg = composed("engine=hf")
    before_engines = composed()
    with open_dict(before_engines):
        del before_engines["engine"]
        del before_engines.runner["batch_size"]
    assert spec_for(cfg, cfg.method).key == spec_for(before_engines, before_engines.method).key


def test_vllm_run_key_depends_on_batch_size_and_engine():
    keys = [spec_for(cfg, cfg.method).key for cfg in (composed("engine=vllm", "runner.batch_size=1"),
                                                       composed("engine=vllm", "runner.batch_size=2"),
                                                       composed("engine=vllm", "engine.tensor_parallel_size=2"),
                                                       composed("engine=hf"))]
    assert len(set(keys)) == 4, keys
