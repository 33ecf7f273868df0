"""Sphinx configuration of recurrl's documentation site.

Build: ``bash docs/build.sh`` (``sphinx-build -W --keep-going``; every warning fails it).

Besides the usual settings this file holds one directive, one link rewrite and three checks:

* ``recurrl-api``: the API reference of one package, one autodoc entry per name of its
  ``__all__`` (plus the lazily imported names listed in :data:`LAZY`), so a new public name
  appears without editing any page. A name exported by several packages is documented in
  its home package (the one whose module path it lives under) and listed as an alias in the
  others.
* in the guides, a code span that names a public object (``LSTMModule``,
  ``recurrl.modules``, ``set_recurrent_mode()``) links to its API reference: the Markdown
  stays plain code, which reads the same on the repository;
* links to the repository files that the site shows as pages of their own
  (:data:`SITE_PAGES`, e.g. ``benchmarks/learning/README.md``) are pointed at those pages, so
  one Markdown link works both on the repository and on the site.
* a check, when the build starts, that every public name of every documented package has a
  docstring (a ``#:`` comment for data);
* a check that every ``recurrl <command> --help`` text written in a guide (a fenced ``text``
  block starting with ``usage: recurrl <command>``) is what the real parser
  (:func:`recurrl.trainers.cli.build_parser`) prints, so the guides read the same on the
  repository and never go stale: ``python docs/conf.py --update`` rewrites them;
* a check that every block generated from a registry (between ``<!-- generated: NAME -->``
  and ``<!-- /generated -->``: the backend and memory tables, ``auto``'s rule, see
  :data:`GENERATORS`) is what the registries give now; ``--update`` rewrites those too;
* a check that the rows a guide copies from another file (a table after a
  ``<!-- rows from PATH -->`` comment) are still lines of that file.

A failed check is a warning, hence an error under ``-W``.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import os
import re
import sys
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.ext.autodoc.preserve_defaults import update_defvalue
from sphinx.ext.napoleon.docstring import GoogleDocstring
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import inspect as sphinx_inspect
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import recurrl  # noqa: E402

logger = logging.getLogger("recurrl.docs")

project = "recurrl"
author = "the recurrl developers"
copyright = "the recurrl developers"
version = release = recurrl.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
]

# ``sphinx-build -b doctest`` runs the guides' ``testcode`` / ``testoutput`` blocks only: the
# ``>>>`` examples of the docstrings are run by the test suite (``--doctest-modules``).
doctest_test_doctest_blocks = ""

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "build.sh", "Thumbs.db", ".DS_Store"]
html_theme = "furo"
html_title = f"recurrl {release}"
html_static_path: list[str] = []
templates_path: list[str] = []

# Markdown: `#`-anchors of headings (links such as README.md#popgym), $...$ left alone.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]
suppress_warnings = ["myst.strikethrough"]

# Docstrings are Google style: Args, Keyword Args, Returns, Raises, Examples, Shapes.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # dataclass "Attributes:" must not repeat autodoc's field entries
napoleon_custom_sections = [("Shapes", "notes_style")]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_default_options = {"show-inheritance": True}
autodoc_inherit_docstrings = False  # a member without its own docstring is left out
autodoc_mock_imports = ["triton"]  # only the GPU kernels import it; never needed to document
add_module_names = False

# Every cross-reference must resolve (nitpicky), except those into the libraries recurrl
# builds on: CI has no network for their inventories.
nitpicky = True
EXTERNAL = {"torch", "tensordict", "gymnasium", "numpy", "np", "ray", "typing", "collections"}
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|tensordict|gymnasium|numpy|np|ray|argparse|collections|typing)(\..*)?"),
    (r"py:.*", r"(Tensor|TensorDict|TensorDictBase|NestedKey|Module|Parameter|Generator)"),
    (r"py:.*", r"(nn|td|gym|Path|Callable|Iterator|Iterable|Sequence|Mapping|Any|Literal)(\..*)?"),
    (r"py:.*", r"(pathlib|concurrent|multiprocessing|threading|enum|dataclasses|abc)(\..*)?"),
    (r"py:class", r"(T|_T|Self|NoneType|ellipsis|optional|callable|iterable)"),
]

# The ``--help`` texts of the guides: a fixed width, so they do not depend on the terminal.
os.environ["COLUMNS"] = "100"

# The packages of the API reference, in the order of its pages. A name's home is the
# listed package with the longest module path that contains its defining module.
PACKAGES = [
    "recurrl.modules",
    "recurrl.functional",
    "recurrl.functional.recurrent",
    "recurrl.envs",
    "recurrl.envs.transforms",
    "recurrl.collectors",
    "recurrl.data",
    "recurrl.objectives",
    "recurrl.trainers",
    "recurrl.testing",
]
# Public names kept out of ``__all__`` so that a star import does not import Ray.
LAZY = {
    "recurrl.collectors": [
        "RayCollector",
        "RemoteCollectorError",
        "MultiSyncCollector",
        "MultiAsyncCollector",
        "MultiSyncDataCollector",
        "MultiaSyncDataCollector",
    ],
    "recurrl.data": ["RayReplayBuffer"],
}


@functools.cache
def public_names(package: str) -> list[str]:
    """The public names of ``package``: its ``__all__`` plus the lazy ones."""
    module = importlib.import_module(package)
    return list(module.__all__) + LAZY.get(package, [])


def _defining_module(obj: object, package: str, name: str) -> str:
    module = getattr(obj, "__module__", None)
    if isinstance(module, str) and (inspect.isclass(obj) or inspect.isfunction(obj)):
        return module
    return package  # data: documented where it is exported


def home_of(obj: object, package: str, name: str) -> str:
    """The package whose page documents ``obj`` (others list it as an alias)."""
    module = _defining_module(obj, package, name)
    holders = [
        p for p in PACKAGES if any(getattr(_mod(p), n, None) is obj for n in public_names(p))
    ]
    inside = [p for p in holders if module == p or module.startswith(p + ".")]
    if inside:
        return max(inside, key=len)
    return holders[0] if holders else package


@functools.cache
def _mod(package: str):
    return importlib.import_module(package)


def _kind(obj: object) -> str:
    if inspect.isclass(obj):
        return "class"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "function"
    return "data"


def _data_doc(package: str, name: str) -> str:
    """The ``#:`` comment of a module-level constant, in its package or the module it came from."""
    candidates = [package]
    mod = _mod(package)
    for sub in sorted(sys.modules):
        if sub.startswith(package + ".") and getattr(sys.modules[sub], name, None) is getattr(
            mod, name
        ):
            candidates.append(sub)
    for candidate in candidates:
        try:
            analyzer = ModuleAnalyzer.for_module(candidate)
            docs = analyzer.find_attr_docs()
        except Exception:  # pragma: no cover - a module without source
            continue
        doc = docs.get(("", name))
        if doc and "".join(doc).strip():
            return "\n".join(doc)
    return ""


