"""Run model-written Python in a separate, limited process. Executing that code is a security boundary.

Layers (each recorded in the result's ``isolation``; docs/design.md, *Running model-written code*, says what each
stops):
- operating system (``sandbox_isolation.py``, where the kernel allows): new PID, mount and network
  namespaces; every mount read-only except the sandbox directory; the harness's directories hidden
  under empty tmpfs mounts; as root, user nobody;
- a new process in its own session/process group; on timeout, and after every run, the whole group
  is killed; a wall-clock timeout bounds every run;
- resource limits: address space, CPU seconds, file size, open files, processes, no core dumps;
- a fresh temporary directory as working directory, HOME and TMPDIR, deleted afterwards; stdin empty;
  an environment holding nothing of the harness's (``python -I -S``: no site-packages, no PYTHON*
  variables, the base interpreter's standard library only);
- a Python audit hook (``sandbox_guard.py``) refusing process creation, signals, sockets, ctypes, frame
  introspection, file changes outside the temporary directory, reads of the harness's directories, further
  audit hooks, code objects built from anything but source (crafted bytecode), and changes to the code or
  defaults of the standard library's functions.

A pass needs proof that the last stage (the tests) ran to its end: a random token the harness sends the
child through a pipe, which the guard writes back only after the tests returned. Exit status 0 — from
``sys.exit(0)``, ``os._exit(0)`` or an ``atexit`` handler — is not a pass.

What a pass cannot be forged with, when the program names entry points (``run_program(entry_points=...)``,
as HumanEval and MBPP do; recorded as ``return_types: "builtin-exact"``): the tests run in a namespace of
their own that holds, of the solution's names, only the entry points, each wrapped (``sandbox_pristine.py``).
Every value a call returns must be made of exact built-in types, recursively (``type(x) is int``; besides,
``collections``' ``Counter``, ``OrderedDict`` and ``defaultdict``): no object whose ``__eq__`` always says
True, no ``int``, ``str``, ``float`` or ``list`` subclass, no forged dict key, no iterator; the tests get a
fresh copy (``sandbox_values.py``), and an argument of theirs made of built-in types must still be after
the call. After the solution and after every call the standard library is put back as it was before the
solution ran (a patched ``math.isclose`` or ``re.match``, a swapped module class, an import hook);
replacing the code or defaults of its functions, adding audit hooks and leaving a thread running are
refused; the prompt's helpers the tests call (``encode_cyclic``) and the built-ins they use are the
prompt's and Python's, not the completion's; the tests' file is gone before the program runs.

What it is not: a defence against everything a program can do in the interpreter its tests run in. Still
open: state inside the library's objects below their attributes (the ``random`` module's generator — a
program can seed it and so know the tests' random inputs — ``decimal`` contexts, closure cells, C-level
settings such as the codec registry or the recursion limit); a solution changing in place, with built-in
values, the arguments the tests passed it, where a test then compares with something computed from the
same object; answers hard-coded for the tests' inputs, which no sandbox can tell from a solution.
Benchmarks that execute untrusted code at scale belong in a container or VM as a whole.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

GUARD_SOURCE = "\n".join(Path(__file__).with_name(name).read_text(encoding="utf-8")  # one script, in this order
                         for name in ("sandbox_isolation.py", "sandbox_values.py", "sandbox_pristine.py",
                                      "sandbox_guard.py"))
PROTECTED_PATHS: set[Path] = set()  # records directories of this process (protect_path)
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
    proof: bool = False  # the tests ran to their end (the guard returned the harness's token)
    # "builtin-exact": the tests ran against entry points whose every returned value was checked (and copied)
    # and with the standard library put back after each call; None: no entry points, or the tests never started
    return_types: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def protect_path(path: str | Path) -> None:
    """Add a directory (a records directory outside the project, say) that sandboxed programs may not read."""
    PROTECTED_PATHS.add(Path(path).expanduser().resolve())


def harness_paths(extra: tuple[Path, ...] = ()) -> list[str]:
    """Directories the program may not read: the project, the harness's cwd and home, the records."""
    project = Path(__file__).resolve().parents[2]
    paths = {project, Path.cwd().resolve(), Path.home().resolve(), Path(sys.prefix).resolve(), *PROTECTED_PATHS,
             *extra}
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


