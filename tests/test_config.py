"""Every config group composes; cheap groups instantiate; bad overrides name the key at fault."""

from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from specbench.benchmark import run
from specbench.cli import check_overrides
from specbench.run.components import build, needs_draft_model, spec_for
from specbench.run.config_check import check_components, check_settings
from specbench.errors import ConfigError
from specbench.models.heads.artifact import located, save_head
from specbench.models.heads.draft_head import DraftHead, HeadConfig
from specbench.models.heads.names import head_location
from specbench.models.heads.medusa import MedusaConfig, MedusaHeads, save_medusa
from specbench.paper_tables import read_table
from specbench.retrieval.datastore import tokenizer_identity
from specbench.retrieval.datastore import write as write_datastore
from specbench.retrieval.suffix_array import suffix_array

from .conftest import ROOT, run_cli

CONF = ROOT / "conf"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("method, drafts", [
    ("speculative", True), ("specinfer", True), ("ouroboros", True), ("hf_assisted", True), ("disco", True),
    ("greedy", False), ("eagle", False), ("eagle1", False), ("griffin", False), ("prompt_lookup", False),
    ("lookahead", False), ("swift", False), ("token_recycling", False), ("sam_decoding", False),
    ("sam_speculative", True), ("sam_eagle", False), ("rest", False)])
def test_the_draft_model_loads_only_for_a_method_or_baseline_that_drafts_with_it(method, drafts):
    assert needs_draft_model(composed(f"method={method}")) is drafts
    assert needs_draft_model(composed(f"method={method}", "method@baseline=speculative")) is True


def test_a_pair_built_without_its_draft_has_none():
    pair = build(composed("model=tiny_llama").model, "model", load_draft=False)
    assert pair.draft is None and pair.info["draft"] is None
    assert build(composed("model=tiny_llama").model, "model").draft is not None


@pytest.mark.parametrize("group", ["model", "data", "method", "logger"])
def test_every_option_composes(group):
    assert options(group), f"conf/{group} is empty"
    for name in options(group):
        cfg = composed(f"{group}={name}")
        node = cfg[group]
        assert node._target_.startswith("specbench."), f"{group}/{name} has no specbench _target_"
        OmegaConf.to_container(node, resolve=True)
        if group in ("model", "data", "method"):
            assert node.name, f"{group}/{name} needs a name"


def test_default_config_and_baseline(tmp_path):
    cfg = composed(f"runner.records_dir={tmp_path}")
    check_settings(cfg)
    check_components(cfg)
    assert cfg.model.name == "qwen2.5-coder-1.5b-0.5b"
    assert cfg.baseline.name == "greedy"
    hydra = composed_with_hydra().hydra  # compose drops the hydra node unless asked for it
    assert hydra.job.chdir is False, "runs must not change directory: relative paths are the user's"
    assert str(hydra.run.dir).startswith("runs/") and str(hydra.sweep.dir).startswith("runs/")


@pytest.mark.parametrize("name", ["gsm8k", "humaneval"])
def test_datasets_instantiate_offline(name):
    data = build(composed(f"data={name}", "data.limit=3").data, "data")
    examples = data.examples()
    assert len(examples) == 3 and all(ex.prompt for ex in examples)
    assert data.warmup_example().id not in {ex.id for ex in examples}
    assert data.max_new_tokens == {"gsm8k": 256, "humaneval": 512}[name]


def test_dataset_limit_takes_first_of_fixed_sample():
    data5 = build(composed("data=gsm8k", "data.limit=5").data, "data")
    data3 = build(composed("data=gsm8k", "data.limit=3").data, "data")
    ids5 = [ex.id for ex in data5.examples()]
    assert [ex.id for ex in data3.examples()] == ids5[:3]
    assert len(build(composed("data=gsm8k").data, "data").examples()) == 100


def test_humaneval_is_all_164_in_order():
    ids = [ex.id for ex in build(composed("data=humaneval").data, "data").examples()]
    assert len(ids) == 164 and ids[0] == "HumanEval/0" and ids[-1] == "HumanEval/163"


