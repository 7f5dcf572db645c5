"""The DISCO pipeline (Mamou et al. 2024): extract → train → tune → test, one experiment per conf/disco/*.yaml.

    python -m specbench.training.disco disco=<experiment> [stage=extract|train|tune|test|all]

Every stage reads what the earlier ones wrote and skips finished work, so a stage can be re-run alone and
an interrupted run resumes. Outputs go to <out_dir>/<model>/<name>/:

    features/<split>-<key>.jsonl    per-prompt features and labels (extract; train and validation splits)
    classifier-<hash>.pt (+ .json)  the trained classifier (train); classifier.json names the one in use
    table5.md                       F1 on validation, DISCO vs static SL (train)
    tuning.csv, tuning.json         every candidate's validation latency; the chosen γ, τ/SL_max, ppl (tune)
    table1.md/.csv, table3.md, oracle_sl.json, report.md      the test split's results (test)

(tuning and test outputs in temperature-<T>/ below it when disco.sampling.temperature > 0).

Benchmarks (tuning candidates, the Table 1 rows) are ordinary specbench runs: their records go to
runner.records_dir under their run keys, with the greedy baseline of the same split, and resume.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra import compose
from omegaconf import DictConfig, OmegaConf, open_dict

from ... import benchmark
from ...run import components
from ...errors import ConfigError, require
from ...methods.disco import load_classifier, save_classifier
from ...files import write_json
from ...records.store import run_key, slug
from ...records.schema import SCHEMA_VERSION
from . import tables
from .extract import extract_split, feature_table
from .train import evaluate, train_classifier
from .tune import best_candidate, grid

STAGES = ("extract", "train", "tune", "test")
SPLITS = ("train", "validation", "test")
MEASURED = ("ms_per_token", "speedup", "tau", "acceptance_rate", "identical", "compared", "prompts", "new_tokens")
SYMBOLS = {"method.gamma": "γ", "method.policy.threshold": "τ", "method.policy.sl_max": "SL_max"}


def sampling_temperature(exp) -> float:
    return plain(exp.get("sampling")).get("temperature", 0)  # else the main config's default, 0


def output_dirs(exp) -> tuple[Path, Path]:
    """(<out_dir>/<model>/<name>, where tuning and test results go: the same, or temperature-<T>/ below it)."""
    base = Path(exp.out_dir) / slug(exp.model) / slug(exp.name)
    temperature = sampling_temperature(exp)
    return base, base / f"temperature-{temperature}" if temperature else base


class DiscoPipeline:
    def __init__(self, cfg: DictConfig):
        self.exp = cfg.disco
        for split in SPLITS:
            require(split in self.exp.splits and "data" in self.exp.splits[split], f"disco.splits.{split}",
                    "needs {data: <data config name>, set: {<data fields>}}")
        self.temperature = sampling_temperature(self.exp)
        # features and the classifier do not depend on sampling; tuning and tables do
        self.dir, self.results = output_dirs(self.exp)
        self._pair = None

    # -- configs and data -----------------------------------------------------------------------------
    def run_config(self, split: str, method: str, settings: dict | None = None) -> DictConfig:
        """The main specbench config for one benchmark of ``method`` on ``split`` (+ dotted settings)."""
        spec = self.exp.splits[split]
        cfg = compose(config_name="config", overrides=[f"model={self.exp.model}", f"data={spec.data}",
                                                        f"method={method}"])
        with open_dict(cfg):
            cfg.data = OmegaConf.merge(cfg.data, plain(spec.get("set")))
            if self.exp.max_new_tokens:
                cfg.data.max_new_tokens = self.exp.max_new_tokens
            for group in ("runner", "sampling"):
                cfg[group] = OmegaConf.merge(cfg[group], plain(self.exp.get(group)))
            for key, value in (settings or {}).items():
                OmegaConf.update(cfg, key, value, merge=True)
        return cfg

    @property
    def pair(self):
        if self._pair is None:
            self._pair = components.build(self.run_config("test", "greedy").model, "model")
        return self._pair

    def dataset(self, split: str):
        return components.build(self.run_config(split, "greedy").data, "data")

    def features_path(self, split: str) -> Path:
        cfg = self.run_config(split, "greedy")
        data = OmegaConf.to_container(cfg.data, resolve=True)
        data.pop("limit", None)  # a larger limit extends the same file
        identity = {"schema": SCHEMA_VERSION, "model": OmegaConf.to_container(cfg.model, resolve=True),
                    "data": data, "top_k": self.exp.features.top_k}
        return self.dir / "features" / f"{split}-{run_key(identity)}.jsonl"

    # -- stages ---------------------------------------------------------------------------------------
    def extract(self) -> None:
        splits = ("validation",) if self.exp.classifier.path else ("train", "validation")
        for split in splits:
            dataset = self.dataset(split)
            examples, path = dataset.examples(), self.features_path(split)
            print(f"[disco] extract {split}: {len(examples)} prompts -> {path}", file=sys.stderr)
            extract_split(self.pair, examples, lambda ex: self.pair.encode(ex.prompt, chat=dataset.chat_template),
                          dataset.max_new_tokens, path, self.exp.features.top_k, {"split": split})

    def split_features(self, split: str):
        path = self.features_path(split)
        if not path.exists():
            raise ConfigError(f"disco: no {split} features at '{path}'; run stage=extract first")
        return feature_table(path, {ex.id for ex in self.dataset(split).examples()})

    def train(self) -> Path:
        settings = OmegaConf.to_container(self.exp.classifier, resolve=True)
        given = settings.pop("path")
        if given:  # transfer: a classifier trained elsewhere
            path, classifier, history = Path(given), load_classifier(given, "disco.classifier.path"), {}
        else:
            features, labels, tv = self.split_features("train")
            classifier, losses = train_classifier(features, labels, tv, top_k=self.exp.features.top_k, **settings)
            history = {"train_tokens": len(labels), "train_accepted_fraction": float(labels.float().mean()),
                       "final_loss": losses[-1], "train_f1": evaluate(classifier, features, labels)["f1_disco"]}
        val_features, val_labels, _ = self.split_features("validation")
        evaluation = evaluate(classifier, val_features, val_labels)
        if not given:
            path = save_classifier(classifier, self.dir, {
                "experiment": self.exp.name, "model": self.exp.model, "features": str(self.features_path("train")),
                "classifier": settings, "top_k": self.exp.features.top_k, **history, "validation": evaluation})
        write_json(self.dir / "classifier.json", {"path": str(path), "validation": evaluation, **history})
        (self.dir / "table5.md").write_text(
            tables.table5_markdown(f"Table 5 — {self.exp.name}, validation", evaluation))
        print(f"[disco] classifier: {path} (validation F1 {evaluation['f1_disco']:.3f}, static SL "
              f"{evaluation['f1_static_sl']:.3f})", file=sys.stderr)
        return path

    def classifier_path(self) -> str:
        pointer = self.dir / "classifier.json"
        if not pointer.exists():
            raise ConfigError(f"disco: no trained classifier recorded at '{pointer}'; run stage=train first")
        return json.loads(pointer.read_text())["path"]

    def measure(self, split: str, method: str, settings: dict) -> tuple[dict, list[dict]]:
        """One ordinary benchmark run; returns its summary and this split's records."""
        cfg = self.run_config(split, method, settings)
        summary = benchmark.run(cfg, pair=self.pair)
        records = components.spec_for(cfg, cfg.method).records_for(components.build(cfg.data, "data").examples())
        return summary, records

    def candidates(self) -> dict[str, tuple[str, list[dict]]]:
        t = self.exp.tuning
        classifier = {"method.policy.classifier": self.classifier_path()}
        return {
            "static SL-opt": ("speculative", grid({"method.gamma": list(t.static_gamma)})),
            "DISCO": ("disco", [{**classifier, **c} for c in grid({"method.policy.threshold": list(t.disco_threshold),
                                                                    "method.policy.sl_max": list(t.disco_sl_max)})]),
            "ppl SL-opt": ("ppl_sl", grid({"method.policy.threshold": list(t.ppl_threshold),
                                           "method.policy.sl_max": list(t.ppl_sl_max)})),
        }

    def tune(self) -> dict:
        self.results.mkdir(parents=True, exist_ok=True)
        table, chosen = [], {}
        for family, (method, candidates) in self.candidates().items():
            for settings in candidates:
                summary, _ = self.measure("validation", method, settings)
                table.append({"family": family, "method": method, "settings": settings,
                              **{k: summary.get(k) for k in MEASURED}})
                tables.write_csv(self.results / "tuning.csv",
                                 [{**r, "settings": label(r["settings"], r["method"])} for r in table],
                                 ("family", "method", "settings", *MEASURED))
            chosen[family] = best_candidate([r for r in table if r["family"] == family])["settings"]
            print(f"[disco] {family}: chose {label(chosen[family], method)} on validation", file=sys.stderr)
        write_json(self.results / "tuning.json", {"chosen": chosen, "candidates": table})
        return chosen

    def test(self) -> list[dict]:
        tuning = self.results / "tuning.json"
        if not tuning.exists():
            raise ConfigError(f"disco: no tuning results at '{tuning}'; run stage=tune first")
        chosen = json.loads(tuning.read_text())["chosen"]
        settings = {"static SL-5": {"method.gamma": 5}, **chosen}  # chosen: static SL-opt, DISCO, ppl SL-opt
        plan = [(row, method, settings.get(row, {})) for row, method in tables.TABLE1_PLAN]
        if self.temperature > 0:  # DISCO Table 2: no oracle row
            plan = [step for step in plan if step[1] != "oracle_sl"]
        rows, oracle = [], None
        for row, method, settings in plan:
            summary, records = self.measure("test", method, settings)
            rows.append({"row": row, "method": method, "settings": label(settings, method),
                         **{k: summary.get(k) for k in MEASURED}, "mean_sl": tables.mean_sl(records)})
            if method == "oracle_sl":
                oracle = tables.oracle_statistics(records)
        self.write_report(rows, oracle)
        return rows

    def write_report(self, rows: list[dict], oracle: dict) -> None:
        name = self.exp.name
        self.results.mkdir(parents=True, exist_ok=True)
        tables.write_csv(self.results / "table1.csv", rows, tables.TABLE1_COLUMNS)
        table1 = tables.table1_markdown(f"Table 1 — {name} (test split, {self.exp.model})", rows)
        table3 = (tables.table3_markdown(f"Table 3 — oracle SL, {name} (test split)", oracle) if oracle else
                  "### Table 3\n\nNo oracle at temperature > 0 (it needs the target's greedy output).\n")
        (self.results / "table1.md").write_text(table1)
        (self.results / "table3.md").write_text(table3)
        if oracle:
            write_json(self.results / "oracle_sl.json", oracle)
        table5 = (self.dir / "table5.md").read_text() if (self.dir / "table5.md").exists() else ""
        splits = "\n".join(f"- {s}: data={self.exp.splits[s].data} "
                           f"{json.dumps(plain(self.exp.splits[s].get('set')))}"
                           for s in SPLITS)
        (self.results / "report.md").write_text(f"# DISCO — {name}\n\nModel pair: {self.exp.model}; classifier: "
                                            f"{self.classifier_path()}\n\nSplits:\n{splits}\n\n{table1}\n{table3}\n{table5}")
        print(table1 + "\n" + table3, file=sys.stderr)

    def run(self, stage: str = "all") -> None:
        require(stage in (*STAGES, "all"), "stage", f"{stage!r} is not one of {[*STAGES, 'all']}")
        for name in STAGES if stage == "all" else (stage,):
            getattr(self, name)()
        print(f"[disco] outputs in {self.results}", file=sys.stderr)


def label(settings: dict, method: str = "") -> str:
    """'γ=4' / 'τ=0.5, SL_max=8' / 'ppl_max=3.0, SL_max=8' (the classifier path left out: report.md names it)."""
    symbols = {**SYMBOLS, "method.policy.threshold": "ppl_max"} if method == "ppl_sl" else SYMBOLS
    return ", ".join(f"{symbols.get(k, k.rsplit('.', 1)[-1])}={v}" for k, v in settings.items()
                     if k != "method.policy.classifier")


def plain(node) -> dict:
    """A config node as a resolved plain dict (an absent node as {})."""
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}