def check_docstrings(app) -> None:
    """Warn (an error under ``-W``) for each public name without documentation."""
    for package in PACKAGES:
        mod = _mod(package)
        if not (mod.__doc__ or "").strip():
            logger.warning(f"{package} has no module docstring")
        for name in public_names(package):
            obj = getattr(mod, name)
            if _kind(obj) == "data":
                if not _data_doc(home_of(obj, package, name), name):
                    logger.warning(
                        f"{package}.{name} is public but has no '#:' doc comment "
                        f"(write one on the line above its assignment)"
                    )
            elif not (obj.__doc__ or "").strip():
                logger.warning(f"{package}.{name} is public but has no docstring")


class PackageAPI(SphinxDirective):
    """``.. recurrl-api:: recurrl.envs``: module docstring, then each public name."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        package = self.arguments[0]
        mod = _mod(package)
        lines = [f".. automodule:: {package}", "   :no-members:", ""]
        aliases = []
        for name in public_names(package):
            obj = getattr(mod, name)
            home = home_of(obj, package, name)
            if home != package:
                aliases.append((name, home))
                continue
            kind = _kind(obj)
            if kind == "data":
                # The ``#:`` comment may sit in a submodule, where autodata would not look.
                lines.append(f".. py:data:: {package}.{name}")
                if isinstance(obj, (tuple, str, int, float)):
                    lines.append(f"   :value: {obj!r}")
                lines.append("")
                lines += ["   " + line for line in _data_doc(package, name).splitlines()]
            else:
                lines.append(f".. auto{kind}:: {package}.{name}")
                if kind == "class":
                    lines.append("   :members:")
            lines.append("")
        if aliases:
            lines += ["", ".. rubric:: Also exported here", ""]
            for name, home in aliases:
                role = {"class": "class", "function": "func", "data": "data"}[
                    _kind(getattr(mod, name))
                ]
                lines.append(f"* ``{package}.{name}``: :py:{role}:`{home}.{name}`")
            lines.append("")
        content = StringList(lines, source=f"<recurrl-api {package}>")
        node = nodes.section()
        node.document = self.state.document
        self.state.nested_parse(content, 0, node)
        return node.children


GUIDES = Path(__file__).resolve().parent / "guides"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# A fenced ``text`` block holding a ``--help`` text: group 1 the text, group 2 the command.
_HELP_BLOCK = re.compile(r"^```text\n(usage: recurrl ([\w-]+)\b.*?)^```$", re.S | re.M)


def help_text(command: str) -> str:
    """What ``recurrl <command> --help`` prints, 100 columns wide, without colours."""
    from recurrl.trainers.cli import build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return _ANSI.sub("", subs.choices[command].format_help())


def _stale_help_blocks(text: str) -> list[tuple[str, str, str]]:
    """(command, written, current) for each ``--help`` block of a guide that is out of date.

    Whitespace is compared loosely: another Python may wrap the same options differently.
    """
    stale = []
    for match in _HELP_BLOCK.finditer(text):
        written, command = match.group(1), match.group(2)
        current = help_text(command)
        if written.split() != current.split():
            stale.append((command, written, current))
    return stale


def check_help_texts(app) -> None:
    """Warn for each ``--help`` text of a guide that the parser no longer prints."""
    for path in sorted(GUIDES.glob("*.md")):
        for command, _, _ in _stale_help_blocks(path.read_text()):
            logger.warning(
                f"{path.relative_to(ROOT)}: its `recurrl {command} --help` text is not what "
                f"the parser prints (an option was added, renamed or documented anew); "
                f"Fix: run `python docs/conf.py --update`"
            )


def update_help_texts() -> None:
    """Rewrite the ``--help`` texts of the guides with what the parser prints now."""
    for path in sorted(GUIDES.glob("*.md")):
        text = path.read_text()
        stale = _stale_help_blocks(text)
        for _, written, current in stale:
            text = text.replace(written, current, 1)
        if stale:
            path.write_text(text)
            commands = ", ".join(f"recurrl {command} --help" for command, *_ in stale)
            print(f"{path.relative_to(ROOT)}: {commands}")


# A block generated from a registry: ``<!-- generated: NAME -->`` ... ``<!-- /generated -->``.
_GENERATED = re.compile(r"^<!-- generated: ([\w-]+) -->\n(.*?)^<!-- /generated -->$", re.S | re.M)


def _rst_to_md(text: str) -> str:
    """A docstring paragraph as Markdown: ``code`` literals and :role:`target` references as
    code spans (the last dotted part of a reference, as Sphinx shows it)."""
    text = re.sub(r":\w+:`~?([^`]*?)`", lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", text)
    return text.replace("``", "`")


def generated_backends() -> str:
    """The backend table: one row per registered backend, the cell kinds it runs."""
    import recurrl.modules  # noqa: F401  (registers the linear cell kinds)
    from recurrl.functional.recurrent import RECURRENT_BACKEND_REGISTRY, backend_refusal
    from recurrl.functional.recurrent.cell import CELL_KINDS

    kinds = list(CELL_KINDS)
    rows = [
        "| backend | what it is | "
        + " | ".join(f"`{k}`" for k in kinds)
        + ' | `recurrent_recompute="full"` |',
        "|---|---|" + "---|" * (len(kinds) + 1),
    ]
    for name, entry in RECURRENT_BACKEND_REGISTRY.items():
        runs = ["yes" if backend_refusal(name, k) is None else "no" for k in kinds]
        rows.append(
            f"| `{name}` | {entry.summary or '-'} | "
            + " | ".join(runs)
            + f" | {'yes' if entry.recompute else 'no'} |"
        )
    return "\n".join(rows) + "\n"


def generated_memories() -> str:
    """The memory table: one row per ``--memory`` name, its module and cell kind."""
    from recurrl.modules.registry import FEED_FORWARD, MEMORY_REGISTRY

    rows = ["| `--memory` | module | cell kind | state keys (trainer) |", "|---|---|---|---|"]
    for name, entry in MEMORY_REGISTRY.items():
        states = ", ".join(f"`<trunk>_{s}`" for s in entry.state_suffixes)
        cell = f"`{entry.cell}`" if entry.cell else "- (attention)"  # no cell kind: attention
        rows.append(f"| `{name}` | `{entry.module.__name__}` | {cell} | {states} |")
    rows.append(f"| `{FEED_FORWARD}` | (an MLP trunk, no memory) | - | - |")
    return "\n".join(rows) + "\n"


def generated_auto_rule() -> str:
    """``auto``'s rule: the paragraphs of :func:`resolve_backend`'s docstring before its
    examples, where the rule is written once."""
    from recurrl.functional.recurrent import resolve_backend

    doc = inspect.cleandoc(resolve_backend.__doc__ or "")
    body = doc.split("\n\n", 1)[1].split("Examples:", 1)[0].strip()
    paragraphs = [" ".join(p.split()) for p in body.split("\n\n")]
    return "\n\n".join(_rst_to_md(p) for p in paragraphs) + "\n"


#: What each generated block holds, by the name in its opening comment.
GENERATORS = {
    "backends": generated_backends,
    "memories": generated_memories,
    "auto-rule": generated_auto_rule,
}


def _stale_generated(text: str, where: str) -> list[tuple[str, str, str]]:
    """(name, written, current) for each generated block of ``text`` that is out of date."""
    stale = []
    for match in _GENERATED.finditer(text):
        name, written = match.group(1), match.group(2)
        if name not in GENERATORS:
            raise ValueError(
                f"{where}: unknown generated block {name!r}; known: {list(GENERATORS)}"
            )
        current = GENERATORS[name]()
        if written != current:
            stale.append((name, written, current))
    return stale


def _pages() -> list[Path]:
    return sorted(p for p in ROOT.joinpath("docs").rglob("*.md") if "_build" not in p.parts)


def check_generated(app) -> None:
    """Warn for each generated block whose registry says otherwise now."""
    for path in _pages():
        for name, _, _ in _stale_generated(path.read_text(), str(path)):
            logger.warning(
                f"{path.relative_to(ROOT)}: its generated {name!r} block is not what the "
                f"registries give now; Fix: run `python docs/conf.py --update`"
            )


def update_generated() -> None:
    """Rewrite the generated blocks with what the registries give now."""
    for path in _pages():
        text = path.read_text()
        stale = _stale_generated(text, str(path))
        for name, written, current in stale:
            head = f"<!-- generated: {name} -->\n"
            text = text.replace(head + written, head + current, 1)
        if stale:
            path.write_text(text)
            print(f"{path.relative_to(ROOT)}: " + ", ".join(name for name, *_ in stale))


_ROWS_FROM = re.compile(r"^<!-- rows from (\S+) -->$", re.M)


def check_copied_rows(app) -> None:
    """Warn for each table row a guide copies from another file that the file no longer has."""
    for path in sorted(GUIDES.glob("*.md")):
        text = path.read_text()
        for match in _ROWS_FROM.finditer(text):
            source = (path.parent / match.group(1)).resolve()
            lines = set(source.read_text().splitlines()) if source.is_file() else set()
            table = text[match.end() :].lstrip("\n").split("\n\n", 1)[0].splitlines()
            for row in table:
                if row not in lines:
                    logger.warning(
                        f"{path.relative_to(ROOT)}: a row copied from {match.group(1)} is no "
                        f"longer there (re-copy it from that file): {row[:80]}"
                    )


def _attribute_docstring(self: GoogleDocstring) -> list[str]:
    """An attribute's docstring as plain text.

    napoleon reads the text before a first colon as the attribute's type; recurrl's attribute
    and property docstrings start with a label instead ("Training algorithm: ppo, or dqn").
    """
    lines = [self._lines.next(), *self._dedent(self._consume_to_end())]
    return self.__class__(lines, self._config).lines()


GoogleDocstring._parse_attribute_docstring = _attribute_docstring


_MISSING = object()


@functools.cache
def _import(name: str) -> object | None:
    try:
        return importlib.import_module(name)
    except Exception:
        return None


@functools.cache
def _lookup(path: str) -> object:
    """The object at a dotted path (a module, then attributes), or ``_MISSING``."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        obj = _import(".".join(parts[:i]))
        if obj is None:
            continue
        for attr in parts[i:]:
            annotations = getattr(obj, "__annotations__", {}) if inspect.isclass(obj) else {}
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            elif attr in annotations:  # a dataclass field without a default
                obj = annotations[attr]
            elif inspect.isclass(obj) and _sets_attribute(obj, attr):
                obj = attr  # an instance attribute: it exists, nothing more to look at
            else:
                return _MISSING
        return obj
    return _MISSING


