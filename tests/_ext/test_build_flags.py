"""The build directory stays the same once the kernels are loaded.

torch's ``cpp_extension.load()`` appends its own linker flags (``-L<torch lib>``,
``-ltorch``, ...) to the ``extra_ldflags`` list it is given, in place; the flags are hashed
into the build directory's name, so the loader must hand torch copies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from recurrl import _ext
from recurrl._ext import __main__ as ext_main


@pytest.fixture
def fake_torch_load(tmp_path, monkeypatch) -> list[dict[str, Any]]:
    """``cpp_extension.load`` replaced by one that mutates its flag lists as torch's does and
    writes the library into the build directory; ``~`` is ``tmp_path``."""
    import torch.utils.cpp_extension as cpp_extension

    calls: list[dict[str, Any]] = []

    def load(**kwargs: Any) -> None:
        calls.append(kwargs)
        kwargs["extra_cflags"].append("-DTORCH_API_INCLUDE_EXTENSION_H")
        kwargs["extra_ldflags"].extend(["-L/torch/lib", "-lc10", "-ltorch_cpu", "-ltorch"])
        Path(kwargs["build_directory"], f"{_ext.EXTENSION_NAME}.so").write_bytes(b"")

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RECURRL_EXT_DIR", raising=False)
    monkeypatch.setattr(_ext, "_loaded", False)
    monkeypatch.setattr(_ext, "extension_unavailable_reason", lambda: None)
    monkeypatch.setattr(cpp_extension, "load", load)
    return calls


def test_loading_leaves_the_flags_and_the_build_directory_unchanged(fake_torch_load):
    flags = (_ext._CFLAGS, _ext._LDFLAGS)
    before = _ext.build_directory()
    _ext.load_extension()
    assert flags == (_ext._CFLAGS, _ext._LDFLAGS)
    assert _ext.build_directory() == before == Path(fake_torch_load[0]["build_directory"])
    assert (before / f"{_ext.EXTENSION_NAME}.so").is_file()


def test_build_ext_prints_the_folder_that_holds_the_library(fake_torch_load, capsys):
    assert ext_main.main([]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("recurrl C++ kernels built and loaded from ")
    folder = Path(out.removeprefix("recurrl C++ kernels built and loaded from "))
    assert folder.is_dir() and (folder / f"{_ext.EXTENSION_NAME}.so").is_file()
    assert folder == Path(fake_torch_load[0]["build_directory"])


def test_each_build_gets_fresh_flag_lists(fake_torch_load):
    """Two loads in one process (e.g. after a failed first one) start from the same flags."""
    _ext.load_extension()
    _ext._loaded = False  # restored by the fixture's monkeypatch
    _ext.load_extension()
    first, second = fake_torch_load
    assert first["build_directory"] == second["build_directory"]
    assert first["extra_ldflags"] == second["extra_ldflags"]  # each mutated once, from a copy
    assert list(_ext._LDFLAGS) == second["extra_ldflags"][: len(_ext._LDFLAGS)]
