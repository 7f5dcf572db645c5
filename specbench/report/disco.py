"""DISCO's tables come from its pipeline (python -m specbench.training.disco), whose test stage measures every Table 1
row as an ordinary run and writes table1.csv / oracle_sl.json / classifier.json. This turns those files into
table entries: experiment.disco lists the pipeline experiments (conf/disco/<name>), experiment.disco_table
says which table (table1 | table3 | table5), experiment.disco_overrides (optional) are applied to each
pipeline config, e.g. [disco.model=tiny_llama, disco.out_dir=...] to read a run made with those overrides."""
from __future__ import annotations

import csv
import json

from hydra import compose

from ..training.disco.pipeline import output_dirs
from ..training.disco.tables import TABLE1_PLAN
from ..errors import ConfigError
from .tables import Entry

TABLES = ("table1", "table3", "table5")


def disco_entries(spec, extras: dict) -> list[Entry]:
    table = spec.get("disco_table")
    if table not in TABLES:
        raise ConfigError(f"experiment.disco_table: {table!r} is not one of {list(TABLES)}")
    entries = []
    for name in spec.disco:
        d = compose("disco_pipeline", overrides=[f"disco={name}", *(spec.get("disco_overrides") or [])]).disco
        pair = compose("config", overrides=[f"model={d.model}"]).model.name
        keys = {"data.name": d.splits.test.data, "model.name": pair}
        base, out = output_dirs(d)
        todo = f"not run yet: python -m specbench.training.disco disco={name}"
        if table == "table1":
            path = out / "table1.csv"
            if not path.exists():
                entries += [Entry(keys={**keys, "row": row}, status=todo) for row, _ in TABLE1_PLAN]
                continue
            for row in csv.DictReader(path.open()):
                values = {k: float(row[k]) if row.get(k) else None
                          for k in ("ms_per_token", "speedup", "tau", "acceptance_rate", "mean_sl")}
                values["identical"] = f"{row['identical']}/{row['compared']}" if row.get("compared") else \
                    "(baseline)" if row["method"] == "greedy" else "n/a"
                entries.append(Entry(keys={**keys, "row": row["row"]}, values=values))
        elif table == "table3":
            path = out / "oracle_sl.json"
            if not path.exists():
                entries.append(Entry(keys=keys, status=todo))
                continue
            oracle = json.loads(path.read_text())
            entries.append(Entry(keys=keys, values={"oracle_sl": oracle["mean"]}, stds={"oracle_sl": oracle["std"]}))
            extras.setdefault("oracle_sl", {})[f"{keys['data.name']} ({pair})"] = [
                n for seq in oracle["per_prompt"].values() for n in seq]
        else:
            path = base / "classifier.json"
            if not path.exists():
                entries.append(Entry(keys=keys, status=todo))
                continue
            validation = json.loads(path.read_text())["validation"]
            entries.append(Entry(keys=keys, values={"f1_static_sl": 100 * validation["f1_static_sl"],
                                                    "f1_disco": 100 * validation["f1_disco"]}))
    return entries
