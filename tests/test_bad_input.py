"""Bad input (issue 14): every bad key or value is one line naming it, before any model loads; records survive a
full disk and Ctrl-C; summaries and record files are written and read safely while other processes use them."""
import errno
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbench import benchmark, environment
from specbench.run import components
from specbench.records import store as records
from specbench.run.config_check import ConfigOnlyPair, check_components, check_settings, construct
from specbench.config_types import Range, problem
from specbench.errors import ConfigError, StorageError, positive_int
from specbench.files import write_json
from specbench.records.store import RecordStore

from .conftest import ROOT, run_cli
from .limits import generous, wait_for

CONF = ROOT / "conf"


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture
def no_model_load(monkeypatch):
    """components.build refuses to build the model pair: a test passing through here proves nothing loaded first."""
    real_build = components.build

    def guarded(node, key, **kwargs):
        assert key != "model", "the model pair was built before the config was checked"
        return real_build(node, key, **kwargs)

    monkeypatch.setattr(components, "build", guarded)


BAD = {  # override(s) -> the start of the one-line error
    "sampling.temperature=abc": "sampling.temperature: must be a number >= 0, got 'abc'",
    "sampling.seed=abc": "sampling.seed: must be an integer, got 'abc'",
    "sampling.top_p=0": "sampling.top_p: must be a number > 0 and <= 1, got 0",
    "runner.threads=true": "runner.threads: must be an integer >= 1 or null, got true",
    "runner.repeats=true": "runner.repeats: must be an integer >= 1, got true",
    "runner.warmup=-1": "runner.warmup: must be an integer >= 0, got -1",
    "+runner.repets=2": "runner.repets: unknown key of runner (did you mean 'repeats'?); valid: baseline,",
    "+method.gama=6": "method.gama: unknown key for specbench.methods.speculative.SpeculativeDecoding (did you mean "
                      "'gamma'?); valid: gamma, name, policy",
    "method=ouroboros method.phrase_draft=no": "method.phrase_draft: must be true or false, got 'no'",
    "+data.limt=2": "data.limt: unknown key for specbench.data.PromptDataset (did you mean 'limit'?); valid: ",
    "+foo=1": "foo: unknown top-level key; valid: baseline, data,",
    # checked before the first job of a sweep (it stopped the whole sweep after the first job measured)
    "objective=speedupp": "objective: unknown summary number (did you mean 'speedup'?); valid: acceptance_rate,",
    "objective=method": "objective: unknown summary number",
    "data.max_new_tokens=many": "data.max_new_tokens: must be an integer, got 'many'",
    "method.gamma=-1": "method.gamma: must be a positive integer (draft tokens per step, γ) or auto, got -1",
    "method=swift method.skip_layers=[5]": "method.skip_layers: the target has 2 decoder layers (0..1); no layer [5]",
    "method=swift method.skip_layers=[0,1]": "method.skip_layers: skips all 2 decoder layers; at least one must run",
    "+method.temperature=0.5": "method.temperature: not a method setting: set by sampling.temperature",
    "method=oracle_sl sampling.temperature=0.5": "sampling.temperature: method 'oracle_sl' uses OracleSL, which "
                                                 "supports temperature 0 only",
    "method=hf_assisted method.schedule=sometimes": "method.schedule: must be one of ['constant',",
    "method=dyn_heur method.policy.persistent=off": "method.policy.persistent: must be true or false, got 'off'",
    "method=confidence_sl +method.policy.treshold=0.3": "method.policy.treshold: unknown key for "
                                                        "specbench.methods.sl_policies.ConfidenceSL (did you mean",
    "method=confidence_sl method.policy.threshold=2": "method.policy.threshold: must be a probability in [0, 1]",
    "method=disco": "method.policy.classifier: DISCO needs a trained classifier",
    "data=mixture_cn +data.components.gsm8k.limt=1": "data.components.gsm8k.limt: unknown key",
    "data=spec_bench data.categories=[qa,poetry]": "data.categories: unknown category poetry; the categories are "
                                                   "mt_bench, translation, summarization, qa, math_reasoning, rag",
    "data=spec_bench data.per_category=0": "data.per_category: must be a positive integer",
    "data=spec_bench data.per_category=2 data.sample=10": "data.per_category: samples each category; it cannot be "
                                                          "combined with data.sample",
    "runner.threads=999": "runner.threads: 999 threads, but this process may use ",
    "runner.oversubscribe=maybe": "runner.oversubscribe: must be true or false, got 'maybe'",
    "data.path=/": "data.path: / is a directory; give a file in it (.jsonl, .jsonl.gz or .json)",
    "baseline.name=5": "baseline.name: must be a string, got 5",
    "model.hidden_size=big": "model.hidden_size: must be an integer, got 'big'",
    "+model.hiden_size=32": "model.hiden_size: unknown key for specbench.models.tiny.build_tiny_pair (did you mean",
    "model.dtype=half": "model.dtype: unknown dtype 'half'",
    "+model.attn_implementation=nosuch": "model.attn_implementation: unknown attention implementation 'nosuch'; "
                                         "valid: auto, eager, ",  # was transformers' traceback after building
    "model.device=tpu": "model.device: 'tpu' is not a device (",  # was a RuntimeError traceback from torch
    "logger=wandb logger.mode=sometimes": "logger.mode: 'sometimes' is not one of",
    "logger=wandb +logger.projekt=x": "logger.projekt: unknown key for specbench.tracking.WandbTracker",
    "model=vicuna_13b_68m model.draft=null": "model: method 'speculative' needs a draft model; pair 'vicuna-13b-68m'",
    "method=specinfer model=vicuna_13b_68m model.draft=null": "model: method 'specinfer' needs a draft model; pair "
                                                              "'vicuna-13b-68m' has none",
    "method=specinfer method.max_nodes=0": "method.max_nodes: must be a positive integer (most tree nodes per step), "
                                           "got 0",
    "method=specinfer method.widths=[2,0]": "method.widths: must be a non-empty list of positive integers",
    "method=specinfer method.widths=[]": "method.widths: must be a non-empty list of positive integers",
    # the tiny pair's vocabulary (259 byte-level tokens) is known from its config, before it loads
    "method=specinfer method.widths=[2,300]": "method.widths: a width of 300 is more children than the vocabulary "
                                              "has tokens (259)",
    "method=prompt_lookup method.max_ngram_size=0": "method.max_ngram_size: must be a positive integer (longest "
                                                    "n-gram matched), got 0",
    "method=prompt_lookup method.min_ngram_size=4": "method.min_ngram_size: must be <= method.max_ngram_size (3), "
                                                    "got 4",
    "method=rest method.max_nodes=0": "method.max_nodes: must be a positive integer (most tree nodes per step), got 0",
    "method=rest paths.datastores=/nonexistent/datastores": "method.datastore: no datastore at "
                                                            "/nonexistent/datastores/tiny-llama/sharegpt (expected "
                                                            "datastore.json, tokens.npy, suffix.npy); build it with "
                                                            "`python -m specbench.retrieval model=<this pair>",
}


