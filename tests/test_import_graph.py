"""The layer rule, read from the source: every import of every module under ``recurrl/``.

Each subpackage of ``recurrl`` belongs to one layer (:data:`LAYERS`, lowest first, as in
``docs/implementation_details.md``, "Layers and imports"). A module may import its own
subpackage and the subpackages of lower layers, never a higher layer, and the subpackages
never import each other in a circle. Every import counts: top-level ones, those inside a
function or under ``if TYPE_CHECKING:``, and ``importlib.import_module("recurrl...")`` /
``__import__`` with a literal name (or a module-level constant holding one). A deferred
import hides a dependency from the reader without removing it.

A failure names the file, the line and the import, and the layers it crosses.
"""

from __future__ import annotations

import ast
import itertools
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import recurrl

#: The layers of the package, lowest first; a subpackage imports only its own layer's
#: code and lower layers. ``""`` is ``recurrl/__init__.py`` (the version string).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("", "_compat"),  # the version string; what differs between tensordict releases
    ("_ext",),  # C++ kernels, compiled on first use
    ("functional",),  # pure tensor code
    ("modules",),  # TensorDict modules
    ("data",),  # replay: storages, samplers, buffers
    ("envs",),  # envs, specs, transforms, the policy -> env transforms wiring
    ("collectors",),
    ("objectives",),
    ("trainers",),
    ("testing", "examples", "__main__"),  # shipped helpers and entry points
)

PACKAGE = Path(recurrl.__file__).resolve().parent


@dataclass(frozen=True)
class Import:
    """One import of a ``recurrl`` module, where it is written."""

    path: Path  # the importing file
    line: int
    source: str  # the import as written (one line)
    importer: str  # dotted name of the importing module
    target: str  # dotted name of the imported module

    def where(self, root: Path) -> str:
        return f"{self.path.relative_to(root.parent)}:{self.line}: {self.source}"


def module_name(path: Path, root: Path) -> str:
    """``recurrl/envs/common.py`` -> ``recurrl.envs.common`` (a package: its ``__init__``)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def subpackage(name: str) -> str:
    """The subpackage a dotted module name belongs to: ``recurrl.envs.gym`` -> ``envs``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def _string_constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "literal"`` assignments (a name handed to ``import_module``)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return found


