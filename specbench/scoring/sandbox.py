"""Run model-written Python in a separate, limited process. Executing that code is a security boundary.

Layers (each recorded in the result's ``isolation``):
- a new process in its own session/process group; on timeout, and after every run, the whole group
  is killed; a wall-clock timeout bounds every run;
- resource limits: address space, CPU seconds, file size, open files, processes, no core dumps;
- a fresh temporary directory as working directory, HOME and TMPDIR, deleted afterwards; stdin empty;
  an environment holding nothing of the harness's (``python -I -S``: no site-packages, no PYTHON*
  variables, the base interpreter's standard library only);
- a network namespace with no interfaces where the kernel allows unshare(2);
- a Python audit hook (``sandbox_guard.py``) refusing process creation, signals, sockets, ctypes, file
  changes outside the temporary directory, and reads of the harness's directories.

What it is not: a defence against code written to escape on purpose (the audit hook lives in the same
interpreter as the program). Benchmarks that execute untrusted code at scale belong in a container or VM
as a whole; this boundary keeps ordinary model mistakes (loops, forks, huge allocations, deleting or
overwriting files, network calls) from harming the harness or its records.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

GUARD_SOURCE = (Path(__file__).with_name("sandbox_guard.py")).read_text(encoding="utf-8")
TAIL_BYTES = 2000


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock
    memory_mb: int = 1024  # address space
    file_mb: int = 16  # largest file (stdout/stderr included)
    open_files: int = 64
    processes: int = 16  # RLIMIT_NPROC: enforced for non-root users only; fork is refused anyway
    isolate_network: bool = True

    def __post_init__(self):
        for name in ("timeout_s", "memory_mb", "file_mb", "open_files", "processes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox.{name} must be positive, got {getattr(self, name)!r}")


@dataclass
class ExecutionResult:
    status: str  # passed | failed | timeout
    reason: str | None
    returncode: int | None
    seconds: float
    stdout: str = ""
    stderr: str = ""
    isolation: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def harness_paths(extra: tuple[Path, ...] = ()) -> list[str]:
    """Directories the program may not read: the project, the harness's cwd and home, the records."""
    project = Path(__file__).resolve().parents[2]
    paths = {project, Path.cwd().resolve(), Path.home().resolve(), Path(sys.prefix).resolve(), *extra}
    return sorted(str(p) for p in paths if p != Path(p.anchor))  # never deny the whole filesystem


def stdlib_paths() -> list[str]:
    """What the base interpreter needs to read even when it lives under a denied directory."""
    paths = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
    paths.add(str(Path(sys.base_prefix) / "lib"))
    return sorted(paths)


def _interpreter() -> str:
    return getattr(sys, "_base_executable", None) or sys.executable


def _tail(fh) -> str:
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    fh.seek(max(0, size - TAIL_BYTES))
    return fh.read().decode("utf-8", errors="replace")


def _reason(returncode: int, stderr: str, limits: SandboxLimits) -> str:
    if returncode < 0:
        sig = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        hint = {"SIGXCPU": "CPU time limit", "SIGKILL": "killed", "SIGSEGV": "crashed",
                "SIGXFSZ": f"file size limit ({limits.file_mb} MB)"}.get(sig, "signal")
        return f"{hint} ({sig})"
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return lines[-1][:500] if lines else f"exit status {returncode}"


def run_program(source: str, limits: SandboxLimits = SandboxLimits(), deny_read: tuple[Path, ...] = ()) -> ExecutionResult:
    """Execute ``source`` as a Python program under the sandbox; passed means exit status 0."""
    workdir = Path(tempfile.mkdtemp(prefix="specbench-sandbox-"))
    report_r, report_w = os.pipe()
    try:
        program = workdir / "program.py"
        program.write_text(source, encoding="utf-8")
        policy = {
            "workdir": str(workdir), "program": str(program), "report_fd": report_w,
            "memory_bytes": limits.memory_mb << 20, "cpu_seconds": int(limits.timeout_s) + 1,
            "file_bytes": limits.file_mb << 20, "open_files": limits.open_files, "processes": limits.processes,
            "isolate_network": limits.isolate_network,
            "deny_read": harness_paths(tuple(Path(p).resolve() for p in deny_read)), "allow_read": stdlib_paths() + [str(workdir)],
        }
        env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8"}
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            start = time.perf_counter()
            proc = subprocess.Popen([_interpreter(), "-I", "-S", "-c", GUARD_SOURCE, json.dumps(policy)],
                                    cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True, pass_fds=(report_w,), close_fds=True)
            os.close(report_w)
            report_w = None
            timed_out = False
            try:
                returncode = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_group(proc)
            returncode = proc.wait()
            seconds = time.perf_counter() - start
            isolation = _read_report(report_r)
            stdout, stderr = _tail(out), _tail(err)
        if timed_out:
            status, reason = "timeout", f"timed out after {limits.timeout_s:g} s (wall clock); process group killed"
        elif returncode == 0:
            status, reason = "passed", None
        else:
            status, reason = "failed", _reason(returncode, stderr, limits)
        return ExecutionResult(status, reason, None if timed_out else returncode, seconds, stdout, stderr,
                               ["process-group", "temp-dir", "clean-env"] + isolation)
    finally:
        if report_w is not None:
            os.close(report_w)
        os.close(report_r)
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_report(fd: int) -> list[str]:
    chunks = []
    os.set_blocking(fd, False)
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    try:
        return list(json.loads(b"".join(chunks).decode() or "[]"))
    except ValueError:
        return []
