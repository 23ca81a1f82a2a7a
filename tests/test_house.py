"""The house rules the source keeps, checked over every module of src/vflo: no module reaches into another
class's private members, and every ``# type: ignore`` says why in its own line."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "vflo"

#: Private names of other code a module may use, with why: documented members of the standard library.
ALLOWED_PRIVATE = {"os._exit": "the documented way for a forked child to end without running its parent's cleanup"}


def _defined_here(tree: ast.Module) -> set[str]:
    """Private names this module defines: functions, classes, attributes it assigns (``x._name = ...``), names
    in ``__slots__``, and names it binds at module or class level."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("_"):
            names.add(node.value)  # __slots__ entries
    return {n for n in names if n.startswith("_")}


def private_reaches(source: str) -> list[str]:
    """Where ``source`` touches a private member it does not define: ``obj._name`` (obj not ``self`` or ``cls``)
    and ``from module import _name``."""
    tree = ast.parse(source)
    own = _defined_here(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            text = ast.unparse(node)
            if node.attr not in own and text not in ALLOWED_PRIVATE:
                found.append(f"{node.lineno}: {text}")
        elif isinstance(node, ast.ImportFrom):
            found += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_module_touches_another_classes_private_members() -> None:
    planted = "class A:\n    def f(self, other):\n        return other._secret\n"
    assert private_reaches(planted) == ["3: other._secret"]  # the check can fail
    assert private_reaches("from vflo.helpers import _map\n") == ["1: from vflo.helpers import _map"]
    assert not private_reaches("class A:\n    def __init__(self):\n        self._x = 1\n    def g(self, o):\n"
                               "        return o._x\n")  # a class reading its own kind's member
    found = [f"{path.relative_to(SRC.parent)}:{hit}" for path in sorted(SRC.rglob("*.py"))
             for hit in private_reaches(path.read_text(encoding="utf-8"))]
    assert not found, "private members reached from outside:\n" + "\n".join(found)


IGNORE = re.compile(r"#\s*type:\s*ignore(\[[^\]]*\])?(?P<rest>.*)$")


def unexplained_ignores(source: str) -> list[int]:
    """Lines whose ``# type: ignore[...]`` is not followed by a comment saying why."""
    lines = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        m = IGNORE.search(token.string) if token.type == tokenize.COMMENT else None
        if m and len(m.group("rest").strip().lstrip("#").strip()) < 10:
            lines.append(token.start[0])
    return lines


def test_every_type_ignore_says_why() -> None:
    assert unexplained_ignores("x = f()  # type: ignore[arg-type]\n") == [1]  # the check can fail
    assert not unexplained_ignores("x = f()  # type: ignore[arg-type]  # f's stub lacks the overload\n")
    found = [f"{path.relative_to(SRC.parent)}:{line}" for path in sorted(SRC.rglob("*.py"))
             for line in unexplained_ignores(path.read_text(encoding="utf-8"))]
    assert not found, "a type: ignore without its reason in the line:\n" + "\n".join(found)
