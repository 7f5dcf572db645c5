"""The package's import graph (every import statement, a function's lazy ones too, read from the source): no
cycles, no module importing the command-line entry point, and the shared run components importing no engine."""
import ast
from pathlib import Path

import specbench

PACKAGE = Path(specbench.__file__).parent
def module_name(path: Path) -> str:
    parts = ["specbench", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (``from . import x`` counts as importing the submodule x)."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1] + [node.module] if node.module else
                                package[:len(package) - node.level + 1]) if node.level else node.module
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names)
        graph[name] = {m for m in found if m in paths and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def reachable(graph, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for m in graph[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    return seen


def test_the_finder_sees_a_cycle_and_a_lazy_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [{"a", "b", "c"}]
    edges = import_graph()
    assert "specbench.run.config_check" in edges["specbench.engines.hf"]  # imported inside a function
    assert "specbench.scoring.registry" in edges["specbench.scoring.code"]


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_nothing_imports_the_entry_points():
    graph = import_graph()
    for entry in ("specbench.__main__", "specbench.app"):
        assert [m for m, imported in graph.items() if entry in imported] == [], entry


def test_the_run_components_import_no_engine_and_no_entry_point():
    graph = import_graph()
    below = reachable(graph, "specbench.run.components")
    assert not {m for m in below if m.startswith("specbench.engines")}
    assert not below & {"specbench.benchmark", "specbench.bench", "specbench.__main__", "specbench.cli"}


def test_importing_the_package_registers_nothing_until_a_program_asks():
    """``import specbench`` (and every module a library user imports) leaves Hydra's config store and OmegaConf's
    resolvers alone; ``cli.register_configs``, which the programs call, adds the paper tables and head resolvers."""
    import subprocess
    import sys

    script = """
import specbench, specbench.report.render, specbench.run.components, specbench.engines.base
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
def state():
    return "paper_hparams" in ConfigStore.instance().repo, OmegaConf.has_resolver("specbench.head_name")
before = state()
from specbench.cli import register_configs
register_configs()
print(before, state())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "(False, False) (True, True)"
