"""The environment every record carries (DESIGN §2.7): code version, packages, threads, device."""
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
        return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
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


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask), which a shared machine may restrict."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


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