@functools.cache
def _source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""


def _sets_attribute(cls: type, attr: str) -> bool:
    """Whether a method of ``cls`` (or a base defined in recurrl) assigns ``self.<attr>``."""
    for base in cls.__mro__:
        if base.__module__.startswith("recurrl"):
            source = _source(base)
            if f"self.{attr} =" in source or f"self.{attr}: " in source:
                return True
    return False


@functools.cache
def _defined_in_recurrl(name: str) -> bool:
    """Whether some loaded recurrl module defines a class or function called ``name``."""
    for modname, module in list(sys.modules.items()):
        if modname.startswith("recurrl") and module is not None:
            obj = getattr(module, name, None)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__.startswith(
                "recurrl"
            ):
                return True
    return False


_DOCUMENTED: dict[int, str] = {}


def _documented_names() -> dict[int, str]:
    """id(object) -> the name it is documented under, for every public name."""
    if not _DOCUMENTED:
        for package in PACKAGES:
            mod = _mod(package)
            for name in public_names(package):
                obj = getattr(mod, name)
                if home_of(obj, package, name) == package:
                    _DOCUMENTED.setdefault(id(obj), f"{package}.{name}")
    return _DOCUMENTED


def resolve_missing(app, env, node, contnode):
    """Resolve a Python cross-reference that Sphinx could not, or let it fail.

    Docstrings name objects by their defining module (``recurrl.modules.nets.rnn.GRU``) or
    by a short name in scope; the reference pages document them under their public path
    (``recurrl.modules.GRU``). A target that is an existing object documented under
    another name links there; one that exists but is not public (a private helper, a
    standard-library exception) is shown as code; one that does not exist at all (a typo, a
    renamed object) stays a warning, which fails the build.
    """
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    if target.split(".")[0] in EXTERNAL:
        return None  # left to nitpick_ignore_regex
    module = node.get("py:module") or ""
    cls = node.get("py:class") or ""
    candidates = [target]
    if module and cls:
        candidates.append(f"{module}.{cls}.{target}")
    if module:
        candidates.append(f"{module}.{target}")
    # The docstring's own module (``...:docstring of recurrl.functional.sequences.split_pieces``)
    # holds the names its text may use unqualified.
    source = node.source or ""
    if "docstring of " in source:
        owner = source.rsplit("docstring of ", 1)[1].split(".")
        candidates += [".".join([*owner[:i], target]) for i in range(len(owner), 0, -1)]
    documented = _documented_names()
    domain = env.get_domain("py")
    known = domain.objects
    for candidate in candidates:
        if _lookup(candidate) is _MISSING:
            continue
        parts = candidate.split(".")
        for i in range(len(parts), 0, -1):
            owner = _lookup(".".join(parts[:i]))
            if owner is not _MISSING and id(owner) in documented:
                public = ".".join([documented[id(owner)], *parts[i:]])
                if public in known:
                    return domain.resolve_xref(
                        env, node["refdoc"], app.builder, "obj", public, node, contnode
                    )
        return contnode  # exists, but is not part of the documented API
    # A short name of a public object (``StepCounter`` in a docstring of recurrl.data).
    short = target.split(".")[-1]
    matches = sorted({n for n in documented.values() if n.split(".")[-1] == short})
    if len(matches) == 1:
        return domain.resolve_xref(
            env, node["refdoc"], app.builder, "obj", matches[0], node, contnode
        )
    if "." not in target and _defined_in_recurrl(target):
        return contnode  # e.g. an exception of a private module named in "Raises:"
    return None


