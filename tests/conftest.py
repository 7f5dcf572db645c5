import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import settings

from specbench.cli import register_configs

from .forked import run_module
from .limits import generous

register_configs()  # the tests compose conf/ themselves, as the programs do after registering

ROOT = Path(__file__).resolve().parents[1]
# Spec-Bench / EAGLE question files (not part of the project): SPECBENCH_EXTERNAL_DATA, else ../shared/data
SHARED_DATA = Path(os.environ.get("SPECBENCH_EXTERNAL_DATA") or ROOT.parent / "shared" / "data")

os.environ.setdefault("WANDB_MODE", "disabled")

# Hypothesis: the same examples on every run and machine by default (`make test` on a clean clone passes or fails
# the same way, and a failure is reproduced by re-running it); SPECBENCH_HYPOTHESIS=explore draws new examples each
# run (and keeps failing ones in .hypothesis/), to hunt for cases the fixed draw misses. Tests' own @settings keep
# their example counts and deadlines on top of either profile.
settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("SPECBENCH_HYPOTHESIS", "repeatable"))


def pin_xdist_worker() -> None:
    """Under pytest-xdist (``make test`` runs two workers), each worker and the processes it starts get a share of
    the CPUs of their own: a test then runs as on a machine of that many cores (``runner.threads: null`` resolves
    to them, torch and llama.cpp use that many threads), instead of every worker's threads fighting for all of
    them, where spinning thread pools make everything slower than one worker would."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < count:
        return
    share = set(cpus[int(worker.removeprefix("gw")) % count::count])
    os.sched_setaffinity(0, share)
    import torch

    torch.set_num_threads(len(share))


pin_xdist_worker()


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``--dist loadscope``: a module's tests on one worker, so module-scoped fixtures such as a
    vLLM run are built once): the slow tests on the embedded pair first, so that the longest pieces of work start
    while the other worker takes the rest module by module."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: the slow ones first
# the device the tiny pairs of the equivalence, tree and head tests run on: cuda checks the GPU code path
TEST_DEVICE = os.environ.get("SPECBENCH_TEST_DEVICE", "cpu")


@pytest.fixture(scope="session")
def tiny_llama():
    from specbench.models.tiny import build_tiny_pair
    return build_tiny_pair(name="tiny-llama", arch="llama")


@pytest.fixture(scope="session")
def tiny_gpt2():
    from specbench.models.tiny import build_tiny_pair
    return build_tiny_pair(name="tiny-gpt2", arch="gpt2")


def run_cli(*overrides: str, records_dir: Path, check: bool = True, expect_s: float = 300,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """python -m specbench on a tiny model, records into records_dir, Hydra outputs beside it. ``expect_s``: about
    what the run may take on the reference machine; its limit is ``generous(expect_s)`` (tests/limits.py)."""
    flags = [o for o in overrides if o.startswith("-")]
    overrides = tuple(o for o in overrides if not o.startswith("-"))
    model = [] if any(o.startswith("model=") for o in overrides) else ["model=tiny_llama"]
    # every CLI test demands losslessness: a divergence beyond numerical noise fails the run (exit 3)
    strict = [] if any(o.startswith("runner.strict_lossless") for o in overrides) else ["runner.strict_lossless=true"]
    args = [*flags, *model, f"runner.records_dir={records_dir}", f"hydra.run.dir={records_dir.parent / 'hydra'}",
            f"hydra.sweep.dir={records_dir.parent / 'multirun'}", "runner.progress=false", *strict, *overrides]
    proc = run_module("specbench", *args, timeout=generous(expect_s), env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}")
    return proc
