"""The environment every record carries (README, *Where results go*): code version, packages, threads, device."""
from __future__ import annotations

import os
import platform
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import torch

PACKAGES = ("specbench", "torch", "transformers", "tokenizers", "accelerate", "hydra-core", "omegaconf")


@lru_cache(maxsize=1)
def git_state() -> dict:
    root = Path(__file__).resolve().parents[1]
    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD") or None,
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def package_versions() -> dict:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def affinity_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def physical_cores(cpus: set[int]) -> int:
    """Distinct physical cores among logical ``cpus`` (SMT siblings share one), from sysfs; len(cpus) without it."""
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topology.joinpath("physical_package_id").read_text().strip(),
                       topology.joinpath("core_id").read_text().strip()))
        except OSError:
            return len(cpus)
    return len(cores) or len(cpus)


def cgroup_cpu_limit() -> int | None:
    """The CPU quota of this process's cgroup (v2 ``cpu.max``, e.g. a container started with --cpus=2), rounded up."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        return None if quota == "max" else max(1, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        return None


def available_cores() -> int:
    """The threads a run uses when ``runner.threads`` is null: ``OMP_NUM_THREADS`` if set, else the physical cores
    among the CPUs this process may run on (its affinity mask; SMT siblings count once, as torch's own default
    does), capped by a cgroup CPU quota. On the 2-vCPU machines here: 2."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"])
    cores = physical_cores(affinity_cpus())
    quota = cgroup_cpu_limit()
    return min(cores, quota) if quota else cores


def environment(device: torch.device) -> dict:
    return {
        "git": git_state(),
        "versions": package_versions(),
        "torch_threads": torch.get_num_threads(),
        "cores_available": available_cores(),
        "device": str(device),
        "device_name": device_name(device),
        "hostname": platform.node(),
    }
