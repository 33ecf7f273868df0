"""Argument documentation written once in a base class and completed in each subclass.

A base class documents the constructor arguments its subclasses share in the ``Args:`` and
``Keyword Args:`` sections of its docstring (Google style); a subclass documents only its own
arguments and those it describes differently. :func:`complete_arguments_doc` rewrites the
subclass's docstring so that those two sections list every parameter of its ``__init__``, in
signature order (positional parameters under ``Args:``, keyword-only ones under ``Keyword
Args:``), each with the subclass's own entry where it has one and the base's otherwise. The
result is what ``help()``, the rendered docs and the doctests read.
"""

from __future__ import annotations

import inspect
import re

__all__ = ["argument_entries", "complete_arguments_doc"]

#: the two sections that document constructor arguments, in the order they are written
SECTIONS = ("Args:", "Keyword Args:")
_ENTRY = re.compile(r"(\s+)(\*{0,2}\w+)(\s*\([^)]*\))?:(\s|$)")
_INDENT = "    "


def _split(doc: str) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """The cleaned docstring's lines and the ``[start, end)`` line span of each argument
    section (header included; trailing blank lines left outside)."""
    lines = inspect.cleandoc(doc).splitlines()
    spans: dict[str, tuple[int, int]] = {}
    i = 0
    while i < len(lines):
        header = lines[i].strip()
        if header in SECTIONS and not lines[i].startswith(" "):
            end = i + 1
            while end < len(lines) and (not lines[end].strip() or lines[end].startswith(" ")):
                end += 1
            while end > i + 1 and not lines[end - 1].strip():
                end -= 1
            spans[header] = (i, end)
            i = end
        else:
            i += 1
    return lines, spans


def _entries(lines: list[str]) -> dict[str, list[str]]:
    """``{name: lines}`` of one section's body, each entry dedented to its first line."""
    entries: dict[str, list[str]] = {}
    indent: int | None = None
    current: list[str] | None = None
    for line in lines:
        match = _ENTRY.match(line)
        if match and (indent is None or len(match.group(1)) == indent):
            indent = len(match.group(1))
            current = entries.setdefault(match.group(2).lstrip("*"), [])
            current.append(line[indent:])
        elif current is not None:
            current.append(line[indent:] if line.strip() else "")
    return entries


def argument_entries(doc: str | None) -> dict[str, list[str]]:
    """The entries of the argument sections of ``doc``: ``{name: lines}``, both sections
    together, in the order written."""
    if not doc:
        return {}
    lines, spans = _split(doc)
    entries: dict[str, list[str]] = {}
    for start, end in spans.values():
        entries.update(_entries(lines[start + 1 : end]))
    return entries


def complete_arguments_doc(cls: type, *shared_docs: str | None) -> None:
    """Rewrite ``cls.__doc__`` so that its argument sections document every parameter of
    ``cls.__init__``: the class's own entries first, those of ``shared_docs`` for the rest
    (the first docstring documenting a name wins: pass the nearest base first).

    Does nothing for a class without its own docstring or its own ``__init__``. Entries the
    class documents for a name its signature lacks stay at the end of their section. A
    parameter documented in neither place is left out (a test of the class should catch it).
    """
    doc, init = cls.__dict__.get("__doc__"), cls.__dict__.get("__init__")
    if not doc or init is None:
        return
    shared: dict[str, list[str]] = {}
    for shared_doc in reversed(shared_docs):
        shared.update(argument_entries(shared_doc))
    lines, spans = _split(doc)
    own_by_section = {h: _entries(lines[s + 1 : e]) for h, (s, e) in spans.items()}
    own = {name: entry for section in own_by_section.values() for name, entry in section.items()}
    positional, keyword = [], []
    for param in list(inspect.signature(init).parameters.values())[1:]:  # after self
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            positional.append(param.name)
        elif param.kind is param.KEYWORD_ONLY:
            keyword.append(param.name)
    names = {"Args:": positional, "Keyword Args:": keyword}
    documented = set(positional) | set(keyword)
    sections: list[str] = []
    for header in SECTIONS:
        body = [line for name in names[header] for line in own.get(name) or shared.get(name, ())]
        body += [
            line
            for name, entry in own_by_section.get(header, {}).items()
            if name not in documented
            for line in entry
        ]
        if body:
            if sections:
                sections.append("")
            sections += [header, *(_INDENT + line if line else "" for line in body)]
    if not sections:
        return
    if spans:  # the merged sections replace the class's own, where the first one stood
        first = min(start for start, _ in spans.values())
        keep = [
            line
            for i, line in enumerate(lines)
            if not any(start <= i < end for start, end in spans.values())
        ]
        before = sum(1 for i in range(first) if not any(s <= i < e for s, e in spans.values()))
    else:  # no argument section: before the examples, else at the end
        keep = lines
        heads = [i for i, line in enumerate(lines) if line.strip() in ("Examples:", "Example:")]
        before = heads[0] if heads else len(lines)
        if before and lines[before - 1].strip():
            sections.insert(0, "")
        sections.append("")
    merged = keep[:before] + sections + keep[before:]
    # at most one blank line between blocks (removing a section may leave two)
    out: list[str] = []
    for line in merged:
        if not line.strip() and out and not out[-1].strip():
            continue
        out.append(line)
    cls.__doc__ = "\n".join(out).strip() + "\n"
