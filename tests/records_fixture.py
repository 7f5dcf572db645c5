"""The fixed runs a redesign is checked against (issue 54: records and summaries identical before and after, field by
field, timings excluded), and the comparison. Not a test: it runs real benchmarks on the embedded pair (llama.cpp),
the tiny Llama pair and the tiny vLLM pair, ~15 minutes on 2 cores.

    python -m tests.records_fixture run /tmp/before        # in a checkout of the commit before
    python -m tests.records_fixture run /tmp/after         # in a checkout of the commit after
    python -m tests.records_fixture compare /tmp/before /tmp/after
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

EMBEDDED = ("model=embedded", "model.backend=llamacpp", "data=humaneval", "data.limit=2", "data.max_new_tokens=48")
TINY = ("model=tiny_llama", "data=humaneval", "data.limit=3", "data.max_new_tokens=24")
VLLM = ("engine=vllm", "model=tiny_llama", "model.hidden_size=128", "engine.kv_cache_space_gib=1",
        "engine.max_model_len=1024", "data=humaneval", "data.limit=3", "data.max_new_tokens=24", "runner.batch_size=2")
RUNS = [  # (folder, overrides): every pairing mode, both backends, the baseline alone, an error file, engine=vllm
    ("emb", (*EMBEDDED, "method=speculative")),
    ("emb", (*EMBEDDED, "method=prompt_lookup", "runner.pairing=separate")),
    ("emb", (*EMBEDDED, "method=token_recycling", "runner.baseline=skip")),
    ("tiny", (*TINY, "method=greedy")),
    ("tiny", (*TINY, "method=speculative", "runner.baseline=skip")),
    ("tiny", (*TINY, "method=specinfer")),
    ("tiny", (*TINY, "method=eagle")),  # no trained head for the tiny pair: the error file
    ("vllm", (*VLLM, "method=speculative")),
]
# what differs from run to run by design: clocks, round ids, the scorer's time, where the records went
NOT_COMPARED = re.compile(r"_s$|_ms$|_s_mean$|^forward_ms$|^step_ms$|speedup|per_s|efficiency|^bound$|_ci95$|^session$"
                          r"|^id$|^git$|^records$|ratio|latency|throughput|^split$|^cost_tables$|^hostname$|^seconds$"
                          r"|^round$|^against$|^records_dir$|^timestamp$|^ms_per_token$")


def run(out: Path) -> None:
    for folder, overrides in RUNS:
        subprocess.run([sys.executable, "-m", "specbench", *overrides, f"runner.records_dir={out / folder}"],
                       check=False)  # a run that fails writes its error file: that is compared too


def load(root: Path) -> dict:
    files = {}
    for path in sorted(root.rglob("*")):
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            rows.sort(key=lambda r: (r.get("prompt_id"), r.get("repeat"), str((r.get("pairing") or {}).get("mode"))))
            files[str(path.relative_to(root))] = rows
        elif path.suffix == ".json":
            files[str(path.relative_to(root))] = json.loads(path.read_text())
    return files


def differences(a, b, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            if NOT_COMPARED.search(str(key)):
                continue
            if key not in a or key not in b:
                out.append(f"{where}.{key}: only {'after' if key in b else 'before'}")
            else:
                out += differences(a[key], b[key], f"{where}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = [f"{where}: {len(a)} vs {len(b)} items"] if len(a) != len(b) else []
        return out + [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {str(a)[:80]!r} vs {str(b)[:80]!r}"]


def compare(before: Path, after: Path) -> list[str]:
    a, b = load(before), load(after)
    out = [f"{name}: only {'after' if name in b else 'before'}" for name in sorted(set(a) ^ set(b))]
    return out + [d for name in sorted(set(a) & set(b)) for d in differences(a[name], b[name], name)]


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        run(Path(sys.argv[2]).resolve())
    else:
        found = compare(Path(sys.argv[2]), Path(sys.argv[3]))
        print("\n".join(found) or "identical (timings, round ids and paths excluded)")
        sys.exit(1 if found else 0)
