"""The recurrent modules' argument documentation: written once in ``RecurrentModule``, complete
in every subclass's ``__doc__`` (what ``help()``, the rendered docs and the doctests read)."""

from __future__ import annotations

import inspect

import pytest
from torch import nn

import recurrl.modules.gru
import recurrl.modules.lstm
from recurrl.modules import GRUModule, LSTMModule, RecurrentModule
from recurrl.modules._arg_docs import argument_entries, complete_arguments_doc


def _sections(cls: type) -> dict[str, list[str]]:
    """The parameter names each argument section of ``cls.__doc__`` lists, in order."""
    out: dict[str, list[str]] = {}
    doc = inspect.cleandoc(cls.__doc__)
    for header in ("Args:", "Keyword Args:"):
        part = doc.split(f"\n{header}\n", 1)
        body = part[1].split("\n\n", 1)[0] if len(part) == 2 else ""
        out[header] = list(argument_entries(f"Summary.\n\n{header}\n{body}"))
    return out


def _params(cls: type) -> tuple[list[str], list[str]]:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    keyword = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    return positional, keyword


@pytest.mark.parametrize("cls", [LSTMModule, GRUModule])
def test_every_constructor_parameter_is_documented_in_signature_order(cls):
    positional, keyword = _params(cls)
    sections = _sections(cls)
    assert sections["Args:"] == positional
    assert sections["Keyword Args:"] == keyword


def test_recurrl_subclasses_are_all_checked():
    assert set(RecurrentModule.__subclasses__()) >= {LSTMModule, GRUModule}
    for cls in RecurrentModule.__subclasses__():
        if cls.__module__.startswith("recurrl."):
            positional, keyword = _params(cls)
            assert set(argument_entries(cls.__doc__)) >= {*positional, *keyword}, cls


@pytest.mark.parametrize(
    ("module", "own"),
    [
        (recurrl.modules.lstm, {"proj_size", "in_key", "in_keys", "out_keys", "lstm"}),
        (recurrl.modules.gru, {"in_key", "in_keys", "out_keys", "gru"}),
    ],
)
def test_the_shared_arguments_are_written_once(module, own):
    """The subclass's source documents only its differences; the base has the rest."""
    source = inspect.getsource(module)
    source_doc = source.split('"""', 3)[3].split('"""', 1)[0]  # the class docstring
    assert set(argument_entries(source_doc)) == own
    base = argument_entries(RecurrentModule.__doc__)
    mine = argument_entries(source_doc)
    # what both document, the subclass describes differently (its state keys, its network)
    assert all(mine[name] != base[name] for name in set(base) & own)
    cls = module.__dict__[module.__all__[0]]
    params = {*_params(cls)[0], *_params(cls)[1]}
    assert params <= set(base) | own
    # the base documents its own constructor completely
    assert set(argument_entries(RecurrentModule.__doc__)) >= {*_params(RecurrentModule)[0],
                                                               *_params(RecurrentModule)[1]}


def test_entries_differing_from_the_base_are_the_subclass_own():
    assert "recurrent_state_h" in "\n".join(argument_entries(LSTMModule.__doc__)["in_key"])
    assert "recurrent_state" in "\n".join(argument_entries(GRUModule.__doc__)["in_key"])
    assert "nn.GRU" in "\n".join(argument_entries(GRUModule.__doc__)["gru"])


def test_an_undocumented_parameter_is_missing_from_the_doc():
    """What the tests above catch: a parameter documented nowhere is not invented."""

    class Undocumented(LSTMModule):
        """An LSTM with one more argument.

        Examples:
            >>> pass
        """

        def __init__(self, input_size: int, hidden_size: int, *, extra: int = 0, **kw) -> None:
            super().__init__(input_size, hidden_size, **kw)

    entries = argument_entries(Undocumented.__doc__)
    assert "extra" not in entries
    assert {"input_size", "hidden_size"} <= set(entries)  # the LSTM's entries, inherited
    assert Undocumented.__doc__.index("Args:") < Undocumented.__doc__.index("Examples:")


def test_a_subclass_of_a_subclass_gets_its_parent_entries_and_keeps_its_own():
    class Documented(LSTMModule):
        """An LSTM with one more argument.

        Keyword Args:
            extra: something new.
            lstm: a wrapped network, described differently.
        """

        def __init__(self, input_size: int, *, extra: int = 0, lstm: nn.Module | None = None):
            super().__init__(input_size, 4, in_key="x", out_key="y", lstm=lstm)

    sections = _sections(Documented)
    assert sections == {"Args:": ["input_size"], "Keyword Args:": ["extra", "lstm"]}
    entries = argument_entries(Documented.__doc__)
    assert entries["lstm"] == ["lstm: a wrapped network, described differently."]
    assert entries["input_size"] == ["input_size: features of the input."]


def test_a_class_without_its_own_doc_or_init_is_left_alone():
    class NoDoc(GRUModule):
        def __init__(self) -> None:
            super().__init__(2, 3, in_key="x", out_key="y")

    class NoInit(GRUModule):
        """Docstring kept as written."""

    assert NoDoc.__doc__ is None
    assert NoInit.__doc__ == "Docstring kept as written."


def test_complete_arguments_doc_keeps_unknown_entries_and_the_text_around():
    class Plain:
        """Summary.

        Args:
            b: own b.
            stale: a name the signature lacks.

        More text.
        """

        def __init__(self, a, b, *, c=0):
            pass

    shared = "Base.\n\nArgs:\n    a: shared a.\n    b: shared b.\n\nKeyword Args:\n    c: shared c."
    complete_arguments_doc(Plain, shared)
    assert Plain.__doc__ == (
        "Summary.\n\nArgs:\n    a: shared a.\n    b: own b.\n    stale: a name the signature "
        "lacks.\n\nKeyword Args:\n    c: shared c.\n\nMore text.\n"
    )