@pytest.mark.parametrize("overrides", list(BAD))
def test_bad_values_are_one_line_naming_the_key_before_the_model_loads(overrides, tmp_path, no_model_load):
    model = [] if any(o.startswith("model=") for o in overrides.split(" ")) else ["model=tiny_llama"]
    cfg = composed(*model, *overrides.split(" "), f"runner.records_dir={tmp_path / 'records'}", "data.limit=1")
    with pytest.raises(ConfigError) as caught:
        benchmark.run(cfg)
    message = str(caught.value)
    assert message.startswith(BAD[overrides]), message
    assert "\n" not in message
    assert not list((tmp_path / "records").rglob("*.jsonl")), "no record is written"


@pytest.mark.parametrize("value, annotation, expected", [
    ("no", bool, "must be true or false, got 'no'"),
    (False, bool, None),
    (True, int, "must be an integer, got true"),
    (2, float, None),
    (None, Optional[int], None),
    ("x", Optional[int], "must be an integer or null, got 'x'"),
    ([1, "a"], list[int], "must be a list (items: an integer), got [1, 'a']"),
    ({"a": "b"}, dict[str, int], "must be a mapping (values: an integer), got {'a': 'b'}"),
    ("/tmp/x", Path, None),
    (3, str, "must be a string, got 3 (quote it to pass a string: key='...')"),
    ("fast", Literal["auto", "torch"], "must be one of ['auto', 'torch'], got 'fast'"),
    (0, Annotated[int, Range(ge=1)], "must be an integer >= 1, got 0"),
    ("a.pt", Union[str, ConfigError], None),
    (5, Union[str, ConfigError], "must be a string or ConfigError, got 5"),
])
def test_values_are_checked_against_annotations(value, annotation, expected):
    assert problem(value, annotation) == expected


