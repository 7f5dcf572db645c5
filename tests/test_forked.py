"""The tests' forked CLI runs (tests/forked.py) give what a fresh interpreter gives."""
import os

from .forked import run_module
from .limits import generous


def fresh(module: str, *args: str):
    # an env of the caller's own: a fresh interpreter
    return run_module(module, *args, timeout=generous(300), env=dict(os.environ))


def test_a_forked_run_exits_and_prints_as_a_fresh_interpreter_does():
    for module, args in (("specbench", ("method=nosuch",)),                       # a config error: exit 2, one line
                         ("specbench.report", ("experiment=nosuch",)),
                         ("specbench.nosuch", ())):                               # no such module: python's own exit 1
        forked, new = run_module(module, *args, timeout=generous(300)), fresh(module, *args)
        assert (forked.returncode, forked.stdout) == (new.returncode, new.stdout), (module, forked, new)
        assert forked.stderr.splitlines()[-1:] == new.stderr.splitlines()[-1:], (module, forked.stderr, new.stderr)


def test_output_written_below_python_and_at_exit_is_captured():
    code = ("import atexit, os, sys; atexit.register(lambda: print('at exit')); os.write(1, b'fd 1\\n'); "
            "os.write(2, b'fd 2\\n'); sys.exit('bye')")
    forked = run_module("tests.forked_script", code, timeout=generous(300))
    assert (forked.returncode, forked.stdout, forked.stderr) == (1, "fd 1\nat exit\n", "fd 2\nbye\n"), forked


def test_a_changed_environment_starts_the_fork_server_again(monkeypatch):
    def server() -> tuple[int, str]:  # the fork server's pid, and what the run sees
        proc = run_module("tests.forked_script", "import os; "
                          "print(os.getppid(), os.environ.get('SPECBENCH_FORKED_PROBE'))",
                          timeout=generous(300))
        pid, probe = proc.stdout.split()
        return int(pid), probe

    first, probe = server()
    assert server()[0] == first and probe == "None"     # one server while nothing changes
    monkeypatch.setenv("SPECBENCH_FORKED_PROBE", "1")
    second, probe = server()
    assert second != first and probe == "1"            # a new server, started under the new environment
    monkeypatch.delenv("SPECBENCH_FORKED_PROBE")
    third, probe = server()
    assert third not in (first, second) and probe == "None"