def run_program(program: str | list[tuple[str, str]], limits: SandboxLimits = SandboxLimits(),
                deny_read: tuple[Path, ...] = (), entry_points: dict[str, str] | None = None) -> ExecutionResult:
    """Execute ``program`` under the sandbox: one source, or named stages run in order (each compiled on its
    own, so a stage cannot swallow the next one into a string or a bracket). Passed means the last stage
    returned — proven by a token only the guard holds — not an exit status.

    Without ``entry_points`` the stages share one namespace. With them (name -> ``"checked"`` or
    ``"argument"``), the first stage is the solution and the others (the dataset's context, then its tests)
    run in a namespace of their own holding, of the solution's names, only these, wrapped: every value a
    checked one returns must be made of exact built-in types, and after every call the standard library is
    put back as it was before the solution ran (``sandbox_pristine.py``)."""
    stages = [("program", program)] if isinstance(program, str) else list(program)
    workdir = Path(tempfile.mkdtemp(prefix="specbench-sandbox-"))
    report_r, report_w = os.pipe()
    proof_r, proof_w = os.pipe()
    token = secrets.token_hex(16).encode()
    try:
        paths = []
        for name, source in stages:
            path = workdir / (f"{name}.py" if len(stages) > 1 else "program.py")
            path.write_text(source, encoding="utf-8")
            paths.append([name, str(path)])
        os.write(proof_w, token)
        os.close(proof_w)
        proof_w = None
        policy = {
            "workdir": str(workdir), "stages": paths, "report_fd": report_w, "proof_fd": proof_r,
            "memory_bytes": limits.memory_mb << 20, "cpu_seconds": int(limits.timeout_s) + 1,
            "file_bytes": limits.file_mb << 20, "open_files": limits.open_files, "processes": limits.processes,
            "isolate_network": limits.isolate_network, "entry_points": entry_points,
            "deny_read": harness_paths(tuple(Path(p).resolve() for p in deny_read)),
            "allow_read": stdlib_paths() + [str(workdir)],
        }
        env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8"}
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            start = time.perf_counter()
            proc = subprocess.Popen([_interpreter(), "-I", "-S", "-c", GUARD_SOURCE, json.dumps(policy)],
                                    cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True, pass_fds=(report_w, proof_r), close_fds=True)
            for fd in (report_w, proof_r):
                os.close(fd)
            report_w = proof_r = None
            timed_out = False
            try:
                returncode = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_group(proc)
            returncode = proc.wait()
            seconds = time.perf_counter() - start
            report = _read_report(report_r, token)
            stdout, stderr = _tail(out), _tail(err)
        if timed_out:
            status, reason = "timeout", f"timed out after {limits.timeout_s:g} s (wall clock); process group killed"
        elif report.refused:
            status, reason = "failed", f"refused by the sandbox: {report.refused}"
        elif report.proof:
            status, reason = "passed", None
        elif returncode == 0:
            status, reason = "failed", (f"exit status 0 before the {stages[-1][0]} ran to their end "
                                        "(sys.exit, os._exit or an atexit handler): not a pass")
        else:
            status, reason = "failed", _reason(returncode, stderr, limits)
        return ExecutionResult(status, reason, None if timed_out else returncode, seconds, stdout, stderr,
                               ["process-group", "temp-dir", "clean-env"] + report.layers,
                               proof=report.proof and not report.refused,
                               return_types="builtin-exact" if entry_points is not None and report.checked else None)
    finally:
        for fd in (report_w, proof_r, proof_w, report_r):
            if fd is not None:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class _Report:
    layers: list[str]
    proof: bool  # "proof <token>": the tests returned
    checked: bool  # "returns builtin-exact": the tests started against the wrapped entry points
    refused: str | None  # "refused <why>": a returned value failed the check (or a thread outlived a call)


def _read_report(fd: int, token: bytes) -> _Report:
    """The guard's report: a JSON list of active layers, then the lines above. The program can write to the
    pipe too, but not the token; a refusal it writes only fails itself."""
    chunks = []
    os.set_blocking(fd, False)
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    lines = b"".join(chunks).splitlines()
    proof = any(secrets.compare_digest(line, b"proof " + token) for line in lines[1:])
    refused = next((line[8:].decode("utf-8", "replace")[:500] for line in lines[1:] if line.startswith(b"refused ")),
                   None)
    try:
        layers = json.loads(lines[0].decode()) if lines else []
    except ValueError:
        layers = []
    return _Report([str(x) for x in layers] if isinstance(layers, list) else [], proof,
                   b"returns builtin-exact" in lines[1:], refused)