def test_one_count_check_names_the_key_the_meaning_and_the_value():
    assert positive_int(3, "method.gamma") == 3 and positive_int(None, "method.pool_capacity", optional=True) is None
    with pytest.raises(ConfigError, match=r"^method.window: must be a positive integer \(Jacobi window W\), got True$"):
        positive_int(True, "method.window", "Jacobi window W")
    with pytest.raises(ConfigError, match=r"^data.limit: must be a positive integer or null, got 0$"):
        positive_int(0, "data.limit", optional=True)
    with pytest.raises(ConfigError, match=r"^method.gamma: must be a positive integer, got None$"):
        positive_int(None, "method.gamma")


class NeedsTheModel:
    """A constructor that checks a setting, then reads something only a loaded pair has."""

    def __init__(self, pair, gamma: int = 1):
        positive_int(gamma, "method.gamma")
        self.vocab = pair.target.config.vocab_size


def test_a_constructor_reading_the_loaded_pair_is_checked_up_to_there():
    stand_in = ConfigOnlyPair({"name": "tiny"})
    construct(OmegaConf.create({"_target_": f"{__name__}.NeedsTheModel", "gamma": 2}), "method", pair=stand_in)
    with pytest.raises(ConfigError, match="^method.gamma: must be a positive integer, got 0"):
        construct(OmegaConf.create({"_target_": f"{__name__}.NeedsTheModel", "gamma": 0}), "method", pair=stand_in)


@pytest.mark.parametrize("group", ["model", "data", "method", "logger"])
def test_every_shipped_option_passes_the_checks(group, tmp_path):
    """The checks are strict, so every config the project ships must pass them (on the tiny pair)."""
    names = sorted(p.relative_to(CONF / group).with_suffix("").as_posix() for p in (CONF / group).rglob("*.yaml"))
    assert names
    for name in names:
        if name == "disco":  # needs a trained classifier: refused by name (above)
            continue
        extra = [] if group == "model" else ["model=tiny_llama"]
        cfg = composed(f"{group}={name}", *extra, f"runner.records_dir={tmp_path}", f"paths.heads={tmp_path}")
        check_settings(cfg)
        if group == "model" and name == "gguf":  # needs the paths of the user's files: refused by key
            with pytest.raises(ConfigError, match=r"^model\.target_gguf: pair 'gguf' needs the path"):
                check_components(cfg)
            continue
        heads = ("specbench.methods.feature_head.FeatureHeadMethod", "specbench.methods.medusa.MedusaMethod")
        fallback = cfg.method.get("fallback") or {}
        if group == "method" and (cfg.method._target_ in heads or fallback.get("_target_") in heads):
            key = "method.head" if cfg.method._target_ in heads else "method.fallback.head"  # sam_eagle's EAGLE-2
            with pytest.raises(ConfigError,
                               match=rf"^{key}: no trained head at .*python -m specbench\.training\.heads"):
                check_components(cfg)  # needs a trained head: refused before any model loads
            continue
        if group == "method" and cfg.method._target_ == "specbench.methods.engine_only.EngineMethod":
            with pytest.raises(ConfigError, match=f"method={name}: runs only with engine=vllm"):
                check_components(cfg)
            continue
        if group == "method" and cfg.method._target_ == "specbench.methods.rest.Rest":
            cfg = composed(f"{group}={name}", *extra, f"runner.records_dir={tmp_path}", f"paths.datastores={tmp_path}")
            with pytest.raises(ConfigError,
                               match=r"^method\.datastore: no datastore at .*python -m specbench\.retrieval"):
                check_components(cfg)  # needs a datastore: refused before any model loads
            continue
        check_components(cfg)


