"""The code-execution sandbox: each hostile program ends as a failed sample with a reason, and nothing
outside its temporary directory changes."""
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from specbench.scoring import sandbox
from specbench.scoring.code import humaneval_program
from specbench.scoring.sandbox import SandboxLimits, run_program

from .conftest import ROOT
from .limits import generous

FAST = SandboxLimits(timeout_s=generous(3))  # a program that ends must never time out, however busy the machine
LOOPING = SandboxLimits(timeout_s=3)  # for programs that never end: any machine times them out


def snapshot(root: Path) -> dict:
    return {str(p): (p.stat().st_size, p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture
def harness_dir(tmp_path):
    """Stands for the harness's files: a records file and a folder that must survive every program."""
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "run.jsonl").write_text('{"prompt_id": "p0"}\n')
    (tmp_path / "notes.txt").write_text("keep me")
    return tmp_path


def run_against(harness_dir, source, limits=FAST):
    before = snapshot(harness_dir)
    result = run_program(source, limits, deny_read=(harness_dir,))
    assert snapshot(harness_dir) == before, "the program changed files outside its temporary directory"
    return result


def test_a_good_program_passes_and_its_directory_is_removed(harness_dir):
    result = run_against(harness_dir, "import os\nopen('scratch.txt', 'w').write('ok')\nprint(os.getcwd())")
    assert result.passed and result.returncode == 0
    workdir = Path(result.stdout.strip())
    assert workdir.name.startswith("specbench-sandbox-") and not workdir.exists()
    assert {"process-group", "rlimits", "audit-hook", "temp-dir", "clean-env"} <= set(result.isolation)


def live_processes_mentioning(text: str) -> list[int]:
    """Harness-side pids of live processes whose command line holds ``text`` (zombies have none)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


def test_infinite_loop_is_killed_at_the_timeout(harness_dir):
    result = run_against(harness_dir, "import os\nprint(os.getcwd(), flush=True)\nwhile True:\n    pass\n", LOOPING)
    assert result.status == "timeout" and "timed out after 3 s" in result.reason
    workdir = result.stdout.split()[0]  # in the guard's command line (its policy), so in every process it made
    assert workdir.startswith("/") and "specbench-sandbox-" in workdir
    assert not live_processes_mentioning(workdir)


def test_sleeping_program_is_killed_at_the_wall_clock_timeout(harness_dir):
    result = run_against(harness_dir, "import time\ntime.sleep(3600)", SandboxLimits(timeout_s=1))
    assert result.status == "timeout" and result.seconds < generous(10)


@pytest.mark.parametrize("source", [
    "import os\nwhile True:\n    os.fork()",
    "import subprocess\nsubprocess.run(['sh', '-c', ':(){ :|:& };:'])",
    "import multiprocessing\nmultiprocessing.Process(target=print).start()",
    "import os\nos.system('echo escaped > /tmp/specbench-escaped')",
    "import pty\npty.fork()",
])
def test_fork_bomb_and_process_creation_are_refused(harness_dir, source):
    result = run_against(harness_dir, source)
    assert result.status == "failed" and "blocked by the sandbox" in result.reason
    assert not Path("/tmp/specbench-escaped").exists()


@pytest.mark.parametrize("source", [
    "x = bytearray(8 * 1024 ** 3)",
    "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024 ** 2))",
])
def test_huge_allocation_fails_with_memory_error(harness_dir, source):
    result = run_against(harness_dir, source, SandboxLimits(timeout_s=generous(10), memory_mb=512))
    assert result.status == "failed" and "MemoryError" in result.reason


@pytest.mark.parametrize("template", [
    "import os\nos.remove({path!r})",
    "open({path!r}, 'w').write('overwritten')",
    "import shutil\nshutil.rmtree({dir!r})",
    "import os\nos.rename({path!r}, {path!r} + '.moved')",
    "import os\nos.symlink({path!r}, 'link')",
    "import os\nos.chmod({path!r}, 0o777)",
])
def test_deleting_or_changing_harness_files_is_refused(harness_dir, template):
    target = harness_dir / "records" / "run.jsonl"
    result = run_against(harness_dir, template.format(path=str(target), dir=str(target.parent)))
    assert result.status == "failed" and "blocked by the sandbox" in result.reason
    assert target.read_text() == '{"prompt_id": "p0"}\n'


def test_reading_harness_files_is_refused(harness_dir):
    for path in (harness_dir / "notes.txt", ROOT / "README.md"):
        result = run_against(harness_dir, f"print(open({str(path)!r}).read())")
        assert result.status == "failed" and "harness path" in result.reason
        assert "keep me" not in result.stdout
    listing = run_against(harness_dir, f"import os\nprint(os.listdir({str(harness_dir)!r}))")
    assert listing.status == "failed" and "notes.txt" not in listing.stdout


def test_parent_process_environment_is_not_readable(harness_dir):
    result = run_against(harness_dir, "import os\nprint(open(f'/proc/{os.getppid()}/environ').read())")
    assert result.status == "failed" and "harness path" in result.reason


def test_network_attempt_fails_and_reaches_nothing(harness_dir):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    accepted = []

    def accept():
        try:
            accepted.append(listener.accept())
        except OSError:
            pass

    for source in (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)",
                   f"import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/', timeout=2)"):
        thread = threading.Thread(target=accept)
        thread.start()
        result = run_against(harness_dir, source)
        thread.join()
        assert result.status == "failed" and "blocked by the sandbox" in result.reason
    listener.close()
    assert not accepted, "the sandboxed program reached a socket of the harness"


def test_harness_environment_variables_are_not_passed(harness_dir, monkeypatch):
    monkeypatch.setenv("SPECBENCH_TEST_SECRET", "hunter2")
    result = run_against(harness_dir, "import os\nprint(dict(os.environ))")
    assert result.passed and "hunter2" not in result.stdout and "SPECBENCH_TEST_SECRET" not in result.stdout


def test_output_flood_is_capped(harness_dir):
    result = run_against(harness_dir, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
                         SandboxLimits(timeout_s=generous(10), file_mb=1))
    assert result.status == "failed" and "File too large" in result.reason
    assert len(result.stdout) <= 4000


def test_the_harness_keeps_going_after_hostile_programs(harness_dir, tmp_path_factory, monkeypatch):
    # this test's sandboxes in a folder of their own: the other test worker may be scoring programs meanwhile, and
    # every sandboxed process's command line names the guard's own paths (specbench-sandbox-...)
    own = tmp_path_factory.mktemp("sandboxes")
    monkeypatch.setattr(tempfile, "tempdir", str(own))
    hostile = ["while True: pass", "import os\nos.fork()", "x = ' ' * (10 ** 11)", "raise SystemExit(3)"]
    results = [run_against(harness_dir, src, LOOPING if src.startswith("while") else FAST) for src in hostile]
    assert [r.status for r in results] == ["timeout", "failed", "failed", "failed"]
    assert all(r.reason for r in results)
    assert run_against(harness_dir, "assert sum(range(10)) == 45").passed
    assert not live_processes_mentioning(f"{own}/specbench-sandbox-"), "a sandboxed process outlived its run"


# --- a pass needs the tests to have run to their end ---------------------------------------------------

PROMPT = "def one():\n"
TESTS = "def check(candidate):\n    assert candidate() == 1\n"


@pytest.mark.parametrize("completion", [
    "    return 2\nimport sys\nsys.exit(0)\n",
    "    return 2\nraise SystemExit(0)\n",
    "    return 2\nimport os\nos._exit(0)\n",
    "    return 2\nimport atexit, os\natexit.register(os._exit, 0)\n",
    "    return 2\nimport sys, os\nsys.excepthook = lambda *a: os._exit(0)\n",
    '    return 2\nx = """\n',  # an open string must not swallow the tests
])
def test_exiting_before_or_around_failing_tests_is_not_a_pass(harness_dir, completion):
    result = run_against(harness_dir, humaneval_program(PROMPT, completion, TESTS, "one"))
    assert result.status == "failed" and not result.proof and result.reason


