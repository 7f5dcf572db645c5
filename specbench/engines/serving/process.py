"""A server's lifetime under the harness: started on 127.0.0.1, health-checked before any load, watched while the
load runs, and stopped — on a normal end, an error, Ctrl-C or SIGTERM — with nothing left running.

- The server runs in its own session (process group), its output in a log file beside the records; ``stop`` sends
  SIGTERM to the whole group, then SIGKILL after ``stop_timeout_s``.
- If this process dies without cleaning up (SIGKILL, a crash), the kernel kills the server too: the child asks for
  SIGKILL on its parent's death (``PR_SET_PDEATHSIG``, Linux) before it runs the server. SIGTERM to this process
  is turned into ``SystemExit`` while a server runs, so the ``with`` block's exit stops it.
- A server that exits while starting or under load is ``ServerDied``: its name, exit status and the last lines of
  its log, never a hang or a bare connection error.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx

from ...errors import ServerError

PR_SET_PDEATHSIG = 1


class ServerDied(ServerError):
    """The server exited (or never became healthy): what it said last is in the message."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: stop() and the SIGTERM handler remain


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class ServerProcess:
    """One server: ``command`` (argv) started with ``start``/``with``, healthy when GET ``health_url`` answers 200."""

    def __init__(self, name: str, command: list[str], health_url: str, log_path: Path, env: dict | None = None,
                 start_timeout_s: float = 300.0, stop_timeout_s: float = 10.0):
        self.name, self.command, self.health_url, self.log_path = name, command, health_url, Path(log_path)
        self.env, self.start_timeout_s, self.stop_timeout_s = env, start_timeout_s, stop_timeout_s
        self.proc: subprocess.Popen | None = None
        self._log = None
        self._previous_sigterm = None

    # --- lifetime

    def start(self) -> "ServerProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._catch_sigterm()
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self.env, start_new_session=True, preexec_fn=die_with_parent)
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self) -> None:
        """Poll ``health_url`` until it answers 200; ServerDied if the server exits or ``start_timeout_s`` passes."""
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            self.check()
            try:
                if httpx.get(self.health_url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ServerDied(f"{self.name} did not answer {self.health_url} within {self.start_timeout_s:g} s; "
                                 f"its log ({self.log_path}) ends:\n{log_tail(self.log_path)}")
            time.sleep(0.2)

    def check(self) -> None:
        """ServerDied if the server has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerDied(f"{self.name} exited with status {self.proc.returncode}; its log ({self.log_path}) "
                             f"ends:\n{log_tail(self.log_path)}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        """SIGTERM to the server's process group, SIGKILL after ``stop_timeout_s``; its exit status."""
        proc, self.proc = self.proc, None
        try:
            if proc is not None:
                for sig, wait_s in ((signal.SIGTERM, self.stop_timeout_s), (signal.SIGKILL, 10.0)):
                    try:
                        os.killpg(proc.pid, sig)  # the group: a server's own worker processes too
                    except ProcessLookupError:
                        break
                    try:
                        proc.wait(timeout=wait_s)
                        if sig == signal.SIGTERM:
                            self._reap_group(proc.pid)
                        break
                    except subprocess.TimeoutExpired:
                        continue
                return proc.returncode
            return None
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
            self._restore_sigterm()

    @staticmethod
    def _reap_group(pgid: int) -> None:
        """Workers the server left in its group after it exited: killed."""
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- SIGTERM while a server runs: leave through the with block

    def _catch_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def leave(signum, frame):
            raise SystemExit(128 + signum)

        self._previous_sigterm = signal.signal(signal.SIGTERM, leave)

    def _restore_sigterm(self) -> None:
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
