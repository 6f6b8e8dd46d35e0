"""The layers point one way: schema <- tokens <- events <- decode <- functional <- metrics <- report, figures <-
callbacks, offline (the two doors) <- evaluate (the re-export where users import), demo, cli; every import (also one
inside a function) goes down or sideways, and no modules import each other in a circle."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "owa_metrics"
LAYERS = ["schema", "tokens", "events", "decode", "functional", "metrics", "report figures",
          "callbacks offline",
          "evaluate demo cli",
          "__main__"]
RANK = {name: level for level, names in enumerate(LAYERS) for name in names.split()}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Each module of the package -> the package modules it imports (relative or absolute, at any depth)."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    out = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                found |= {f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("owa_metrics"):
                found.add(node.module.removeprefix("owa_metrics").lstrip("."))
        out[name] = {m for m in found if m in modules and m != name}
    return out


def _is_package(module: str) -> bool:
    """A package's ``__init__`` only gathers its modules' names: an arrow into it is one into those modules."""
    return (PACKAGE / module.replace(".", "/") / "__init__.py").exists()


def _layer(module: str) -> int:
    return RANK[module.split(".")[0]]


def test_every_import_goes_down_or_sideways():
    up = [(m, target) for m, targets in _imports().items() if m for target in targets
          if target and _layer(target) > _layer(m)]
    assert up == [], "imports that climb back up the stack"


def test_no_circle_between_modules():
    graph = {m: {t for t in targets if t and not _is_package(t)} for m, targets in _imports().items()}
    state: dict[str, int] = {}

    def visit(node, path):
        if state.get(node) == 1:
            raise AssertionError(f"import circle: {' -> '.join(path[path.index(node):] + [node])}")
        if state.get(node) == 2:
            return
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(graph):
        if node and not _is_package(node):
            visit(node, [])


def test_the_metric_class_reads_as_states_update_compute():
    """`OWAEventMetrics` fits in 250 lines (issue 47): its argument checks, accumulation paths, shared compute and
    figures live in modules of their own, and its module stays under 800 lines."""
    path = PACKAGE / "metrics" / "collection.py"
    tree = ast.parse(path.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "OWAEventMetrics"]
    assert cls.end_lineno - cls.lineno + 1 <= 250
    assert len(path.read_text().splitlines()) <= 800


def test_no_package_file_is_over_800_lines():
    """Issue 47: a module a maintainer reads top to bottom (`functional/stats.py` was 1,168 lines with its copy of
    numpy's generator)."""
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 800}
    assert long == {}
