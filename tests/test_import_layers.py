"""The package's import graph: no circles, and no module imports from a layer above its own.

Every import statement counts, including those inside functions (a lazy import upwards is still an
upward dependency). Layers, lowest first; a module may import from its own layer or any below it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "companion"

LAYERS: list[tuple[str, list[str]]] = [
    ("mathematics", ["companion.files", "companion.precision", "companion.tolerance", "companion.attention", "companion.positions", "companion.norms",
                     "companion.feedforward", "companion.attention_backward"]),
    ("kernels", ["companion.kernels"]),  # the attention entry point and its backends sit under the layers
    ("cache", ["companion.cache"]),
    ("layers", ["companion.mha", "companion.mla", "companion.moe", "companion.blocks"]),
    ("models", ["companion.models"]),
    ("data", ["companion.tokenizers", "companion.data"]),
    ("inference", ["companion.inference"]),
    ("accounting", ["companion.accounting", "companion.opcount", "companion.hf"]),
    ("systems", ["companion.engine", "companion.training"]),
    ("notebook", ["companion.notebook", "companion.exercises", "companion.course"]),
    ("entry points", ["companion", "companion.__main__"]),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return best


def imports_of(path: Path) -> set[str]:
    """The companion modules a file imports (``from companion.x import y`` counts companion.x, and
    companion.x.y too when y is a submodule)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "companion"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "companion":
                continue
            found.add(node.module)
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists() or (
                    PACKAGE.parent / sub.replace(".", "/") / "__init__.py"
                ).exists():
                    found.add(sub)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            raise AssertionError(f"{path}: use absolute imports (companion.x), not relative ones")
    return found


GRAPH = {module_name(p): imports_of(p) - {module_name(p)} for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_has_a_layer():
    for module in GRAPH:
        layer_of(module)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_upward_import(module):
    mine = layer_of(module)
    upward = sorted(m for m in GRAPH[module] if layer_of(m) > mine)
    assert not upward, (
        f"{module} (layer {LAYERS[mine][0]!r}) imports from higher layers: "
        + ", ".join(f"{m} ({LAYERS[layer_of(m)][0]!r})" for m in upward)
    )


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as a list of nodes (first == last), or None. Parent packages count as
    importing nothing extra here: ``import companion.a.b`` runs companion/a/__init__ too, which the
    edge companion.a.b -> companion.a would make circular for every package, so such edges are dropped."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if n.startswith(m + "."):
                continue
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m in graph and state.get(m) is None:
                cyc = visit(m)
                if cyc:
                    return cyc
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if state.get(n) is None:
            cyc = visit(n)
            if cyc:
                return cyc
    return None


def test_no_import_cycles():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_can_fail():
    # A planted cycle and a planted upward import are found.
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert layer_of("companion.engine.engine") > layer_of("companion.mha")
