"""Fixtures shared by the module tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _cpp_kernels(request):
    """A case parametrized with ``backend="cpp"`` needs recurrl's C++ kernels: built once per
    session, or the case is skipped with the reason (``cpp_extension``)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("backend") == "cpp":
        request.getfixturevalue("cpp_extension")