_LITERAL = re.compile(r"""((?<![^\s'"(\[{<\-/:])``.+?``)""")  # where rst starts a literal


def _escape_bars(text: str) -> str:
    parts = _LITERAL.split(text)
    return "".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def plain_bars(app, what: str, name: str, obj: object, options: dict, lines: list[str]) -> None:
    """Escape ``|`` in docstring prose: recurrl writes ``|x|`` for an absolute value.

    reStructuredText would read ``|x|`` as a substitution (an error); the field docstrings of
    the training config double as ``--help`` text and stay plain. Inline literals, literal
    blocks and ``>>>`` examples are left as they are.
    """
    literal_indent: int | None = None
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if literal_indent is not None:
            if not stripped or indent > literal_indent:
                continue
            literal_indent = None
        if stripped.startswith((">>>", "...", "|", "+")):
            continue
        lines[i] = _escape_bars(line)
        if stripped.endswith("::"):
            literal_indent = indent


def init_signature(app, what, name, obj, options, signature, return_annotation):
    """A class's signature from its ``__init__`` where a ``__new__`` or a metaclass hides it.

    tensordict's module base defines ``__new__(cls, *args, **kwargs)`` and the envs' metaclass
    a ``__call__``; autodoc prefers those to ``__init__``, so every module, loss and env
    would show ``(*args, **kwargs)``.
    """
    if what != "class" or not (signature or "").startswith("(*args"):
        return None
    try:
        update_defvalue(app, obj.__init__, True)  # defaults as written (autodoc_preserve_defaults)
        sig = sphinx_inspect.signature(obj.__init__, bound_method=True, type_aliases={})
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    if params and params[0].kind is inspect.Parameter.VAR_POSITIONAL:
        return None  # ``__init__`` takes anything too: nothing better to show
    env_meta = any(meta.__name__ == "_EnvMeta" for meta in type(obj).__mro__)
    if env_meta and "policy" not in sig.parameters:
        # every env constructor takes ``policy=`` (its metaclass adds the transforms)
        extra = inspect.Parameter("policy", inspect.Parameter.KEYWORD_ONLY, default=None)
        tail = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
        params = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
        sig = sig.replace(parameters=[*params, extra, *tail])
    return sphinx_inspect.stringify_signature(sig, show_return_annotation=False), None


