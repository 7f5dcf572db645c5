"""``python -m <module> ...`` for the tests, forked from a process that imported torch, transformers, Hydra and
specbench once (multiprocessing's forkserver, one per pytest worker).

A tiny-model CLI run in the tests takes ~11 s on one core of a 2-core Zen 3, ~6 s of it importing those packages
again; a config error that exits 2 is almost all import. The forked child runs the module as ``-m`` does (runpy's
``_run_module_as_main`` in a bare ``__main__``, ``sys.argv``, the working directory, the caller's environment,
stdout and stderr at file-descriptor level so that C libraries' output is captured too, non-daemon threads joined
and ``atexit`` handlers run before it exits), and the caller gets the ``subprocess.CompletedProcess`` a fresh
interpreter would give (tests/test_forked.py compares the two). A run given an ``env=`` of its own starts a fresh
interpreter (OpenMP and some libraries read their variables once, at import), as every run does when
``SPECBENCH_TEST_FORK=0``; when the environment has changed since the fork server started, the server is started
again under the new one. Tests that signal or kill a run start their own ``subprocess.Popen``.
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import threading
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRELOAD = "tests.forked_preload"
FORK = os.environ.get("SPECBENCH_TEST_FORK", "1") != "0" and "forkserver" in multiprocessing.get_all_start_methods()
# variables that differ between tests and that nothing reads at import: they pass to the child as they are
RUNTIME_ONLY = {"PYTEST_CURRENT_TEST"}
_server: dict = {}  # "context": the forkserver context; "environ": the environment its server started under


def _context():
    """The forkserver context, its server started under the current environment: one started under another (a
    test or a library has set a variable since: wandb's directories, vLLM's HF_HUB_OFFLINE, read at import by
    what the server preloaded) is stopped first, and the next run starts a new one (~8 s)."""
    environ = _environ()
    if _server.get("environ") != environ:
        if "environ" in _server:
            multiprocessing.forkserver._forkserver._stop()  # private (3.8+); the next Process.start() starts a server
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([PRELOAD])
        _server.update(context=context, environ=environ)
    return _server["context"]


def _exit_code(code) -> int:
    """What the interpreter makes of ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _environ() -> dict:
    """The environment a forked run compares with the fork server's (pytest names the current test in one)."""
    return {key: value for key, value in os.environ.items() if key not in RUNTIME_ONLY}


def _run_in_child(module: str, args: list[str], cwd: str, stdout: str, stderr: str, environ: dict) -> None:
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    for path, fd in ((stdout, 1), (stderr, 2)):
        handle = os.open(path, os.O_WRONLY)
        os.dup2(handle, fd)
        os.close(handle)
    sys.argv = ["-m", *args]  # as python -m leaves it, until runpy puts the module's file in argv[0]
    sys.modules["__main__"] = types.ModuleType("__main__")  # a bare __main__, not the fork server's
    for preloaded in (module, f"{module}.__main__"):  # run afresh, as in a new interpreter (no runpy warning)
        sys.modules.pop(preloaded, None)
    try:
        runpy._run_module_as_main(module)  # what `python -m module` calls, error messages included
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - an uncaught exception: the traceback on stderr and exit 1, as python does
        traceback.print_exc()
        code = 1
    threading._shutdown()  # interpreter exit: non-daemon threads first, then atexit
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_module(module: str, *args: str, timeout: float, cwd: Path = ROOT,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run([python, -m, module, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
    env=env)``, forked from the preloaded server where that gives the same run (module docstring)."""
    argv = [sys.executable, "-m", module, *args]
    if env is not None or not FORK:
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    context = _context()
    with tempfile.TemporaryDirectory(prefix="specbench-forked-") as tmp:
        stdout, stderr = Path(tmp, "stdout"), Path(tmp, "stderr")
        stdout.touch()
        stderr.touch()
        child = context.Process(target=_run_in_child, args=(module, list(args), str(cwd), str(stdout), str(stderr),
                                                                     dict(os.environ)))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(argv, timeout, output=stdout.read_text(errors="replace"),
                                            stderr=stderr.read_text(errors="replace"))
        return subprocess.CompletedProcess(argv, child.exitcode, stdout.read_text(errors="replace"),
                                           stderr.read_text(errors="replace"))