def test_data_path_override_reads_local_file(tmp_path):
    path = tmp_path / "mini.jsonl"
    path.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "2+2?", "answer": "#### 4"}\n')
    data = build(composed("data=gsm8k", f"data.path={path}").data, "data")
    assert [ex.reference for ex in data.examples()] == ["#### 2", "#### 4"]


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gpt2"])
def test_tiny_pairs_and_methods_instantiate(name, tmp_path):
    cfg = composed(f"model={name}")
    pair = build(cfg.model, "model")
    for method in options("method"):
        if method == "disco":  # needs a trained artifact: without one it names the key and how to get it
            with pytest.raises(ConfigError, match="method.policy.classifier.*specbench.training.disco"):
                build(composed("method=disco").method, "method", pair=pair, temperature=0.0, top_p=1.0, seed=0)
            continue
        node = composed(f"method={method}", f"paths.heads={tmp_path / method}", f"model={name}").method
        located = node._target_ == "specbench.methods.feature_head.FeatureHeadMethod" and head_location(
            node.head, node.heads_dir)
        if located and not Path(located).exists():  # needs a trained head (eagle1 reads the head eagle's saved)
            with pytest.raises(ConfigError,
                               match=r"method\.head: no trained head at .*python -m specbench\.training\.heads"):
                build(node, "method", pair=pair, temperature=0.0, top_p=1.0, seed=0)
            if name == "tiny_gpt2":  # a head drafts for Llama-family targets
                continue
            config = HeadConfig.for_target(pair.target.config, node.kind)
            save_head(located, DraftHead(config).init_weights(), None, {"test": True})
        elif located and name == "tiny_gpt2":
            continue
        fallback = node.get("fallback")
        if name == "tiny_gpt2" and fallback and fallback._target_ == "specbench.methods.feature_head.FeatureHeadMethod":
            with pytest.raises(ConfigError, match=r"method\.fallback\.head: no trained head at "):
                build(node, "method", pair=pair, temperature=0.0, top_p=1.0, seed=0)  # sam_eagle: no head for GPT-2
            continue
        if fallback and fallback._target_ == "specbench.methods.feature_head.FeatureHeadMethod":  # sam_eagle's head
            config = HeadConfig.for_target(pair.target.config, fallback.kind)
            save_head(head_location(fallback.head, fallback.heads_dir), DraftHead(config).init_weights(), None,
                      {"test": True})
        if method == "swift" and name == "tiny_gpt2":  # it runs Llama-layout decoder layers itself
            with pytest.raises(ConfigError, match="method=swift: runs the target's decoder layers itself"):
                build(node, "method", pair=pair, temperature=0.0, top_p=1.0, seed=0)
            continue
        if node._target_ == "specbench.methods.medusa.MedusaMethod":  # needs trained heads
            with pytest.raises(ConfigError,
                               match=r"method\.head: no trained head at .*python -m specbench\.training\.heads"):
                build(node, "method", pair=pair, temperature=0.0, top_p=1.0, seed=0)
            config = MedusaConfig.for_target(pair.target.config, node.kind)
            save_medusa(head_location(node.head, node.heads_dir), MedusaHeads(config), {"test": True})
        if node._target_ == "specbench.methods.engine_only.EngineMethod":  # vLLM's own methods (EAGLE, MTP ...)
            with pytest.raises(ConfigError, match=f"method={method}: runs only with engine=vllm"):
                build(node, "method", pair=pair, temperature=0.0, top_p=1.0, seed=0)
            continue
        if node._target_ == "specbench.methods.rest.Rest":  # needs a datastore built for the pair's tokenizer
            node = composed(f"method={method}", f"paths.datastores={tmp_path / method}", f"model={name}").method
            with pytest.raises(ConfigError, match=r"method\.datastore: no datastore at .*specbench\.retrieval"):
                build(node, "method", pair=pair, temperature=0.0, top_p=1.0, seed=0)
            tokens = np.array([5, 6, 7, -1], np.int32)
            write_datastore(Path(node.datastores_dir) / node.datastore, tokens, suffix_array(tokens),
                            {"tokenizer": tokenizer_identity(pair.tokenizer)})
        obj = build(node, "method", pair=pair, temperature=0.0, top_p=1.0, seed=0)
        # a paper's published run (<method>_spec_bench) runs under the paper's method name, so its rows meet the paper's
        assert obj.name == (method.removesuffix("_spec_bench") if method.endswith("_spec_bench") else method)