def test_the_same_program_with_a_right_answer_passes_with_proof(harness_dir):
    result = run_against(harness_dir, humaneval_program(PROMPT, "    return 1\n", TESTS, "one"))
    assert result.passed and result.proof and result.returncode == 0


def test_a_solution_that_replaces_builtins_does_not_change_what_the_tests_see(harness_dir):
    completion = "    return 1\nimport builtins\nbuiltins.exec = lambda *a, **k: None\nbuiltins.len = lambda x: 3\n"
    tests = TESTS + "    assert len([1]) == 1\n"
    assert run_against(harness_dir, humaneval_program(PROMPT, completion, tests, "one")).passed
    lying = run_against(harness_dir, humaneval_program(PROMPT, "    return 2\nimport builtins\n"
                                                        "builtins.exec = lambda *a, **k: None\n", TESTS, "one"))
    assert lying.status == "failed" and not lying.proof


@pytest.mark.parametrize("source", [
    "import sys\nf = sys._getframe()\nwhile f.f_back: f = f.f_back\nprint(f.f_locals)",
    "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    print(e.__traceback__.tb_frame.f_back.f_locals)",
    "import gc\nprint([o for o in gc.get_objects() if isinstance(o, bytes)])",
    "import sys\nsys.settrace(lambda *a: None)",
    "import signal, os\nsignal.signal(signal.SIGALRM, lambda s, f: print(f.f_back.f_locals))\nsignal.alarm(1)",
    "print(open('/proc/self/mem', 'rb').read(10))",
    "import signal, typing, collections, sys\n"  # the guard's own functions would lead to its globals
    "for f in (signal.signal, typing._caller, collections.namedtuple):\n"
    "    f.__globals__['refuse'] = lambda what: None\n"
    "sys._getframe()",
])
def test_the_proof_token_cannot_be_reached(harness_dir, source):
    result = run_against(harness_dir, source)
    assert result.status == "failed" and "blocked by the sandbox" in result.reason and not result.proof


CODE_FIELDS = ("co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_nlocals", "co_stacksize", "co_flags",
               "co_code", "co_consts", "co_names", "co_varnames", "co_filename", "co_name", "co_qualname",
               "co_firstlineno", "co_linetable", "co_exceptiontable")


