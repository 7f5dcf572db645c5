"""pass@1 for HumanEval and MBPP: assemble a program from the completion and its tests, run it sandboxed.

Completions come in two shapes. A base model continuing the prompt (no chat template) writes the
function body and then keeps going, so the text is cut at the first stop sequence (Codex protocol).
An instruct model answering in chat writes a fenced code block; the block is used as written (when
it defines the entry point it follows the prompt and so replaces the prompt's stub).
"""
from __future__ import annotations

import ast
import builtins
import re

from .registry import mean_percent, register
from .sandbox import SandboxLimits, run_program

FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
HUMANEVAL_STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")  # Chen et al. 2021
MBPP_STOP = ("\nclass", "\nassert", '\n"""', "\nprint", "\nif", "\n```")


def fenced_code(text: str, entry_point: str | None = None) -> str | None:
    """The Python code block of a chat answer: the first that defines ``entry_point``, else the first."""
    blocks = [body for lang, body in FENCE.findall(text) if lang.lower() in ("", "python", "py", "python3")]
    if not blocks:
        return None
    if entry_point:
        for body in blocks:
            if re.search(rf"\bdef\s+{re.escape(entry_point)}\s*\(", body):
                return body
    return blocks[0]


def truncate_at_stop(text: str, stop: tuple[str, ...] | list[str]) -> str:
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return text[:cut]


def humaneval_program(prompt: str, completion: str, test: str, entry_point: str,
                      stop: tuple[str, ...] | list[str] = HUMANEVAL_STOP) -> list[tuple[str, str]]:
    """Two stages, compiled apart: the solution (prompt + completion) and the dataset's tests."""
    code = fenced_code(completion, entry_point)
    body = truncate_at_stop(completion, stop) if code is None else "\n" + code
    return [("solution", f"{prompt}{body}\n"), ("tests", f"{test}\n\ncheck({entry_point})\n")]


def mbpp_program(completion: str, tests: list[str], setup: str = "", imports: list[str] | None = None,
                 stop: tuple[str, ...] | list[str] = MBPP_STOP) -> list[tuple[str, str]]:
    code = fenced_code(completion)
    code = truncate_at_stop(completion, stop) if code is None else code
    header = "\n".join([*(imports or []), setup or ""]).strip()
    # the setup in both stages: the tests use their own copy of what it defines (sandbox_values.py)
    return [("solution", f"{header}\n{code}\n"), ("tests", "\n".join([header, *tests]).lstrip("\n") + "\n")]


def mbpp_functions_under_test(reference_code: str | None, tests: list[str]) -> tuple[str, ...]:
    """The functions an MBPP row's tests call: those its reference solution defines at top level, else (no
    reference) every name the tests call that is not a builtin. They may carry a builtin's name (run_program)."""
    try:
        if reference_code:
            tree = ast.parse(reference_code)
            return tuple(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
        tree = ast.parse("\n".join(tests))
    except SyntaxError:
        return ()
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return tuple(sorted(called - set(dir(builtins))))


def _execute(program: list[tuple[str, str]], timeout_s: float, memory_mb: int, isolate_network: bool,
             entry_points: tuple[str, ...]) -> dict:
    limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, isolate_network=isolate_network)
    result = run_program(program, limits, entry_points=entry_points)
    return {"pass": float(result.passed), "status": result.status, "reason": result.reason,
            "isolation": result.isolation, "proof": result.proof}


def _require(row: dict, fields: tuple[str, ...], example_id: str) -> None:
    missing = [f for f in fields if f not in row]
    if missing:
        raise ValueError(f"{example_id} has no {missing} field(s) to run tests with")


@register("humaneval_pass", primary="pass@1", aggregate=mean_percent(**{"pass@1": "pass"}))
def humaneval_pass(outputs: list[str], example, stop=HUMANEVAL_STOP, timeout_s: float = 10.0,
                   memory_mb: int = 1024, isolate_network: bool = True, **_) -> dict:
    row = example.row
    _require(row, ("prompt", "test", "entry_point"), example.id)
    program = humaneval_program(row["prompt"], outputs[-1], row["test"], row["entry_point"], stop)
    return _execute(program, timeout_s, memory_mb, isolate_network, (row["entry_point"],))


@register("mbpp_pass", primary="pass@1", aggregate=mean_percent(**{"pass@1": "pass"}))
def mbpp_pass(outputs: list[str], example, stop=MBPP_STOP, timeout_s: float = 10.0, memory_mb: int = 1024,
              isolate_network: bool = True, **_) -> dict:
    row = example.row
    _require(row, ("test_list",), example.id)
    program = mbpp_program(outputs[-1], row["test_list"], row.get("test_setup_code", ""), row.get("test_imports"), stop)
    return _execute(program, timeout_s, memory_mb, isolate_network,
                    mbpp_functions_under_test(row.get("code"), row["test_list"]))