@pytest.mark.parametrize("overrides, message", [
    (("sampling.temperature=abc",), "specbench: error: sampling.temperature: must be a number >= 0, got 'abc'"),
    (("+method.gama=6",), "specbench: error: method.gama: unknown key for "
                          "specbench.methods.speculative.SpeculativeDecoding (did you mean 'gamma'?); valid: gamma, "
                          "name, policy"),
    (("method=ouroboros", "method.phrase_draft=no"), "specbench: error: method.phrase_draft: must be true or false, "
                                                     "got 'no'"),
    (("method=specinfer", "method.widths=[2,300]"), "specbench: error: method.widths: a width of 300 is more children "
                                                    "than the vocabulary has tokens (259)"),
    # overrides that do not compose: Hydra's several-line report and exit 1 before, now one line like the others
    (("engine=nosuch",), "specbench: error: In 'config': Could not find 'engine/nosuch'; Available options in "
                         "'engine': hf, llama_server, vllm, vllm_cluster, vllm_server"),
    (("logger.mode=sideways",), "specbench: error: Could not override 'logger.mode'. To append to your config use "
                                "+logger.mode=sideways"),
])
def test_cli_prints_one_line_and_exits_2(overrides, message, tmp_path):
    proc = run_cli(*overrides, records_dir=tmp_path / "records", check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [message]


def test_threads_above_the_cpus_this_process_may_use_are_refused_unless_asked_for(tmp_path, monkeypatch):
    monkeypatch.setattr(environment, "usable_cpus", lambda: 2)
    common = ("model=tiny_llama", f"runner.records_dir={tmp_path}")
    with pytest.raises(ConfigError, match=r"^runner\.threads: 3 threads, but this process may use 2 CPU\(s\) .*valid: "
                                          r"1\.\.2, or null .*add runner\.oversubscribe=true$"):
        check_settings(composed(*common, "runner.threads=3"))
    check_settings(composed(*common, "runner.threads=2"))
    check_settings(composed(*common, "runner.threads=3", "runner.oversubscribe=true"))
    check_settings(composed(*common))  # null: the cores it may use


def test_a_scorer_option_misspelt_or_of_the_wrong_type_is_named_before_loading(tmp_path, no_model_load):
    """A scorer's options are part of the run key: a typo ignored, or a type that fails every prompt's score after
    the run, would cost a re-measurement of everything once fixed."""
    common = ("model=tiny_llama", "data=humaneval", f"runner.records_dir={tmp_path}")
    cases = {"+data.scorer.timeout=30": r"^data\.scorer\.timeout: unknown option of scorer 'humaneval_pass' \(did "
                                        r"you mean 'timeout_s'\?\); valid: .*isolate_network, memory_mb, stop, "
                                        r"timeout_s$",
             "data.scorer.timeout_s=abc": r"^data\.scorer\.timeout_s: must be a number, got 'abc'",
             "data.scorer.isolate_network=1": r"^data\.scorer\.isolate_network: must be true or false, got 1"}
    for override, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            benchmark.run(composed(*common, override))
    with pytest.raises(ConfigError, match=r"^data\.scorer\.use_stemer: unknown option of scorer 'rouge_l' \(did"):
        benchmark.run(composed("model=tiny_llama", "data=alpaca", f"runner.records_dir={tmp_path}",
                               "+data.scorer.use_stemer=false"))


# -- runner.records_dir ------------------------------------------------------------------------------------------

def test_records_dir_that_is_a_file_or_under_a_file_is_named(tmp_path, no_model_load):
    afile = tmp_path / "records.txt"
    afile.write_text("not a directory")
    for where, said in ((afile, f"'{afile}' is a file, not a directory"),
                        (afile / "records", f"cannot write to '{afile / 'records'}' (Not a directory)")):
        with pytest.raises(ConfigError) as caught:
            benchmark.run(composed("model=tiny_llama", f"runner.records_dir={where}"))
        assert str(caught.value).startswith(f"runner.records_dir: {said}; pass runner.records_dir="), str(caught.value)


def test_an_empty_records_dir_is_refused_and_a_tilde_is_the_home_everywhere(tmp_path, monkeypatch, no_model_load):
    """'' would write records into the current directory; '~/recs' was probed under $HOME but written to ./~/recs."""
    with pytest.raises(ConfigError, match=r"^runner\.records_dir: is empty .*; pass runner\.records_dir="):
        benchmark.run(composed("model=tiny_llama", "runner.records_dir=''"))
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = composed("model=tiny_llama", "runner.records_dir='~/recs'")
    check_settings(cfg)
    assert components.spec_for(cfg, cfg.method).store.path.is_relative_to(tmp_path / "recs")


def test_records_dir_without_write_permission_is_named(tmp_path, monkeypatch, no_model_load):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr("specbench.run.config_check.tempfile.mkstemp", refuse)  # as root, chmod would not stop a write
    with pytest.raises(ConfigError, match=r"^runner.records_dir: cannot write to .*\(Permission denied\)"):
        benchmark.run(composed("model=tiny_llama", f"runner.records_dir={tmp_path / 'records'}"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory anyway")
def test_read_only_records_dir_is_named(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match="^runner.records_dir: cannot write to"):
            check_settings(composed("model=tiny_llama", f"runner.records_dir={locked / 'records'}"))
    finally:
        locked.chmod(0o755)


# -- a full disk ---------------------------------------------------------------------------------------------------

class FullDisk:
    """os.write that writes a few bytes of the n-th call on, then fails as a full disk does."""

    def __init__(self, fail_from: int):
        self.calls, self.fail_from, self.write = 0, fail_from, os.write  # the real one (records.os is os)

    def __call__(self, fd, data):
        self.calls += 1
        if self.calls < self.fail_from:
            return self.write(fd, data)
        self.write(fd, data[:7])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_full_disk_while_appending_is_a_storage_error_and_keeps_the_records(tmp_path, monkeypatch):
    store = RecordStore(tmp_path / "run.jsonl")
    store.append({"prompt_id": "a", "repeat": 0})
    with monkeypatch.context() as patch:
        patch.setattr(records.os, "write", FullDisk(fail_from=1))
        with pytest.raises(StorageError,
                           match=r"run.jsonl \(No space left on device\); the records before it are intact"):
            store.append({"prompt_id": "b", "repeat": 0})
    assert [r["prompt_id"] for r in store.load()] == ["a"]
    store.append({"prompt_id": "c", "repeat": 0})  # space freed: without the lock's repair, the cut line is ended first
    assert [r["prompt_id"] for r in store.load()] == ["a", "c"]


FULL_DISK_CLI = """
import errno, os, sys, types
import specbench.records.store as records
calls = [0]
def write(fd, data):
    calls[0] += 1
    if calls[0] < 3:
        return os.write(fd, data)
    os.write(fd, data[:7])
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
proxy = types.ModuleType("os")
proxy.__dict__.update(os.__dict__)
proxy.write = write
records.os = proxy
import runpy
runpy.run_module("specbench", run_name="__main__", alter_sys=True)  # as `python -m specbench <args>`
"""


def test_cli_full_disk_is_one_line_and_the_rerun_resumes(tmp_path):
    records_dir = tmp_path / "records"
    args = ["model=tiny_llama", "method=greedy", "data.limit=3", "data.max_new_tokens=8", "runner.progress=false",
            f"runner.records_dir={records_dir}", f"hydra.run.dir={tmp_path / 'hydra'}"]
    proc = subprocess.run([sys.executable, "-c", FULL_DISK_CLI, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=generous(300))
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("specbench:")]
    assert len(errors) == 1 and "(No space left on device); the records before it are intact" in errors[0]
    assert "Traceback" not in proc.stderr
    (path,) = records_dir.rglob("greedy-*.jsonl")
    assert [r["prompt_index"] for r in RecordStore(path).load()] == [0, 1]
    again = run_cli("method=greedy", "data.limit=3", "data.max_new_tokens=8", records_dir=records_dir)
    assert "resuming, 2 record(s) kept, 1 to run" in again.stderr
    assert [json.loads(line)["prompt_index"] for line in path.read_text().splitlines()] == [0, 1, 2]


# -- Ctrl-C --------------------------------------------------------------------------------------------------------

def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    records_dir = tmp_path / "records"
    args = [sys.executable, "-m", "specbench", "model=tiny_llama", "method=greedy", "data.limit=40",
            "data.max_new_tokens=256", f"runner.records_dir={records_dir}", f"hydra.run.dir={tmp_path / 'hydra'}",
            "runner.progress=false"]
    # SIGINT must reach the child even from a background job (see test_cli's interrupted-run test)
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wait_for(lambda: any(f.stat().st_size for f in records_dir.rglob("greedy-*.jsonl")), proc, "a record written")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=generous(60))
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last == (f"specbench: interrupted; finished records are kept under {records_dir}, "
                    "and re-running the same command resumes")


# -- write_json and RecordStore under concurrency ---------------------------------------------------------------------

def test_write_json_uses_a_temporary_file_of_its_own(tmp_path):
    path = tmp_path / "run.summary.json"
    (tmp_path / "run.summary.json.tmp").mkdir()  # the old fixed temporary name is taken
    write_json(path, {"tok_per_s": 1.0})
    assert json.loads(path.read_text()) == {"tok_per_s": 1.0}
    records = tmp_path / "records.jsonl"
    records.write_text("")  # as the records are made: open() under this process's umask
    assert path.stat().st_mode & 0o777 == records.stat().st_mode & 0o777  # a summary others may read as well


def test_concurrent_write_json_never_fails_and_leaves_one_whole_file(tmp_path):
    path = tmp_path / "run.summary.json"
    failures = []

    def writer(n):
        try:
            for i in range(100):
                write_json(path, {"writer": n, "i": i, "pad": "x" * 2000})
        except Exception as exc:  # noqa: BLE001
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert json.loads(path.read_text())["i"] == 99
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.summary.json"], "no temporary file is left"


def test_failed_write_json_keeps_the_old_file_and_removes_its_temporary(tmp_path, monkeypatch):
    path = tmp_path / "run.summary.json"
    write_json(path, {"version": 1})

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(records.os, "replace", full)
    with pytest.raises(StorageError, match=r"cannot write .*run.summary.json \(No space left on device\)"):
        write_json(path, {"version": 2})
    assert json.loads(path.read_text()) == {"version": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.summary.json"]


def test_load_never_writes_and_the_lock_repairs(tmp_path):
    path = tmp_path / "run.jsonl"
    whole = json.dumps({"prompt_id": "a", "repeat": 0}) + "\n"
    path.write_text(whole + '{"prompt_id": "b", "rep')  # a record being appended (or cut by a crash)
    assert [r["prompt_id"] for r in RecordStore(path).load()] == ["a"]
    assert path.read_text().endswith('"rep'), "a reader must not cut a line another process may be writing"
    with RecordStore(path).lock():  # a writer, holding the lock, may: nobody else is writing
        assert path.read_text() == whole


def test_a_job_that_fails_on_anything_says_why_in_its_cell(tmp_path, monkeypatch, capsys):
    """Not only a ConfigError: a run that fails mid-way (here the engine raising as llama.cpp did past its context)
    writes its error file, which the report shows as the cell's status, and says so at once on stderr (a sweep's
    launcher holds the traceback until the whole sweep ends)."""
    from specbench.run.components import spec_for
    from specbench.engines.hf import HfEngine

    def boom(self, cfg, inputs, spec, pair=None):  # the engine fails once it loads
        raise RuntimeError("llama_decode failed (1) on 1425 tokens")
    monkeypatch.setattr(HfEngine, "open", boom)
    cfg = composed("model=tiny_llama", "data=gsm8k", "data.limit=1", f"runner.records_dir={tmp_path}")
    with pytest.raises(RuntimeError, match="llama_decode failed"):
        benchmark.run(cfg)
    error = json.loads(spec_for(cfg, cfg.method).error_path.read_text())["error"]
    assert error == "RuntimeError: llama_decode failed (1) on 1425 tokens"
    assert "specbench: error: RuntimeError: llama_decode failed" in capsys.readouterr().err