def test_every_disco_experiment_composes_with_three_splits():
    experiments = [p.stem for p in (CONF / "disco").glob("*.yaml") if p.stem != "common"]
    assert {"gsm8k", "gsm8k_small", "mbpp", "mbpp_to_humaneval", "cnndm", "alpaca"} <= set(experiments)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for name in experiments:
            exp = OmegaConf.to_container(compose(config_name="disco_pipeline", overrides=[f"disco={name}"]).disco,
                                         resolve=True)
            assert exp["name"] == name and (CONF / "model" / f"{exp['model']}.yaml").exists()
            for split in ("train", "validation", "test"):
                assert (CONF / "data" / f"{exp['splits'][split]['data']}.yaml").exists(), (name, split)
            assert exp["features"]["top_k"] == 10  # the paper's k


def test_hub_pair_offline_error_names_the_pair():
    with pytest.raises(ConfigError, match=r"model\.(tokenizer|target).*vicuna-13b-68m"):
        build(composed("model=vicuna_13b_68m").model, "model")


def test_run_key_ignores_limit_but_not_gamma():
    a = spec_for(composed("data.limit=2"), composed("data.limit=2").method)
    b = spec_for(composed("data.limit=7"), composed("data.limit=7").method)
    c = spec_for(composed("method.gamma=6"), composed("method.gamma=6").method)
    assert a.key == b.key != c.key


def test_unknown_method_is_named():
    with pytest.raises(ConfigCompositionException, match="method/nosuch"):
        composed("method=nosuch")


def test_unknown_pair_is_named():
    with pytest.raises(ConfigCompositionException, match="model/nosuch"):
        composed("model=nosuch")


def test_cli_bad_overrides_fail_with_the_key(tmp_path):
    records = tmp_path / "records"
    cases = {
        ("method=nosuch",): "method",
        ("model=nosuch",): "model",
        ("method.gamma=-1",): "method.gamma",
        ("method.gamma=0",): "method.gamma",
        (f"data.path={tmp_path / 'missing.jsonl'}",): "data.path",
        ("data.limit=0",): "data.limit",
        ("runner.baseline=sometimes",): "runner.baseline",
        ("sampling.temperature=-0.5",): "sampling.temperature",
        ("model.dtype=float64",):
            "model.dtype: unknown dtype 'float64'; valid: ['auto', 'float32', 'bfloat16', 'float16']",
        ("model.device=cuda",): "model.device",
        ("model.device=tpu",): "model.device",
        ("+model.linear_kernel=fastest",): "model.linear_kernel",
        ("runner.pairing=sometimes",): "runner.pairing",
        ("runner.strict_lossless=maybe",): "runner.strict_lossless",
    }
    through_the_cli = {("method=nosuch",), ("model.dtype=float64",)}  # a composition error and a checked value
    for overrides, key in cases.items():
        limit = () if "data.limit=0" in overrides else ("data.limit=1",)
        if overrides in through_the_cli:
            proc = run_cli(*overrides, *limit, records_dir=records, check=False)
            assert proc.returncode != 0, overrides
            assert key in proc.stderr, (overrides, proc.stderr[-2000:])
            continue
        # the others in this process, as `python -m specbench` runs them (its first step, then benchmark.run):
        # starting the CLI costs ~7 s of imports each on 2 cores, and test_bad_input checks what it prints
        with pytest.raises(ConfigError) as caught:
            check_overrides("config", [], ["model=tiny_llama", *overrides])
            run(composed("model=tiny_llama", *overrides, *limit, f"runner.records_dir={records}"))
        assert key in str(caught.value), (overrides, str(caught.value))
    assert not any(records.rglob("*.jsonl")), "a failed configuration must not write records"


