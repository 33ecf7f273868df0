"""The configs' shared checks (recurrl/trainers/_config_checks.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import pytest

from recurrl.trainers._config_checks import (
    check_entries,
    check_frames,
    field_docs,
    finite,
    positive,
)


@dataclass
class _Toy:
    size: int = 2
    """How many."""
    rate: float = 0.5
    """How fast."""
    kind: Literal["a", "b"] = "a"
    """Which one."""
    limit: int | None = None
    """At most this many; None: no limit."""


def test_field_docs_reads_attribute_docstrings():
    assert field_docs(_Toy) == {
        "size": "How many.", "rate": "How fast.", "kind": "Which one.",
        "limit": "At most this many; None: no limit.",
    }  # fmt: skip


def test_value_checks_name_the_field_and_the_fix():
    positive("Toy", size=1)
    with pytest.raises(ValueError, match=r"Toy: size must be an int >= 1, received True"):
        positive("Toy", size=True)
    with pytest.raises(
        ValueError, match=r"rate must be a finite number, received nan\. Fix: --rate 0\.5"
    ):
        finite(_Toy(rate=math.nan))
    check_frames("Toy", 2000, 1000)
    with pytest.raises(ValueError, match=r"frames=2500 .* Fix: --frames 2000"):
        check_frames("Toy", 2500, 1000)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1], "must be a JSON object of _Toy entries"),
        ({"colour": 1}, "unknown entry colour"),
        ({"size": 2.0}, "size must be int, received 2.0"),
        ({"size": True}, "size must be int, received True"),
        ({"kind": "c"}, "kind must be one of 'a', 'b'"),
        ({"limit": "3"}, "limit must be int or null"),
    ],
)
def test_check_entries_refuses_wrong_json(data, message):
    with pytest.raises(ValueError, match=message):
        check_entries(_Toy, data, "")


def test_check_entries_accepts_json_types_and_skips_nested_entries():
    check_entries(_Toy, {"size": 3, "rate": 1, "kind": "b", "limit": None}, "")  # int for float
    check_entries(_Toy, {"size": {"any": "thing"}}, "", nested={"size"})
