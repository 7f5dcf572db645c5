"""No test fails on time alone: wall-clock limits are generous and machine-scaled (tests/limits.py), waits end on
events, and speed checks compare with a baseline measured in the same process."""
import io
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from . import limits
from .limits import generous, wait_for

TESTS = Path(__file__).resolve().parent


def fixed_limits(source: str) -> list[str]:
    """Literal wall-clock limits in Python source, string contents excluded: ``timeout=<number>``,
    ``time.time() + <number>`` (a deadline), ``<name with elapsed/seconds> < <number>`` (a timed assertion)."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)]
    found = []
    for i, tok in enumerate(tokens):
        ahead = [t.string for t in tokens[i:i + 8]]
        line = f"line {tok.start[0]}: {tok.line.strip()}"
        if tok.type == tokenize.NAME and ahead[:2] == ["timeout", "="] and tokens[i + 2].type == tokenize.NUMBER:
            found.append(line)
        if (tok.type == tokenize.NAME and tok.string == "time" and ahead[1:2] == ["."]
                and ahead[2] in ("time", "monotonic", "perf_counter") and ahead[3:6] == ["(", ")", "+"]
                and tokens[i + 6].type == tokenize.NUMBER):
            found.append(line)
        if (tok.type == tokenize.NAME and ("elapsed" in tok.string or tok.string in ("seconds", "wall"))
                and ahead[1:2] == ["<"] and tokens[i + 2].type == tokenize.NUMBER):
            found.append(line)
    return found


def test_the_scan_finds_each_kind_of_fixed_limit():
    source = ('proc.wait(timeout=30)\ndeadline = time.time() + 120\nassert elapsed < 5.0\n'
              'code = "f(timeout=2)"\nrun(timeout=generous(30))\nassert seconds[1] < 50 * seconds[0]\n')
    assert [line.split(":")[0] for line in fixed_limits(source)] == ["line 1", "line 2", "line 3"]


def test_no_test_has_a_fixed_wall_clock_limit():
    found = {path.name: hits for path in sorted(TESTS.glob("*.py")) if path.name != "test_time_limits.py"
             for hits in [fixed_limits(path.read_text(encoding="utf-8"))] if hits}
    assert not found, f"use tests/limits.py's generous() / wait_for(), or a same-process baseline: {found}"


def test_limits_scale_with_the_machine_and_the_environment(monkeypatch):
    limits.machine_factor.cache_clear()
    monkeypatch.setattr(limits, "calibration", lambda: 10 * limits.REFERENCE_CALIBRATION_S)  # 10x slower now
    monkeypatch.setenv("SPECBENCH_TEST_TIME_SCALE", "2")
    assert generous(3) == pytest.approx(3 * limits.SLACK * 10 * 2)
    limits.machine_factor.cache_clear()
    monkeypatch.setattr(limits, "calibration", lambda: limits.REFERENCE_CALIBRATION_S / 10)  # faster: never below 1
    monkeypatch.delenv("SPECBENCH_TEST_TIME_SCALE")
    assert generous(3) == pytest.approx(3 * limits.SLACK)
    limits.machine_factor.cache_clear()
    monkeypatch.setenv("SPECBENCH_TEST_TIME_SCALE", "0")
    with pytest.raises(ValueError, match="SPECBENCH_TEST_TIME_SCALE must be a positive number"):
        generous(3)
    limits.machine_factor.cache_clear()


def test_wait_for_ends_on_the_event_or_on_the_process_ending_first(tmp_path):
    flag = tmp_path / "flag"
    writer = subprocess.Popen([sys.executable, "-c", f"import pathlib, time; pathlib.Path({str(flag)!r}).touch(); "
                               "time.sleep(60)"])
    try:
        wait_for(flag.exists, writer, "the flag written")
        assert writer.poll() is None  # returned on the event, not on the process's end
    finally:
        writer.kill()
        writer.wait()
    quitter = subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"])
    with pytest.raises(AssertionError, match=r"the process ended \(exit 4\) before the never-written file"):
        wait_for((tmp_path / "never").exists, quitter, "the never-written file")
