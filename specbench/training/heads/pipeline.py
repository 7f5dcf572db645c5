"""The draft-head pipeline: extract → train (every stage) → evaluate, resumable, one head per ``head=`` config.

    python -m specbench.training.heads head=griffin              # every stage (make heads)
    python -m specbench.training.heads head=eagle stage=train    # one stage; earlier outputs are reused
    python -m specbench.training.heads head=griffin stage=train train_stage=2   # one TAT stage (stage 1 must exist)

Outputs under <out_dir>/<model name>/:

    data-<hash>/                 prompts' regenerated answers and the target's features (extract.py); shared by
                                 every head trained on the same prompts, budget and target
    <head name>/train.json       what the head depends on (its config, training settings, data hash)
    <head name>/stage-<j>/       the head after training stage j (an artifact: head.json + head.safetensors)
    <head name>/head.json, head.safetensors   the final head: what ``method.head`` names
    <head name>/history.json     loss and top-1 per step;  evaluation.json  held-out accuracy per depth

Every artifact's head.json carries the sha256 of its weights and where it came from; runs that decode with the
head record that hash (its run key changes when the head does).
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from hydra import compose
from omegaconf import DictConfig, OmegaConf, open_dict

from ...run import components
from ...errors import ConfigError, positive_int, require
from ...models.heads.draft_head import DraftHead, HeadConfig, TargetParts, parameter_count
from ...models.heads.artifact import CONFIG_FILE, WEIGHTS_FILE, load_local, save_head
from ...models.heads.medusa import KINDS as MEDUSA_KINDS
from ...models.heads.medusa import MedusaConfig, MedusaHeads, load_medusa, save_medusa
from ...models.heads.speculators_format import exportable, save_speculators
from .extract import extract, load_sequences
from .eagle3 import chain_accuracy, train_eagle3_stage
from .medusa import evaluate_medusa, train_medusa_stage
from ...data.sharegpt import package_file, training_conversations
from .train import (StageRun, TrainSettings, check_predecessor, draft_vocabulary, evaluate, flushed_denormals,
                    keep_freed_memory, split, target_to_draft, write_json)

STAGES = ("extract", "train", "evaluate", "export")  # export: EAGLE-3 heads of the released layout only
ANSWERS = ("target", "dataset")  # data.answers: the target's greedy regeneration, or the conversations' replies
INITS = ("random", "target_layer")  # head.init: noise, or the target's last decoder layer (DraftHead.init_from_target)


# options added after data and heads were first made, at the value everything had before them: left out of the
# identities, so a data directory or head made before an option existed keeps its hash
PRE_OPTION_VALUES = {"answers": "target", "init": "random", "match": None}


def identity_items(settings: dict, skip=()) -> dict:
    return {k: v for k, v in settings.items()
            if k not in skip and not (k in PRE_OPTION_VALUES and PRE_OPTION_VALUES[k] == v)}


def check_pattern(match) -> None:
    """data.match: null, or a regular expression the training prompts' first turns must contain."""
    if match is None:
        return
    require(isinstance(match, str) and match, "heads.data.match",
            f"must be null or a non-empty regular expression, got {match!r}")
    try:
        re.compile(match)
    except re.error as exc:
        raise ConfigError(f"heads.data.match: {match!r} is not a regular expression ({exc})") from None


