"""No method is named outside the methods package: the rest of vflo reads what a method says of itself (its
tags) through the registry, so adding a method touches only its module, one registry line and its tests.

Scanned: every string literal in ``src/vflo`` outside ``vflo/methods/``, docstrings aside (they may give an
example). A method's own module may name the baselines it compares with (its claims, its fallback). A message kind
(``rap.project``) is the protocol's vocabulary, declared by its handler, not a method's name: the privacy views
read the messages that crossed by kind.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from vflo.methods.registry import get_method, method_names

SRC = Path(__file__).resolve().parents[1] / "src" / "vflo"

#: Strings that are a method's name by coincidence, with why: (file, string).
NOT_A_METHOD = {
    ("flower/local.py", "local"): "the name of Flower's local SuperLink federation",
}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _kinds() -> set[str]:
    from vflo.audit import handler_infos

    return set(handler_infos())


def named_methods(path: Path, names: list[str]) -> list[str]:
    """Where the file at ``path`` names a registered method: in a string (a whole word of it) or as an
    identifier, docstrings aside."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    kinds = _kinds()
    words = re.compile(r"(?<![\w.\-])(" + "|".join(map(re.escape, names)) + r")(?![\w\-])")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip \
                and node.value not in kinds:
            rel = path.relative_to(SRC).as_posix() if path.is_relative_to(SRC) else path.name
            for m in words.finditer(node.value):
                if (rel, node.value) not in NOT_A_METHOD:
                    found.append(f"{rel}:{node.lineno}: {m.group(1)!r} in {node.value[:60]!r}")
    return found


def test_no_method_is_named_outside_the_methods_package(tmp_path: Path) -> None:
    # Ordinary words ("local", "single", "ablation", "centralized") are method names only as a whole string.
    distinctive = [n for n in method_names() if "_" in n or n in ("splitnn", "fedsvd", "vfedtrans", "rap", "ldp",
                                                                   "secureboost")]
    # The check can fail: a message listing a method is found.
    probe = tmp_path / "probe.py"
    probe.write_text('"""A docstring may name apc_vfl."""\nMESSAGE = "use laser_vfl or splitnn with party_dropout"\n')
    assert len(named_methods(probe, distinctive)) == 2
    found: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        if "methods" in path.relative_to(SRC).parts:
            continue
        found += named_methods(path, distinctive)
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and node.value in method_names() and id(node) not in skip
                    and (rel, node.value) not in NOT_A_METHOD):
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found, "name no method outside vflo/methods/; read its tags through the registry:\n" + \
        "\n".join(sorted(set(found)))


def test_every_registered_name_resolves() -> None:
    assert all(get_method(n).name == n for n in method_names())
