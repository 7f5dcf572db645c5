"""The code-execution sandbox: each hostile program ends as a failed sample with a reason, and nothing
outside its temporary directory changes."""
import os
import socket
import threading
from pathlib import Path

import pytest

from specbench.scoring.sandbox import SandboxLimits, run_program

from .conftest import ROOT

FAST = SandboxLimits(timeout_s=3)


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


def test_infinite_loop_is_killed_at_the_timeout(harness_dir):
    result = run_against(harness_dir, "import os\nprint(os.getpid(), flush=True)\nwhile True:\n    pass\n")
    assert result.status == "timeout" and "timed out after 3 s" in result.reason
    pid = int(result.stdout.split()[0])
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_sleeping_program_is_killed_at_the_wall_clock_timeout(harness_dir):
    result = run_against(harness_dir, "import time\ntime.sleep(60)", SandboxLimits(timeout_s=1))
    assert result.status == "timeout" and result.seconds < 10


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
    result = run_against(harness_dir, source, SandboxLimits(timeout_s=10, memory_mb=512))
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
                         SandboxLimits(timeout_s=10, file_mb=1))
    assert result.status == "failed" and "File too large" in result.reason
    assert len(result.stdout) <= 4000


def test_the_harness_keeps_going_after_hostile_programs(harness_dir):
    hostile = ["while True: pass", "import os\nos.fork()", "x = ' ' * (10 ** 11)", "raise SystemExit(3)"]
    results = [run_against(harness_dir, src, SandboxLimits(timeout_s=2)) for src in hostile]
    assert [r.status for r in results] == ["timeout", "failed", "failed", "failed"]
    assert all(r.reason for r in results)
    assert run_against(harness_dir, "assert sum(range(10)) == 45").passed
    assert os.getpid() > 0  # still here