def digest(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def plain(node) -> dict:
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def transformers_model(model_cfg: DictConfig) -> DictConfig:
    """The ``model`` config with ``backend: transformers``: a head reads the target's hidden states, which only the
    transformers backend exposes, so ``auto`` means transformers here (so too in the data's identity) and an
    explicit ``llamacpp`` is refused before any model loads."""
    backend = model_cfg.get("backend", "transformers")
    require(backend in ("auto", "transformers"), "model.backend",
            f"draft heads are trained on the target's hidden states, which only the transformers backend gives; "
            f"got {backend!r}, valid: auto or transformers")
    if "backend" in model_cfg:
        with open_dict(model_cfg):
            model_cfg.backend = "transformers"
    return model_cfg


class HeadPipeline:
    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        require(cfg.stage in STAGES + ("all",), "stage", f"must be one of {list(STAGES) + ['all']}, got {cfg.stage!r}")
        answers = cfg.data.get("answers", "target")
        require(answers in ANSWERS, "heads.data.answers", f"must be one of {list(ANSWERS)}, got {answers!r}")
        check_pattern(cfg.data.get("match"))
        self.head_cfg = plain(cfg.head)
        for key in ("name", "kind", "train"):
            require(key in self.head_cfg, f"head.{key}", "missing from the head config (conf/head/*.yaml)")
        require(self.head_cfg.get("init", "random") in INITS, "head.init",
                f"must be one of {list(INITS)}, got {self.head_cfg.get('init')!r}")
        self.settings = self._settings()
        if self.medusa:
            require(all(stage.passes == 1 for stage in self.settings.stages), "head.train.stages",
                    f"{self.head_cfg['kind']} heads train with one pass per step (passes: 1)")
            for key in ("heads", "layers"):
                positive_int(self.head_cfg.get(key, 1), f"head.{key}")
        self.model_cfg = transformers_model(cfg.model)
        self.data = plain(cfg.data)
        self.base = Path(cfg.out_dir) / self.model_cfg.name
        self.data_dir = self.base / f"data-{digest(self.data_identity())}"
        self.head_dir = self.base / self.head_cfg["name"]
        self._pair = None

    @property
    def medusa(self) -> bool:
        """Medusa / Hydra heads (training/heads/medusa.py), not a feature-level draft head."""
        return self.head_cfg["kind"] in MEDUSA_KINDS

    def _settings(self) -> TrainSettings:
        train = dict(self.head_cfg["train"])
        stages = train.get("stages")
        require(isinstance(stages, list) and stages, "head.train.stages", "needs a list of {passes, epochs, lr}")
        for i, stage in enumerate(stages):
            require(isinstance(stage, dict) and set(stage) == {"passes", "epochs", "lr"}, f"head.train.stages[{i}]",
                    f"must have exactly passes, epochs and lr, got {stage!r}")
            require(isinstance(stage["passes"], int) and stage["passes"] >= 1, f"head.train.stages[{i}].passes",
                    f"must be a positive integer, got {stage['passes']!r}")
        try:
            return TrainSettings.from_dict(train)
        except TypeError as exc:
            raise ConfigError(f"head.train: {exc}") from None

    # -- identities ---------------------------------------------------------------------------------------
    def data_identity(self) -> dict:
        return {"model": plain(self.model_cfg), **identity_items(self.data, skip=("batch_size",))}

    def train_identity(self) -> dict:
        head = identity_items(self.head_cfg, skip=("train", "name"))
        return {"head": head, "train": settings_identity(self.settings), "data": self.data_dir.name}

    @property
    def pair(self):
        if self._pair is None:
            self._pair = components.build(self.model_cfg, "model", load_draft=False)  # the head drafts: target only
        return self._pair

    # -- stages -------------------------------------------------------------------------------------------
    def run(self, stage: str) -> None:
        torch.set_num_threads(self.settings.threads or torch.get_num_threads())
        # entered before the model loads: the CPU thread pool the first parallel operation creates inherits it
        with flushed_denormals():
            for name in STAGES:
                if stage in (name, "all"):
                    getattr(self, name)()

    def evaluation_prompts(self) -> list[str]:
        texts = []
        for name in self.data.get("exclude") or []:
            cfg = compose(config_name="config", overrides=[f"data={name}", "data.limit=null"])
            if "sample" in cfg.data:
                cfg.data.sample = None
            for example in components.build(cfg.data, f"heads.data.exclude ({name})").examples():
                texts += list(example.turns)
        return texts

    def extract(self) -> None:
        path = Path(self.data["path"]) if self.data.get("path") else package_file()
        require(path.is_file(), "heads.data.path", f"{path} does not exist (a ShareGPT-format JSON file)")
        given = self.data.get("answers", "target") == "dataset"
        chosen = training_conversations(path, self.data["prompts"], self.evaluation_prompts(),
                                        self.data.get("seed", 0), answers=given, match=self.data.get("match"))
        ids = [hashlib.sha1(t.encode()).hexdigest()[:12] for t, _ in chosen]
        prompts = [(pid, t, a) if given else (pid, t) for pid, (t, a) in zip(ids, chosen)]
        source = "the conversations' own replies" if given else "the target regenerates them (greedy)"
        log(f"[heads] {len(prompts)} training prompts from {path.name} (none overlapping {self.data.get('exclude')}); "
            f"answers: {source}")
        extract(self.pair, prompts, self.data_dir, self.data["max_new_tokens"], self.data["batch_size"],
                self.data["max_prompt_tokens"], self.data_identity(), log)

    def export(self) -> None:
        """The final head in the speculators format (models/heads/speculators_format.py) under <head>/speculators/: what
        vLLM's ``speculative_config`` names as its model. With stage=all, only heads of that layout are written."""
        if not (self.head_dir / CONFIG_FILE).is_file():
            raise ConfigError(f"stage=export: no trained head at {self.head_dir} (run stage=train first)")
        problem = (f"a {self.head_cfg['kind']} head" if self.medusa
                   else exportable(HeadConfig(**json.loads((self.head_dir / CONFIG_FILE).read_text())["config"])))
        if problem:
            require(self.cfg.stage == "all", "stage", f"export writes EAGLE-3 heads of the released layout; "
                    f"{self.head_dir} is {problem}")
            return
        artifact = load_local(self.head_dir, "head")
        target = self.pair.target
        parts = TargetParts.of(target, artifact.draft_ids, torch.float32)
        out = self.head_dir / "speculators"
        save_speculators(out, artifact.build(torch.float32), parts.lm_head_weight, artifact.draft_ids,
                         parts.embed_weight, verifier=target.config._name_or_path or self.model_cfg.name,
                         verifier_architecture=(target.config.architectures or ["LlamaForCausalLM"])[0],
                         max_positions=target.config.max_position_embeddings,
                         provenance={"head": str(self.head_dir), "sha256": artifact.sha256})
        log(f"[heads] speculators format: {out} (vLLM: speculative_config={{\"model\": \"{out}\", "
            "\"method\": \"eagle3\"}; here: method=eagle3 method.head=<that directory>)")

    def train(self) -> None:
        identity = self.train_identity()
        self.head_dir.mkdir(parents=True, exist_ok=True)
        marker = self.head_dir / "train.json"
        if marker.exists() and comparable(json.loads(marker.read_text())) != identity:
            raise ConfigError(f"head: {self.head_dir} holds a head trained with other settings; remove it, or give "
                              f"this one another head.name")
        marker.write_text(json.dumps(identity, indent=1, sort_keys=True))
        only = self.cfg.get("train_stage")
        indices = range(1, len(self.settings.stages) + 1) if only is None else [int(only)]
        require(all(1 <= i <= len(self.settings.stages) for i in indices), "train_stage",
                f"must be 1..{len(self.settings.stages)} (head.train.stages), got {only!r}")
        todo = [i for i in indices if not (self.head_dir / f"stage-{i}" / CONFIG_FILE).exists()]
        for index in sorted(set(indices) - set(todo)):
            log(f"[heads] stage {index}: done ({self.head_dir / f'stage-{index}'})")
        while todo and self._reuse_stage(todo[0], identity):
            todo.pop(0)
        if todo:  # the target loads only when a stage is left to train, and after its predecessor is found
            check_predecessor(self.head_dir, todo[0])
            self._train_stages(todo)
        last = self.head_dir / f"stage-{len(self.settings.stages)}"
        if (last / CONFIG_FILE).exists():
            for name in (WEIGHTS_FILE, CONFIG_FILE):  # weights first: head.json names their hash
                shutil.copyfile(last / name, self.head_dir / (name + ".tmp"))
                (self.head_dir / (name + ".tmp")).replace(self.head_dir / name)
            log(f"[heads] final head: {self.head_dir} (decode: method={self.head_cfg['kind']} "
                f"method.head={self.head_cfg['name']})")

    def _train_stages(self, indices: list[int]) -> None:
        keep_freed_memory()
        if self.medusa:
            return self._train_medusa(indices)
        sequences = load_sequences(self.data_dir)
        pair = self.pair
        target = pair.target
        options = {k: v for k, v in self.head_cfg.items() if k in HEAD_OPTIONS and v is not None}
        config = HeadConfig.for_target(target.config, self.head_cfg["kind"], **options)
        train_set, _ = split(sequences, self.head_cfg.get("holdout", 0.05), self.settings.seed)
        draft_ids = draft_vocabulary(train_set, config.draft_vocab_size, config.vocab_size, pair.eos_ids)
        t2d = target_to_draft(draft_ids, config.vocab_size)
        parts = TargetParts.of(target, draft_ids, torch.float32)
        history = self._history()
        for index in indices:
            stage_dir = self.head_dir / f"stage-{index}"
            check_predecessor(self.head_dir, index)
            head = self._start_head(config, index).to(parts.device)  # trained where the target runs
            began = time.perf_counter()
            if config.kind == "eagle3":  # training-time test, features from the target at train time
                stage, s = self.settings.stages[index - 1], self.settings
                rows = train_eagle3_stage(head, parts, target, train_set, t2d, steps=stage.passes,
                                          epochs=stage.epochs, lr=stage.lr, batch_tokens=s.batch_tokens,
                                          max_length=s.max_length, warmup_steps=s.warmup_steps,
                                          clip_value=s.clip_value, betas=s.betas, seed=s.seed, log=log)
            else:
                run = StageRun(head, parts, self.settings, self.settings.stages[index - 1], index, stage_dir, log)
                rows = run.run(train_set, t2d)
            history[str(index)] = rows
            write_json(self.head_dir / "history.json", history)
            save_head(stage_dir, head, draft_ids, self._provenance(index, sequences, train_set, rows,
                                                                   time.perf_counter() - began))
            (stage_dir / "partial.pt").unlink(missing_ok=True)
            log(f"[heads] stage {index}: saved {stage_dir} ({parameter_count(head) / 1e6:.1f} M parameters)")

    def _train_medusa(self, indices: list[int]) -> None:
        sequences = load_sequences(self.data_dir)
        target = self.pair.target
        options = {k: v for k, v in self.head_cfg.items() if k in MEDUSA_OPTIONS and v is not None}
        config = MedusaConfig.for_target(target.config, self.head_cfg["kind"], **options)
        train_set, _ = split(sequences, self.head_cfg.get("holdout", 0.05), self.settings.seed)
        parts = TargetParts.of(target, None, torch.float32)
        history = self._history()
        for index in indices:
            stage_dir = self.head_dir / f"stage-{index}"
            check_predecessor(self.head_dir, index)
            heads = self._start_medusa(config, index, parts).to(parts.device)
            began = time.perf_counter()
            rows = train_medusa_stage(heads, parts, self.settings, self.settings.stages[index - 1], index, train_set,
                                      float(self.head_cfg.get("decay", 0.8)), log)
            history[str(index)] = rows
            write_json(self.head_dir / "history.json", history)
            save_medusa(stage_dir, heads, self._provenance(index, sequences, train_set, rows,
                                                           time.perf_counter() - began))
            log(f"[heads] stage {index}: saved {stage_dir} ({parameter_count(heads) / 1e6:.1f} M parameters)")

    def _start_medusa(self, config: MedusaConfig, index: int, parts: TargetParts) -> MedusaHeads:
        """Stage 1: new heads (residual blocks zero, Hydra's grounded blocks the identity on h_t: every head starts
        as the target's lm_head on h_t; own lm_heads copy the target's, as Medusa-1 initialises them); later: the
        stage before."""
        if index > 1:
            return load_medusa(str(self.head_dir / f"stage-{index - 1}"), config.kind, key="head").build(torch.float32)
        torch.manual_seed(self.settings.seed)  # the residual blocks' biases
        heads = MedusaHeads(config)
        if config.own_lm_head:
            with torch.no_grad():
                for lm_head in heads.lm_heads:
                    lm_head.weight.copy_(parts.lm_head_weight.float().cpu())
        return heads

    def _reuse_stage(self, index: int, identity: dict) -> bool:
        """Copy stage ``index`` from a sibling head whose training up to that stage is the same as this one's
        (``stage_identity``): GRIFFIN's ablations (top-k, w/o TAT) share stage 1 with griffin. The copy is what
        training would have made (same data, settings and seeds); its head.json still names the head it came from."""
        if index > 1 and not (self.head_dir / f"stage-{index - 1}" / CONFIG_FILE).exists():
            return False
        wanted = stage_identity(identity, index)
        for sibling in sorted(self.base.iterdir()) if self.base.is_dir() else []:
            source, marker = sibling / f"stage-{index}", sibling / "train.json"
            if sibling == self.head_dir or not ((source / CONFIG_FILE).exists() and marker.exists()):
                continue
            if stage_identity(comparable(json.loads(marker.read_text())), index) != wanted:
                continue
            target = self.head_dir / f"stage-{index}"
            staging = target.with_name(target.name + ".tmp")
            for stale in (target, staging):  # a partial.pt of our own, a copy a crash left: the copy replaces them
                shutil.rmtree(stale, ignore_errors=True)
            shutil.copytree(source, staging)
            staging.replace(target)
            history = self._history()
            history[str(index)] = json.loads((sibling / "history.json").read_text()).get(str(index), []) \
                if (sibling / "history.json").exists() else []
            write_json(self.head_dir / "history.json", history)
            log(f"[heads] stage {index}: the same training as {source}; copied, not retrained")
            return True
        return False

    def _history(self) -> dict:
        path = self.head_dir / "history.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def _start_head(self, config: HeadConfig, index: int) -> DraftHead:
        if index == 1:
            head, std = DraftHead(config), self.head_cfg.get("init_std", 0.02)
            if self.head_cfg.get("init", "random") == "target_layer":
                return head.init_from_target(self.pair.target, seed=self.settings.seed, std=std)
            return head.init_weights(seed=self.settings.seed, std=std)
        return load_local(self.head_dir / f"stage-{index - 1}", "head").build(torch.float32)

    def _provenance(self, index, sequences, train_set, rows, seconds) -> dict:
        return {"stage": index, "stages": len(self.settings.stages), "head": self.head_cfg["name"],
                "data": str(self.data_dir), "sequences": len(sequences), "train_sequences": len(train_set),
                "answer_tokens": sum(len(s["ids"]) - s["start"] for s in sequences),
                "steps": len(rows), "seconds": round(seconds, 1), "train": self.head_cfg["train"],
                "torch": torch.__version__}

    def evaluate(self) -> None:
        if self.medusa:
            return self._evaluate_medusa()
        artifact = load_local(self.head_dir, "head")
        sequences = load_sequences(self.data_dir)
        _, held_out = split(sequences, self.head_cfg.get("holdout", 0.05), self.settings.seed)
        parts = TargetParts.of(self.pair.target, artifact.draft_ids, torch.float32)
        t2d = target_to_draft(artifact.draft_ids, artifact.config.vocab_size)
        if artifact.config.kind == "eagle3":
            steps = max(stage.passes for stage in self.settings.stages)
            top1 = chain_accuracy(artifact.build(torch.float32, parts.device), parts, self.pair.target, held_out, t2d,
                                  steps, self.settings.max_length)
            write_json(self.head_dir / "evaluation.json", {"head": str(self.head_dir), "sha256": artifact.sha256,
                                                           "top1_by_unrolled_step": top1})
            log(f"[heads] evaluation ({len(held_out)} held-out sequences): top-1 by unrolled step "
                + ", ".join(f"{x:.2f}" for x in top1))
            return
        result = evaluate(artifact.build(torch.float32, parts.device), parts, held_out, self.settings, t2d)
        coverage = answer_coverage(held_out, artifact.draft_ids)  # unseen answers: training ones are all in it
        result.update({"head": str(self.head_dir), "sha256": artifact.sha256, "draft_vocab_coverage": coverage})
        write_json(self.head_dir / "evaluation.json", result)
        depths = ", ".join(f"{r['top1']:.2f}" for r in result["depths"])
        log(f"[heads] evaluation ({len(held_out)} held-out sequences): top-1 by depth {depths}; expected chain τ "
            f"{result['expected_chain_tau']:.2f}; draft vocabulary covers {coverage:.1%} of held-out answer tokens")


    def _evaluate_medusa(self) -> None:
        artifact = load_medusa(str(self.head_dir), self.head_cfg["kind"], key="head")
        _, held_out = split(load_sequences(self.data_dir), self.head_cfg.get("holdout", 0.05), self.settings.seed)
        parts = TargetParts.of(self.pair.target, None, torch.float32)
        result = evaluate_medusa(artifact.build(torch.float32, parts.device), parts, held_out, self.settings)
        result.update({"head": str(self.head_dir), "sha256": artifact.sha256})
        write_json(self.head_dir / "evaluation.json", result)
        top1 = ", ".join(f"{r['top1']:.2f}" for r in result["heads"])
        log(f"[heads] evaluation ({len(held_out)} held-out sequences): top-1 by head {top1}; expected chain τ "
            f"{result['expected_chain_tau']:.2f}")


# MedusaConfig fields a medusa / hydra head config may set
MEDUSA_OPTIONS = ("heads", "layers", "own_lm_head")

# HeadConfig fields a head config may set
HEAD_OPTIONS = ("intermediate_size", "draft_vocab_size", "fusion", "dual", "tgf_width", "tgf_second", "fc_bias",
                "feature_layers", "layer_norm", "final_norm")


# train settings that say how a run goes, not what it trains: left out of a head's identity
OPERATIONAL_SETTINGS = ("checkpoint_seconds", "threads")


def settings_identity(settings: TrainSettings) -> dict:
    """head.train as a head's identity holds it: every TrainSettings field (defaults filled in, so a knob written
    into the YAML at its default value, or left out, names the same head), less OPERATIONAL_SETTINGS."""
    full = asdict(settings)
    full["betas"] = list(full["betas"])
    return {k: v for k, v in full.items() if k not in OPERATIONAL_SETTINGS}


def comparable(identity: dict) -> dict:
    """A train.json as written by any version (older ones hold head.train as the YAML had it), normalized like
    train_identity; a marker whose settings TrainSettings cannot read compares unequal to every identity."""
    try:
        return {**identity, "train": settings_identity(TrainSettings.from_dict(identity["train"]))}
    except (KeyError, TypeError, ValueError):
        return identity


# train settings that act only in passes >= 2: a stage whose stages so far all have one pass does not depend on them
MULTI_PASS_SETTINGS = ("align_top_k", "topk_loss_weight", "topk_loss_k")


def stage_identity(identity: dict, index: int) -> dict:
    """What a head's stage ``index`` depends on (``train_identity`` cut to it): its architecture and data, the
    stages up to ``index``, and the other training settings, less MULTI_PASS_SETTINGS while every stage so far
    has one pass."""
    train = dict(identity["train"])
    stages = list(train.pop("stages"))[:index]
    if all(stage["passes"] == 1 for stage in stages):
        train = {k: v for k, v in train.items() if k not in MULTI_PASS_SETTINGS}
    return {**identity, "train": {**train, "stages": stages}}


def answer_coverage(sequences: list[dict], draft_ids) -> float:
    """Share of answer tokens the draft vocabulary holds (what a reduced vocabulary can cost at most)."""
    if draft_ids is None:
        return 1.0
    keep = set(draft_ids.tolist())
    answer = [t for s in sequences for t in s["ids"][s["start"]:].tolist()]
    return sum(t in keep for t in answer) / max(len(answer), 1)
