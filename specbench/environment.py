"""The environment every record carries (docs/design.md, *Where results go*): code version, packages, threads,
device."""
from __future__ import annotations

import os
import platform
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import torch

from .errors import require

PACKAGES = ("specbench", "torch", "transformers", "tokenizers", "accelerate", "hydra-core", "omegaconf")
# the CPU flags that decide a bf16 / int8 forward's speed (oneDNN's kernels): two machines both called
# "AMD EPYC" by a KVM guest differ here, and in family / model
SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
               "amx_bf16", "amx_int8")


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
    return cpu_identity()["name"]


@lru_cache(maxsize=1)
def cpu_identity() -> dict:
    """This machine's CPU (``identity_of_cpuinfo`` of /proc/cpuinfo), read once per process."""
    try:
        return identity_of_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return identity_of_cpuinfo("")


def identity_of_cpuinfo(cpuinfo: str) -> dict:
    """What tells CPUs of one marketing name apart: vendor, family / model / stepping, the speed-deciding flags
    present (SPEED_FLAGS) and torch's kernel capability, from /proc/cpuinfo's text."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip() and fields:
            break  # the first processor's block describes them all
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return {"name": fields.get("model name") or platform.processor() or platform.machine(),
            "vendor": fields.get("vendor_id"), "family": fields.get("cpu family"), "model": fields.get("model"),
            "stepping": fields.get("stepping"), "flags": [flag for flag in SPEED_FLAGS if flag in flags],
            "torch_capability": torch.backends.cpu.get_cpu_capability()}


def cpu_signature(cpu: dict) -> str:
    """One line for reports: 'AMD EPYC (family 25 model 17; avx512_bf16 ...; torch AVX512)'."""
    where = f"family {cpu.get('family')} model {cpu.get('model')}" if cpu.get("family") else None
    flags = " ".join(cpu.get("flags") or []) or "no AVX2"
    details = "; ".join(x for x in (where, flags, f"torch {cpu.get('torch_capability')}") if x)
    return f"{cpu.get('name')} ({details})"


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


def usable_cpus() -> int:
    """The logical CPUs this process may run on (its affinity mask), capped by a cgroup CPU quota."""
    quota = cgroup_cpu_limit()
    cpus = len(affinity_cpus())
    return min(cpus, quota) if quota else cpus


def check_threads(threads: int | None, oversubscribe: bool, key: str = "runner.threads",
                  oversubscribe_key: str = "runner.oversubscribe") -> None:
    """More compute threads than CPUs to run them on time the scheduler, not the method (999 threads on 2 cores
    took a load average of 188 and 90 s for 2 tokens): a ConfigError before anything loads, unless the user asks
    for it by name (``oversubscribe``)."""
    usable = usable_cpus()
    require(threads is None or oversubscribe or threads <= usable, key,
            f"{threads} threads, but this process may use {usable} CPU(s) (affinity mask"
            f"{', cgroup quota' if cgroup_cpu_limit() else ''}); valid: 1..{usable}, or null for the cores it may "
            f"use ({available_cores()}); to oversubscribe on purpose, add {oversubscribe_key}=true")


def environment(device: torch.device) -> dict:
    return {
        "git": git_state(),
        "versions": package_versions(),
        "torch_threads": torch.get_num_threads(),
        "cores_available": available_cores(),
        "device": str(device),
        "device_name": device_name(device),
        "cpu": cpu_identity(),  # also on a GPU: the host's CPU runs the loop and the launches
        "hostname": platform.node(),
    }