TABLE7 = "paper_hparams=ouroboros_table7"


def test_every_ouroboros_table7_cell_composes_and_builds():
    """Every cell of conf/paper/ouroboros_table7.yaml reaches the method it names, on its (data, model) pair."""
    cells = read_table(CONF / "paper" / "ouroboros_table7.yaml")
    assert len(cells) == 48  # 12 (task, pair) rows x speculative / lookahead / ouroboros, and Ouroboros† = ouroboros
    pair = build(composed("model=tiny_llama").model, "model")
    for (data, model, method), values in cells.items():
        cfg = composed(TABLE7, f"method={method}", f"data={data}", f"model={model}").method
        assert {key: cfg[key] for key in values} == values and cfg.name == method
        built = build(cfg, "method", pair=pair, temperature=0.0, top_p=1.0, seed=0)
        assert built.name == method


@pytest.mark.parametrize("method, data, model, expected", [  # Ouroboros Table 7, by hand from the paper
    ("ouroboros", "humaneval", "yi_34b_6b", {"gamma": 12, "window": 20, "beta": 8, "top_k": 3}),
    ("ouroboros_warm", "gsm8k", "llama2_chat_70b_7b", {"gamma": 6, "window": 17, "beta": 7, "top_k": 3}),
    ("speculative", "wmt16", "yi_34b_6b", {"gamma": 2}),
    ("speculative", "humaneval", "deepseek_coder_33b_7b", {"gamma": 3}),
    ("lookahead", "wmt16", "llama2_chat_70b_7b", {"window": 18, "ngram": 7, "guesses": 18}),
    ("lookahead", "humaneval", "codellama_34b_7b_instruct", {"window": 17, "ngram": 5, "guesses": 17}),
    ("ouroboros", "mbpp", "codellama_34b_7b_instruct", {"gamma": 8, "window": 16, "beta": 7, "top_k": 3}),
])
def test_a_table7_cell_resolves_to_the_papers_numbers(method, data, model, expected):
    node = OmegaConf.to_container(composed(TABLE7, f"method={method}", f"data={data}", f"model={model}").method,
                                  resolve=True)
    default = OmegaConf.to_container(composed(f"method={method}").method, resolve=True)
    assert node == {**default, **expected}  # those keys, and nothing else, from the table


def test_a_missing_table7_cell_is_an_error_naming_the_pairs_tasks():
    with pytest.raises(ConfigCompositionException) as err:  # Llama-2 70b/7b has no HumanEval row in Table 7
        composed(TABLE7, "method=ouroboros", "data=humaneval", "model=llama2_chat_70b_7b")
    message = str(err.value)
    assert "Could not find 'paper_hparams/ouroboros_table7/llama2_chat_70b_7b/ouroboros/humaneval'" in message
    assert "\tcnndm\n\tgsm8k\n\twmt16\n" in message  # the tasks that pair has
    with pytest.raises(ConfigCompositionException, match="paper_hparams/ouroboros_table7/yi_34b_6b/speculative/"
                                                         "cnndm_specbench"):  # a subset is not the paper's task
        composed("+experiment=ouroboros_table2", "method=speculative", "data=cnndm_specbench")
    with pytest.raises(ConfigCompositionException, match="Could not find 'paper_hparams/ouroboros_tabel7'"):
        composed("paper_hparams=ouroboros_tabel7")  # a table that does not exist: Hydra lists the ones that do


