"""pass@1 for HumanEval and MBPP: assemble a program from the completion and its tests, run it sandboxed.

Completions come in two shapes. A base model continuing the prompt (no chat template) writes the
function body and then keeps going, so the text is cut at the first stop sequence (Codex protocol).
An instruct model answering in chat writes a fenced code block; the block is used as written (when
it defines the entry point it follows the prompt and so replaces the prompt's stub).

The tests run against the solution's entry points only (HumanEval's ``entry_point``; for MBPP the names its
tests call), in a namespace of their own: every value a call returns must be made of exact built-in types,
and the standard library is put back after every call (``sandbox_pristine.py``, ``sandbox_values.py``). What
the tests need besides — the prompt's imports and helpers, MBPP's setup code — is run again there, from the
dataset, so a completion that redefines ``encode_cyclic`` or ``poly`` changes only its own copy.
"""
from __future__ import annotations

import ast
import builtins
import re
import warnings

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
    """Stages compiled apart: the solution (prompt + completion), the prompt's context (when it has more
    than the entry point's stub) and the dataset's tests."""
    code = fenced_code(completion, entry_point)
    body = truncate_at_stop(completion, stop) if code is None else "\n" + code
    context = prompt_context(prompt, entry_point)
    return [("solution", f"{prompt}{body}\n"), *([("context", context)] if context.strip() else []),
            ("tests", f"{test}\n\ncheck({entry_point})\n")]


def prompt_context(prompt: str, entry_point: str) -> str:
    """The prompt without the entry point's stub: its imports and the helpers its tests call (HumanEval/32's
    ``poly``, /38's ``encode_cyclic``, /50's ``encode_shift``), to run again where the tests run."""
    tree = _parse(prompt)
    if tree is None:
        return ""
    lines = prompt.splitlines(keepends=True)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            return "".join(lines[:start] + lines[node.end_lineno:])
    return prompt


def mbpp_program(completion: str, tests: list[str], setup: str = "", imports: list[str] | None = None,
                 stop: tuple[str, ...] | list[str] = MBPP_STOP) -> list[tuple[str, str]]:
    """The solution (the test imports + the code), the setup code when there is one (it builds the tests'
    inputs from the solution's classes, MBPP 367's ``root = Node(1)``: after the solution, not before), the
    tests."""
    code = fenced_code(completion)
    code = truncate_at_stop(completion, stop) if code is None else code
    header = "\n".join(imports or [])
    return [("solution", f"{header}\n{code}\n"), *([("setup", f"{header}\n{setup}\n")] if setup.strip() else []),
            ("tests", "\n".join([*(imports or []), *tests]) + "\n")]


def mbpp_entry_points(tests: list[str], setup: str = "", reference: str | None = None) -> dict[str, str]:
    """The names the setup and tests read without binding them: each ``"checked"``, or ``"argument"`` when it
    is only ever used inside the arguments of a call to another such name (MBPP 601's ``Pair(5, 24)`` inside
    ``max_chain_length(...)``) or in the setup (367's ``Node``): its value goes back into the solution, never
    to a comparison. A call to a built-in name (``set(similar_elements(...))``) is no such shelter, and a
    built-in name is an entry point only when the reference solution defines it (a task asking for ``sum``):
    else a solution defining ``set`` would change what the tests compare with."""
    modes: dict[str, str] = {}
    bound: set[str] = set()
    defined = {node.name for node in getattr(_parse(reference or ""), "body", [])
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for source, in_setup in ((setup, True), ("\n".join(tests), False)):
        tree = _parse(source)
        if tree is None:
            continue
        _NameUses(modes, in_setup).visit(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                bound.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
    return {name: mode for name, mode in modes.items()
            if name not in bound and (name in defined or not hasattr(builtins, name))}


def _parse(source: str) -> ast.Module | None:
    with warnings.catch_warnings():  # MBPP's code has "\." in plain strings: a warning per parse, not an error
        warnings.simplefilter("ignore")
        try:
            return ast.parse(source)
        except SyntaxError:
            return None


class _NameUses(ast.NodeVisitor):
    def __init__(self, modes: dict[str, str], in_setup: bool):
        self.modes, self.in_setup, self.callers = modes, in_setup, 0

    def visit_Call(self, node: ast.Call) -> None:
        self.visit(node.func)
        shelter = isinstance(node.func, ast.Name) and not hasattr(builtins, node.func.id)
        self.callers += shelter
        for arg in [*node.args, *node.keywords]:
            self.visit(arg)
        self.callers -= shelter

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            mode = "argument" if self.in_setup or self.callers else "checked"
            if self.modes.get(node.id) != "checked":
                self.modes[node.id] = mode


def _execute(program: list[tuple[str, str]], entry_points: dict[str, str], timeout_s: float, memory_mb: int,
             isolate_network: bool) -> dict:
    limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, isolate_network=isolate_network)
    result = run_program(program, limits, entry_points=entry_points)
    return {"pass": float(result.passed), "status": result.status, "reason": result.reason,
            "isolation": result.isolation, "proof": result.proof, "return_types": result.return_types}


def _require(row: dict, fields: tuple[str, ...], example_id: str) -> None:
    missing = [f for f in fields if f not in row]
    if missing:
        raise ValueError(f"{example_id} has no {missing} field(s) to run tests with")


@register("humaneval_pass", primary="pass@1", aggregate=mean_percent(**{"pass@1": "pass"}))
def humaneval_pass(outputs: list[str], example, stop=HUMANEVAL_STOP, timeout_s: float = 10.0,
                   memory_mb: int = 1024, isolate_network: bool = True) -> dict:
    row = example.row
    _require(row, ("prompt", "test", "entry_point"), example.id)
    program = humaneval_program(row["prompt"], outputs[-1], row["test"], row["entry_point"], stop)
    return _execute(program, {row["entry_point"]: "checked"}, timeout_s, memory_mb, isolate_network)


@register("mbpp_pass", primary="pass@1", aggregate=mean_percent(**{"pass@1": "pass"}))
def mbpp_pass(outputs: list[str], example, stop=MBPP_STOP, timeout_s: float = 10.0, memory_mb: int = 1024,
              isolate_network: bool = True) -> dict:
    row = example.row
    _require(row, ("test_list",), example.id)
    setup = row.get("test_setup_code") or ""
    program = mbpp_program(outputs[-1], row["test_list"], setup, row.get("test_imports"), stop)
    entry_points = mbpp_entry_points(row["test_list"], setup, row.get("code"))
    return _execute(program, entry_points, timeout_s, memory_mb, isolate_network)