@pytest.mark.parametrize("source", [
    "f = lambda: 0\nf.__code__ = f.__code__.replace(co_consts=(1,))\nprint(f())",
    f"import types\nc = (lambda: 0).__code__\nprint(types.CodeType(*[getattr(c, a) for a in {CODE_FIELDS!r}]))",
    "import marshal\nprint(marshal.loads(marshal.dumps((lambda: 0).__code__)))",
    "import io, marshal\nprint(marshal.load(io.BytesIO(marshal.dumps((lambda: 0).__code__))))",
    # bytecode planted as a module: a sourceless .pyc put on the path, then imported
    "import py_compile, importlib, sys as s\nopen('m.py', 'w').write('x = 1')\n"
    "py_compile.compile('m.py', cfile='planted.pyc')\ns.path.insert(0, '.')\nimport planted\nprint(planted.x)",
])
def test_code_objects_can_only_come_from_source(harness_dir, source):
    """Crafted bytecode (a code object built by hand, by replace() or from marshal's bytes) reads memory no audit
    event follows: every route is refused once the program starts, while imports still compile from source."""
    result = run_against(harness_dir, source)
    assert result.status == "failed" and "blocked by the sandbox" in result.reason and not result.proof, result


def test_modules_not_loaded_before_the_program_still_import(harness_dir):
    result = run_against(harness_dir, "import calendar, difflib, plistlib\n"
                                      "assert calendar.isleap(2024) and difflib.SequenceMatcher(None, 'ab', 'ab')\n"
                                      "exec(compile('y = 2', 'here', 'exec'))\nassert y == 2")
    assert result.passed, result


# --- no escape through ordinary calls ------------------------------------------------------------------

@pytest.mark.parametrize("template", [
    "import os\nfd = os.open({dir!r}, os.O_RDONLY)\n"
    "os.close(os.open('created.txt', os.O_CREAT | os.O_WRONLY, dir_fd=fd))",
    "import os\nfd = os.open({dir!r}, os.O_RDONLY)\nos.remove('run.jsonl', dir_fd=fd)",
    "import os\nos.mkdir('a')\nfd = os.open('a', os.O_RDONLY)\nos.remove({rel!r}, dir_fd=fd)",
    "import os\nos.mknod({dir!r} + '/node')",
    "import os\nos.mkfifo({dir!r} + '/fifo')",
    "import posix\nposix.mkfifo({dir!r} + '/fifo')",
])
def test_directory_descriptors_and_unaudited_calls_change_nothing_outside(harness_dir, template):
    records = harness_dir / "records"
    climb = "../" * 16 + str(records / "run.jsonl").lstrip("/")  # from a directory inside the sandbox's
    result = run_against(harness_dir, template.format(dir=str(records), rel=climb))
    assert result.status == "failed" and not result.proof
    assert sorted(p.name for p in records.iterdir()) == ["run.jsonl"]


def test_reading_through_a_directory_descriptor_is_refused(harness_dir):
    source = (f"import os\nfd = os.open({str(harness_dir)!r}, os.O_RDONLY)\n"
              "print(os.read(os.open('notes.txt', os.O_RDONLY, dir_fd=fd), 100))")
    result = run_against(harness_dir, source)
    assert result.status == "failed" and "keep me" not in result.stdout


def test_records_outside_the_working_directory_are_not_readable(tmp_path, monkeypatch):
    records = tmp_path / "elsewhere" / "records"
    records.mkdir(parents=True)
    (records / "run.jsonl").write_text('{"secret": "answer"}\n')
    monkeypatch.setattr(sandbox, "PROTECTED_PATHS", set())
    sandbox.protect_path(records)  # what the runner does with runner.records_dir
    for source in (f"print(open({str(records / 'run.jsonl')!r}).read())",
                   f"import os\nprint(os.listdir({str(records)!r}))"):
        result = run_program(source, FAST)
        assert result.status == "failed" and "answer" not in result.stdout and "run.jsonl" not in result.stdout


def test_an_unrelated_process_cannot_be_signalled(harness_dir):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        for source in (f"import os, signal\nsignal.pidfd_send_signal(os.pidfd_open({victim.pid}), signal.SIGKILL)",
                       f"import os\nos.kill({victim.pid}, 9)"):
            result = run_against(harness_dir, source)
            assert result.status == "failed" and not result.proof
        assert victim.poll() is None, "the sandboxed program killed a process outside it"
    finally:
        victim.kill()
        victim.wait()


def test_operating_system_layers_are_recorded_where_the_kernel_allows_them(harness_dir):
    result = run_against(harness_dir, "import os\nprint(os.getpid())\nopen('/etc/specbench-probe', 'a')")
    layers = set(result.isolation)
    if "pid-namespace" in layers:  # this machine allows namespaces: each claimed layer must hold
        assert result.stdout.split()[0] == "1"
    if "read-only-filesystem" in layers:
        assert "Read-only file system" in result.reason or "blocked by the sandbox" in result.reason
    assert not Path("/etc/specbench-probe").exists()