def test_a_malformed_table_is_refused_naming_the_file_and_key(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("cells: {gsm8k: {yi_34b_6b: {speculative: {gamma: [7]}}}}\n")
    with pytest.raises(ConfigError, match=r"t\.yaml: cells\.gsm8k\.yi_34b_6b\.speculative\.gamma must be a number"):
        read_table(path)
    path.write_text("cells: {gsm8k: {yi_34b_6b: {speculative: {gamma: 7}}}}\nsame_as: {ouroboros_warm: ouroboros}\n")
    with pytest.raises(ConfigError, match=r"same_as\.ouroboros_warm: 'ouroboros' is no column of the table; "
                                          r"columns: \['speculative'\]"):
        read_table(path)


def composed_with_hydra(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


@pytest.mark.parametrize("name", options("experiment"))
def test_every_experiment_composes_with_its_sweep(name):
    cfg = composed_with_hydra(f"+experiment={name}")
    exp = cfg.experiment
    assert exp.name == name and exp.rows and exp.metrics
    if exp.get("pipeline"):
        assert exp.disco and exp.disco_table in ("table1", "table3", "table5")
        return
    assert cfg.hydra.sweeper.params, f"{name} has no sweep"
    assert cfg.model.name  # the paper's pair by default; model=embedded runs it here
    for key, values in cfg.hydra.sweeper.params.items():  # every value of every swept axis composes
        for value in str(values).split(","):
            composed(f"+experiment={name}", f"{key}={value}")


def test_table7_hyper_parameters_apply_only_where_the_paper_has_a_row():
    paper = composed("+experiment=ouroboros_table2", "method=ouroboros_warm", "data=gsm8k").method
    assert (paper.gamma, paper.window, paper.beta, paper.top_k, paper.warm_start) == (4, 15, 7, 3, True)
    spec = composed("+experiment=ouroboros_table2", "method=speculative", "data=wmt16",
                    "model=llama2_chat_70b_7b").method
    assert spec.gamma == 5
    overridden = composed("+experiment=ouroboros_table2", "method=speculative", "data=wmt16", "method.gamma=3")
    assert overridden.method.gamma == 3  # the command line still wins
    embedded = composed("+experiment=ouroboros_table2", "method=ouroboros", "data=gsm8k", "model=embedded").method
    default = composed("method=ouroboros").method
    assert (embedded.gamma, embedded.window, embedded.beta) == (default.gamma, default.window, default.beta)
    assert composed("method=ouroboros", "data=gsm8k", "model=yi_34b_6b").method.window == default.window  # opt-in only
    greedy = composed("+experiment=ouroboros_table2", "method=greedy", "data=humaneval", "model=llama2_chat_70b_7b")
    assert greedy.method == composed("method=greedy").method  # no column of the table: no cell needed


def test_ablation_rows_and_search_and_slurm_configs_compose():
    for row in options("ouroboros_ablation"):
        m = composed("+experiment=ouroboros_table3", f"ouroboros_ablation@method={row}").method
        assert not (m.refinement and not m.candidate_suffixes) and m.gamma == 12
    search = composed_with_hydra("+search=ouroboros_optuna")
    assert search.hydra.sweeper._target_.endswith("OptunaSweeper") and search.objective == "tok_per_s"
    assert set(search.hydra.sweeper.params) == {"method.gamma", "method.window", "method.beta", "method.top_k"}
    slurm = composed_with_hydra("hydra/launcher=slurm")
    assert slurm.hydra.launcher._target_.endswith("SlurmLauncher") and slurm.hydra.launcher.gpus_per_node == 1


def test_griffin_ablation_rows_each_name_their_own_head():
    """GRIFFIN Tables 2, 3, 5: every swept method.head is the head conf/head/<its name>.yaml trains, decoded as its
    kind, and names the run (the report's rows)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        heads = {name: OmegaConf.to_container(compose(config_name="heads", overrides=[f"head={name}"]).head)
                 for name in options("head")}
    for table in ("griffin_table2", "griffin_table3", "griffin_table5"):
        for head in composed_with_hydra(f"+experiment={table}").hydra.sweeper.params["method.head"].split(","):
            cfg = composed(f"+experiment={table}", f"method.head={head}")
            node = located(OmegaConf.to_container(cfg.method, resolve=True))
            assert node["head"] == f"runs/heads/{cfg.model.name}/{head}" and node["name"] == head
            assert heads[head]["name"] == head and heads[head]["kind"] == node["kind"], head
    passes = {name: [s["passes"] for s in h["train"]["stages"]] for name, h in heads.items()}
    assert passes["griffin_wo_tat"] == passes["eagle"] == [1, 1, 1] and passes["griffin_wo_tad"] == [1, 2, 3]
    assert heads["griffin_wo_tad"]["kind"] == "eagle" and heads["griffin_wo_tad"]["train"]["topk_loss_weight"] == 0.5
    assert [heads[f"griffin_top{k}"]["train"]["align_top_k"] for k in ("1", "5", "10", "_na")] == [1, 5, 10, 0]
    assert [heads[f"griffin_tgf_{s}"]["tgf_second"] for s in ("feature", "fused")] == ["feature", "fused"]


@pytest.mark.parametrize("model", ["embedded", "vicuna_7b_68m"])
def test_a_head_named_by_its_name_resolves_as_its_own_method_file_did(model, tmp_path):
    """method=griffin method.head=griffin_top5 is what conf/method/griffin_top5.yaml was: the same head path,
    name and kind, so the same run key; an eagle-kind head (griffin_wo_tad) decodes as eagle; a path stays a path."""
    pair_name = composed(f"model={model}").model.name
    old_griffin_top5 = {  # the resolved method of the removed conf/method/griffin_top5.yaml
        "_target_": "specbench.methods.feature_head.FeatureHeadMethod", "name": "griffin_top5", "kind": "griffin",
        "head": f"runs/heads/{pair_name}/griffin_top5", "top_k": 4, "depth": 4, "max_nodes": 10,
        "local_files_only": True}
    cfg = composed("method=griffin", "method.head=griffin_top5", f"model={model}")
    assert located(OmegaConf.to_container(cfg.method, resolve=True)) == old_griffin_top5
    assert cfg.method.heads_dir == f"runs/heads/{pair_name}" and cfg.method.name == "griffin_top5"
    def resolved(*overrides):
        return located(OmegaConf.to_container(composed(*overrides, f"model={model}").method, resolve=True))

    wo_tad = resolved("method=eagle", "method.head=griffin_wo_tad")
    assert (wo_tad["name"], wo_tad["kind"]) == ("griffin_wo_tad", "eagle")
    assert resolved("method=griffin", "method.head=griffin_wo_tad") == wo_tad  # the head's kind, not the method's
    for default in ("eagle", "griffin"):  # the methods themselves: as before
        node = resolved(f"method={default}")
        assert (node["name"], node["kind"], node["head"]) == (default, default, f"runs/heads/{pair_name}/{default}")
    for path in (str(tmp_path / "griffin_top5"), "org/EAGLE-head"):  # a directory or an id stays as given
        node = resolved("method=griffin", f"method.head={path}")
        assert (node["name"], node["kind"], node["head"]) == ("griffin", "griffin", path)
    keys = set()
    for named in (["method.head=griffin_top5"],  # as the removed file named it: by its path, the run griffin_top5
                  [f"method.head=runs/heads/{pair_name}/griffin_top5", "method.name=griffin_top5"]):
        cfg = composed("method=griffin", *named, f"model={model}", f"runner.records_dir={tmp_path}")
        keys.add(spec_for(cfg, cfg.method).key)
    assert len(keys) == 1  # one run: records measured with the old file are found


def test_pipeline_experiment_is_not_a_single_run(tmp_path):
    proc = run_cli("+experiment=disco_table1", records_dir=tmp_path / "records", check=False)
    assert proc.returncode == 2 and "python -m specbench.training.disco" in proc.stderr


def test_bad_dtype_fails_before_the_embedded_weights_load(tmp_path):
    """model=embedded with a bad dtype: the error comes from validation, not from a load or a conversion."""
    import os
    env_cache = tmp_path / "cache"
    proc = run_cli("model=embedded", "model.dtype=half", "data.limit=1", records_dir=tmp_path / "records", check=False,
                   env={**os.environ, "SPECBENCH_CACHE": str(env_cache)})
    assert proc.returncode == 2 and "model.dtype: unknown dtype 'half'" in proc.stderr
    assert not env_cache.exists(), "nothing was assembled or converted"
