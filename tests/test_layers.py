"""The package's import arrows point down: a module imports only from its own layer or the ones below.

Every import counts, at module level, inside a function (a lazy import is still a dependency) or under
``if TYPE_CHECKING:`` (a type a module names is knowledge it depends on: an upward type import is how a circle
between packages stays hidden while the code runs).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Bottom to top. A module belongs to the most specific prefix that names it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("vflo.errors", "vflo.roles", "vflo.seeding", "vflo.schema", "vflo.progress", "vflo.version", "vflo.lazy",
     "vflo.helpers", "vflo.blocks", "vflo.spill", "vflo.private"),
    ("vflo.executor",),
    ("vflo.comm",),
    ("vflo.data", "vflo.metrics", "vflo.dp"),
    ("vflo.nn", "vflo.trees"),
    ("vflo.party",),
    ("vflo.align",),
    ("vflo.methods",),
    ("vflo.federation.coordinator", "vflo.federation"),
    ("vflo.federation.session",),
    ("vflo.federation.simulation", "vflo.privacy", "vflo.artifacts", "vflo.shelf", "vflo.audit"),
    ("vflo.deploy", "vflo.scoring", "vflo.explorer"),
    ("vflo.experiments", "vflo.api", "vflo.flower", "vflo.worth"),
    ("vflo.transports",),
    ("vflo.serve",),
    ("vflo.cli", "vflo.__main__", "vflo"),
)


def rank(module: str) -> int:
    best, best_len = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    assert best >= 0, f"module {module} is in no layer: add it to LAYERS"
    return best


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(tree: ast.Module, module: str) -> list[str]:
    """Names of vflo modules ``module`` imports anywhere: at module level, in functions, under TYPE_CHECKING."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "vflo"]
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{module}: vflo uses absolute imports only"
            base = node.module or ""
            if base.split(".")[0] == "vflo":
                # `from vflo.data import images` imports the module vflo.data.images
                found += [f"{base}.{a.name}" if (SRC / Path(*base.split("."), a.name)).with_suffix(".py").exists()
                          else base for a in node.names]
    return found


def test_imports_point_down() -> None:
    upward = []
    for path in sorted((SRC / "vflo").rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for imported in _imports(tree, module):
            if rank(imported) > rank(module):
                upward.append(f"{module} (layer {rank(module)}) imports {imported} (layer {rank(imported)})")
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_every_module_has_a_layer() -> None:
    for path in (SRC / "vflo").rglob("*.py"):
        rank(_module_name(path))


def _package(module: str) -> str:
    """The package a module belongs to (``vflo.party.node`` -> ``vflo.party``); a top-level module is its own."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _cycles(edges: dict[str, set[str]]) -> list[str]:
    """Every node that reaches itself, with one path round."""
    found = []
    for start in sorted(edges):
        todo, seen = [(start, [start])], set()
        while todo:
            node, path = todo.pop()
            for nxt in sorted(edges.get(node, ())):
                if nxt == start:
                    found.append(" -> ".join([*path, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    todo.append((nxt, [*path, nxt]))
    return sorted(set(found))


def _import_graph(group: Callable[[str], str]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in sorted((SRC / "vflo").rglob("*.py")):
        module = _module_name(path)
        for imported in _imports(ast.parse(path.read_text(encoding="utf-8")), module):
            a, b = group(module), group(imported)
            if b not in (a, "vflo"):  # the package's own __init__ re-exports are not an edge
                edges.setdefault(a, set()).add(b)
    return edges


def test_no_cycle_between_packages_or_modules() -> None:
    """Packages and modules follow the layers too: none imports (inside functions and for types included) one
    that imports it back, however far round. Alignment and the methods declare their handlers with vflo.party
    below them; the coordinator's side, vflo.federation, sits above them; what a dataset is (vflo.data.catalog)
    sits below the modules that define datasets."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a -> b -> c -> a", "b -> c -> a -> b",
                                                               "c -> a -> b -> c"]  # the check can fail
    cycles = _cycles(_import_graph(_package)) + _cycles(_import_graph(lambda module: module))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
