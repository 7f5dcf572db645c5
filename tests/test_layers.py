"""The package's layers: each module belongs to one, and imports (lazy ones too, tests/test_imports.import_graph)
only its own layer and those below. Lowest first:

- base: errors and exit codes, checking a config value against its annotation, where the configs are, clocks, the
  machine, files on disk, building a config node
- data and scoring: prompts and how outputs are scored
- backends: how forwards run (the language-model interface; transformers eager / static / graphs; llama.cpp)
- models: model pairs, their loaders, draft heads
- decoding: the speculative loop, proposals, verification, token trees; retrieval: the datastores drafts read
- records: the record types and the record files
- analysis: metrics, identical work, costs and the bound, losslessness, the console table: what the numbers mean
- methods: the decoding methods a config names
- run: the runner, a run's identity, inputs and checks, the heads' accounts, summaries
- engines: what decodes a run (our loops, vLLM) and the one measure path
- entry points: the CLI, make bench, the pipelines (training), reports, GPU and step-cost checks

A module the list does not place fails the test: a new one is placed on purpose, not by accident."""
from __future__ import annotations

from .test_imports import cycles, import_graph

LAYERS = [  # (name, module prefixes), lowest first
    ("base", ["specbench.errors", "specbench.config_types", "specbench.conf_dir", "specbench.timing",
              "specbench.environment", "specbench.files", "specbench.instantiate", "specbench.tracking",
              "specbench.paper_tables"]),
    ("data and scoring", ["specbench.scoring", "specbench.data"]),
    ("backends", ["specbench.backends"]),
    ("models", ["specbench.models"]),
    ("decoding", ["specbench.decoding", "specbench.retrieval"]),
    ("records", ["specbench.records"]),
    ("analysis", ["specbench.analysis"]),
    ("methods", ["specbench.methods"]),
    ("run", ["specbench.run"]),
    ("engines", ["specbench.engines"]),
    ("entry points", ["specbench.benchmark", "specbench.bench", "specbench.cli", "specbench.__main__",
                      "specbench.step_costs", "specbench.gpu_check", "specbench.llamacpp_reference",
                      "specbench.training", "specbench.report", "specbench"]),
]


def layer_of(module: str) -> int | None:
    """The index of the layer whose prefix names ``module`` most closely (the package itself: the last layer)."""
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a layer into one above it."""
    return sorted(f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
                  for a, imported in graph.items() for b in imported if layer_of(a) < layer_of(b))


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Modules collapsed to their package below specbench (``specbench.models.heads.names`` -> ``specbench.models``);
    a top-level module stays itself."""
    def package(m: str) -> str:
        return ".".join(m.split(".")[:2])

    collapsed: dict[str, set[str]] = {}
    for module, imported in graph.items():
        others = {package(b) for b in imported} - {package(module)}
        collapsed.setdefault(package(module), set()).update(others)
    return collapsed


def test_every_module_has_a_layer():
    assert [m for m in import_graph() if layer_of(m) is None] == []


def test_no_layer_imports_one_above_it():
    assert upward(import_graph()) == []


def test_no_package_level_cycles():
    assert cycles(package_graph(import_graph())) == []


def test_the_checks_see_an_upward_import_and_a_package_cycle():
    graph = {"specbench.backends.torch.cached_lm": {"specbench.models.pair"}, "specbench.models.pair": set()}
    assert upward(graph) == ["specbench.backends.torch.cached_lm (backends) imports specbench.models.pair (models)"]
    modules = {"specbench.models.pair": {"specbench.decoding.loop"}, "specbench.decoding.loop": set(),
               "specbench.decoding.head": {"specbench.models.heads.draft"}, "specbench.models.heads.draft": set()}
    assert cycles(package_graph(modules)) == [{"specbench.models", "specbench.decoding"}]