_BARE_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|[#/.])([^)\s]+)\)")

#: The repository files that the site shows as pages of their own, by including them: a link
#: to one of them (right on the repository) is pointed at its page on the site.
SITE_PAGES = {
    "benchmarks/learning/README.md": "results",
    "benchmarks/README.md": "benchmarks",
    "benchmarks/HISTORY.md": "history",
}
_FILE_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|[#/])([^)\s#]+)(#[^)\s]*)?\)")


def _site_page_links(text: str, folder: Path) -> str:
    """``text`` with its links to the files of :data:`SITE_PAGES` pointed at their pages."""

    def to_page(match: re.Match) -> str:
        target = (folder / match.group(1)).resolve()
        if not target.is_relative_to(ROOT):
            return match.group(0)
        page = SITE_PAGES.get(target.relative_to(ROOT).as_posix())
        if page is None:
            return match.group(0)
        return f"](/{page}.md{match.group(2) or ''})"  # "/": from the documentation's root

    return _FILE_LINK.sub(to_page, text)


@functools.cache
def _code_targets() -> dict[str, tuple[str, str]]:
    """Code span text -> (role, documented name) for every public object and package.

    A short name that two documented objects share links nowhere (it stays plain code).
    """
    targets: dict[str, tuple[str, str]] = {}
    shared: set[str] = set()
    for full in _documented_names().values():
        targets[full] = ("obj", full)
        short = full.rsplit(".", 1)[1]
        if short in targets and targets[short][1] != full:
            shared.add(short)
        targets.setdefault(short, ("obj", full))
    for short in shared:
        del targets[short]
    for package in PACKAGES:
        targets[package] = ("mod", package)
    return targets


def link_code_spans(app, doctree: nodes.document) -> None:
    """In the guides and the index, turn code spans that name public objects into links."""
    docname = app.env.docname
    if not (docname.startswith("guides/") or docname == "index"):
        return
    targets = _code_targets()
    for literal in list(doctree.findall(nodes.literal)):
        if isinstance(literal.parent, (nodes.reference, addnodes.pending_xref)):
            continue
        text = literal.astext()
        target = targets.get(text.removesuffix("()"))
        if target is None:
            continue
        role, name = target
        xref = addnodes.pending_xref(
            "", refdomain="py", reftype=role, reftarget=name, refdoc=docname, refexplicit=True
        )
        xref += nodes.literal(text, text, classes=["xref", "py"])
        literal.replace_self(xref)


def page_links(app, docname: str, source: list[str]) -> None:
    """Point a Markdown page's links to the files of :data:`SITE_PAGES` at their pages."""
    path = Path(app.env.doc2path(docname))
    if path.suffix == ".md":
        source[0] = _site_page_links(source[0], path.parent)


def relative_links(app, relative_path: Path, parent_docname: str, content: list[str]) -> None:
    """Fix the relative links of an included Markdown file.

    Links to the files of :data:`SITE_PAGES` go to their pages. The pages that include
    ``benchmarks/*.md`` pass ``:relative-docs: .``, which resolves the links starting with
    ``.`` from the included file's folder; the bare ones are prefixed with ``./``, since
    ``[x](popgym_table.py)`` would otherwise be looked up next to the including page and fail.
    """
    if str(relative_path).endswith(".md"):
        folder = (Path(app.srcdir) / relative_path).resolve().parent
        content[0] = _BARE_LINK.sub(r"](./\1)", _site_page_links(content[0], folder))


def setup(app) -> dict[str, object]:
    app.connect("source-read", page_links)
    app.connect("doctree-read", link_code_spans)
    app.connect("include-read", relative_links)
    app.connect("autodoc-process-docstring", plain_bars)
    app.connect("autodoc-process-signature", init_signature)
    app.connect("missing-reference", resolve_missing)
    app.add_directive("recurrl-api", PackageAPI)
    app.connect("builder-inited", check_docstrings)
    app.connect("builder-inited", check_help_texts)
    app.connect("builder-inited", check_copied_rows)
    app.connect("builder-inited", check_generated)
    return {"parallel_read_safe": True}


if __name__ == "__main__":
    if sys.argv[1:] not in (["--update"], ["--update-help"]):
        sys.exit(
            "usage: python docs/conf.py --update   (rewrite the guides' --help texts and the "
            "blocks generated from the registries)"
        )
    update_help_texts()
    update_generated()