def _dynamic_target(node: ast.Call, constants: dict[str, str]) -> str | None:
    """The module named by ``importlib.import_module(x)`` / ``__import__(x)``, if literal."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.Name):
        return constants.get(arg.id)
    return None


def _targets(node: ast.AST, package: str, modules: set[str], constants: dict[str, str]):
    """The dotted names an import node loads (``from a import b`` loads ``a.b`` when that
    is a module, else ``a``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        subs = [f"{source}.{alias.name}" for alias in node.names]
        return [s for s in subs if s in modules] or [source]
    if isinstance(node, ast.Call):
        target = _dynamic_target(node, constants)
        return [] if target is None else [target]
    return []


def iter_imports(root: Path = PACKAGE) -> Iterator[Import]:
    """Every import of a module of ``root``'s package, by every module under ``root``."""
    files = sorted(root.rglob("*.py"))
    modules = {module_name(path, root) for path in files}
    top = root.name
    for path in files:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        importer = module_name(path, root)
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        constants = _string_constants(tree)
        for node in ast.walk(tree):
            for target in _targets(node, package, modules, constants):
                if target == top or target.startswith(top + "."):
                    segment = ast.get_source_segment(text, node) or ast.unparse(node)
                    source = " ".join(segment.split())
                    yield Import(path, node.lineno, source, importer, target)


def upward_imports(
    imports: list[Import], layers: tuple[tuple[str, ...], ...] = LAYERS, root: Path = PACKAGE
) -> list[str]:
    """One line per import of a higher layer's module (file:line: import, and why)."""
    rank = {sub: height for height, layer in enumerate(layers) for sub in layer}
    found = []
    for imp in imports:
        src, dst = subpackage(imp.importer), subpackage(imp.target)
        if src != dst and rank[dst] > rank[src]:
            found.append(f"{imp.where(root)}  ({src or root.name} imports {dst}, a higher layer)")
    return found


def subpackage_circles(imports: list[Import], root: Path = PACKAGE) -> list[str]:
    """One line per circle of subpackages, each step shown by one import that makes it."""
    edges: dict[str, dict[str, Import]] = {}
    for imp in imports:
        src, dst = subpackage(imp.importer), subpackage(imp.target)
        if src != dst:
            edges.setdefault(src, {}).setdefault(dst, imp)

    def path(start: str, goal: str) -> list[str] | None:
        seen, stack = {start}, [[start]]
        while stack:
            route = stack.pop()
            for nxt in sorted(edges.get(route[-1], {})):
                if nxt == goal:
                    return [*route, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append([*route, nxt])
        return None

    circles, reported = [], set()
    for src in sorted(edges):
        for dst in sorted(edges[src]):
            back = path(dst, src)
            key = frozenset([src, *(back or [])])
            if back is None or key in reported:
                continue
            reported.add(key)
            route = [src, *back]
            steps = [edges[a][b].where(root) for a, b in itertools.pairwise(route)]
            shown = " -> ".join(name or root.name for name in route)
            circles.append(f"{shown}:\n      " + "\n      ".join(steps))
    return circles


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return list(iter_imports())


def test_every_subpackage_has_a_layer(imports):
    subs = {subpackage(module_name(p, PACKAGE)) for p in PACKAGE.rglob("*.py")}
    placed = {sub for layer in LAYERS for sub in layer}
    assert subs <= placed, (
        f"subpackages without a layer: {sorted(subs - placed)}. Fix: add each to LAYERS in "
        f"tests/test_import_graph.py (and to 'Layers and imports' in "
        f"docs/implementation_details.md), at the height of what it imports."
    )


def test_no_layer_imports_a_higher_one(imports):
    found = upward_imports(imports)
    assert not found, (
        f"{len(found)} import(s) of a higher layer (layers, lowest first: "
        f"{' < '.join('/'.join(s or 'recurrl' for s in layer) for layer in LAYERS)}):\n  "
        + "\n  ".join(found)
        + "\nFix: move the code to the layer it belongs to, or invert the dependency (the "
        "higher layer registers a callable with the lower one, or passes it in)."
    )


def test_no_circle_of_subpackages(imports):
    circles = subpackage_circles(imports)
    assert not circles, "subpackages importing each other in a circle:\n  " + "\n  ".join(circles)


# --- the checker itself, on a small made-up package --------------------------------------
def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_the_checker_sees_deferred_typing_relative_and_dynamic_imports(tmp_path):
    root = tmp_path / "pkg"
    _write(
        root,
        {
            "__init__.py": "",
            "low/__init__.py": "",
            "low/a.py": """\
                import importlib
                from typing import TYPE_CHECKING
                _HOME = "pkg.high.b"
                if TYPE_CHECKING:
                    from pkg.high import b
                def f():
                    from ..high.b import g
                    return importlib.import_module(_HOME), __import__("pkg.high")
                """,
            "high/__init__.py": "from pkg.low import a",
            "high/b.py": "import pkg.low.a\ndef g(): pass\n",
        },
    )
    imports = list(iter_imports(root))
    found = {(imp.importer, imp.target, imp.line) for imp in imports}
    assert found == {
        ("pkg.low.a", "pkg.high.b", 5),  # under TYPE_CHECKING
        ("pkg.low.a", "pkg.high.b", 7),  # relative, inside a function
        ("pkg.low.a", "pkg.high.b", 8),  # import_module(constant)
        ("pkg.low.a", "pkg.high", 8),  # __import__("...")
        ("pkg.high", "pkg.low.a", 1),  # from a package import a module
        ("pkg.high.b", "pkg.low.a", 1),
    }
    upward = upward_imports(imports, layers=(("",), ("low",), ("high",)), root=root)
    assert len(upward) == 4 and all("(low imports high, a higher layer)" in u for u in upward)
    assert upward[0].startswith("pkg/low/a.py:5: from pkg.high import b")
    assert upward_imports(imports, layers=(("",), ("high",), ("low",)), root=root) == [
        "pkg/high/__init__.py:1: from pkg.low import a  (high imports low, a higher layer)",
        "pkg/high/b.py:1: import pkg.low.a  (high imports low, a higher layer)",
    ]
    (circle,) = subpackage_circles(imports, root=root)
    assert circle.startswith("high -> low -> high:\n      pkg/high/__init__.py:1: from pkg.low")
