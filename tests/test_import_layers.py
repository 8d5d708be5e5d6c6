"""The package's import graph: no circles, and no module imports from a layer above its own.

Every import statement counts, including those inside functions (a lazy import upwards is still an
upward dependency). Layers, lowest first; a module may import from its own layer or any below it.
"""

from __future__ import annotations

import ast
import builtins
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


# ------------------------------------------------------------------ dependencies through annotations
# A module that names another module's types in string annotations ("PagedKVCache") without importing
# them depends on that module as much as an import would, but no import edge shows it: the layer
# and cycle checks above cannot see it. Every name an annotation uses must be bound in the module.

def _bound_names(tree: ast.Module) -> set[str]:
    """Names bound anywhere in the module (imports, defs, classes, assignments, loop and with targets,
    arguments): an annotation may use any of them."""
    names = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def _annotation_names(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of every name used in an annotation, string annotations parsed."""
    annotations = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                if a is not None and a.annotation is not None:
                    annotations.append(a.annotation)
            if node.returns is not None:
                annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
    found = []
    pending = [(ann, None) for ann in annotations]  # (expression, line of the string it was parsed from)
    while pending:
        ann, line = pending.pop()
        for sub in ast.walk(ann):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                try:
                    pending.append((ast.parse(sub.value, mode="eval").body, line or sub.lineno))
                except SyntaxError:
                    pass  # a Literal["..."] argument, not a type
            elif isinstance(sub, ast.Name):
                found.append((line or sub.lineno, sub.id))
    return found


def undefined_annotation_names(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    bound = _bound_names(tree)
    return sorted((line, name) for line, name in _annotation_names(tree) if name not in bound)


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_annotations_name_only_what_the_module_imports(path):
    missing = undefined_annotation_names(path.read_text())
    assert not missing, f"{path}: annotations name types the module does not import: {missing}"


def test_the_annotation_check_can_fail():
    planted = 'from __future__ import annotations\ndef f(pool: "PagePool", n: int) -> "list[Seat]":\n    return []\n'
    assert undefined_annotation_names(planted) == [(2, "PagePool"), (2, "Seat")]
    assert undefined_annotation_names("from x import PagePool\ndef f(pool: 'PagePool') -> None: ...\n") == []
