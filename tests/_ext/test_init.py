"""The C++ extension loader: availability, the build directory, errors, the AOT command."""

from __future__ import annotations

import pytest
import torch

from recurrl import _ext
from recurrl._ext import __main__ as ext_main


def test_unavailable_reason_names_the_missing_program(monkeypatch):
    monkeypatch.setattr(_ext, "_loaded", False)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(_ext.shutil, "which", lambda name: None)
    assert _ext.extension_unavailable_reason() == "no C++ compiler (g++/c++) on PATH"
    monkeypatch.setattr(_ext.shutil, "which", lambda name: None if name == "ninja" else name)
    assert "ninja" in _ext.extension_unavailable_reason()
    monkeypatch.setenv("CXX", "my-cxx")
    monkeypatch.setattr(_ext.shutil, "which", lambda name: None)
    assert "$CXX='my-cxx'" in _ext.extension_unavailable_reason()


def test_load_without_compiler_says_what_to_do(monkeypatch):
    monkeypatch.setattr(_ext, "_loaded", False)
    monkeypatch.setattr(_ext, "extension_unavailable_reason", lambda: "no C++ compiler (g++/c++)")
    with pytest.raises(RuntimeError, match=r"expected a C\+\+ compiler.*received: no C\+\+.*Fix"):
        _ext.load_extension()
    assert ext_main.main([]) == 1


def test_build_directory_follows_the_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("RECURRL_EXT_DIR", raising=False)
    src = tmp_path / "a.cpp"
    src.write_text("int a;")
    first = _ext.build_directory([src])
    assert first == _ext.build_directory([src])
    assert first.parent == _ext.Path.home() / ".cache" / "recurrl" / "ext"
    assert first.name.startswith(torch.__version__.replace("+", "_"))
    src.write_text("int b;")
    assert _ext.build_directory([src]) != first
    monkeypatch.setenv("RECURRL_EXT_DIR", str(tmp_path / "here"))
    assert _ext.build_directory([src]) == tmp_path / "here"


def test_each_copy_of_the_sources_builds_apart(tmp_path, monkeypatch):
    """torch's build file names the sources by path: two copies sharing a directory would
    rebuild it whenever the other one loads."""
    monkeypatch.delenv("RECURRL_EXT_DIR", raising=False)
    copies = [tmp_path / "one" / "a.cpp", tmp_path / "two" / "a.cpp"]
    for src in copies:
        src.parent.mkdir()
        src.write_text("int a;")
    assert _ext.build_directory([copies[0]]) != _ext.build_directory([copies[1]])


def test_build_directory_follows_the_headers(tmp_path, monkeypatch):
    """A header is compiled into every source that includes it: a change builds afresh."""
    monkeypatch.delenv("RECURRL_EXT_DIR", raising=False)
    monkeypatch.setattr(_ext, "_CSRC", tmp_path)
    src = tmp_path / "a.cpp"
    src.write_text('#include "a.h"')
    (tmp_path / "a.h").write_text("int a;")
    first = _ext.build_directory([src])
    (tmp_path / "a.h").write_text("int b;")
    assert _ext.build_directory([src]) != first


def test_sources_are_every_cpp_file_sorted():
    sources = _ext.source_files()
    assert sources == sorted(sources)
    assert any(s.name == "rnn.cpp" for s in sources)


def test_build_failure_carries_the_compiler_output(tmp_path, monkeypatch, capsys):
    import torch.utils.cpp_extension as cpp_extension

    def failing_load(**kwargs):
        assert kwargs["extra_cflags"][0] == "-O3" and kwargs["is_python_module"] is False
        raise RuntimeError("Error building extension 'recurrl_ext':\nrnn.cpp:1: error: boom")

    monkeypatch.setattr(_ext, "_loaded", False)
    monkeypatch.setattr(_ext, "extension_unavailable_reason", lambda: None)
    monkeypatch.setenv("RECURRL_EXT_DIR", str(tmp_path / "build"))
    monkeypatch.setattr(cpp_extension, "load", failing_load)
    with pytest.raises(RuntimeError) as info:
        _ext.load_extension()
    message = str(info.value)
    assert "expected a working C++ toolchain" in message and "received RuntimeError" in message
    assert "Fix:" in message and "rnn.cpp:1: error: boom" in message
    assert "compiling its C++ kernels" in capsys.readouterr().err
    assert not _ext.extension_loaded()


def test_load_registers_the_ops(capsys):
    reason = _ext.extension_unavailable_reason()
    if reason is not None:
        pytest.skip(f"recurrl's C++ kernels cannot be built here: {reason}")
    _ext.load_extension()
    _ext.load_extension()  # idempotent
    assert _ext.extension_loaded()
    assert hasattr(torch.ops.recurrl, "lstm_scan_forward")
    assert hasattr(torch.ops.recurrl, "gru_scan_backward")
    assert ext_main.main([]) == 0
    assert "built and loaded from" in capsys.readouterr().out


def test_try_load_returns_the_failure_once_and_remembers_it(monkeypatch):
    calls = []

    def failing_load():
        calls.append(1)
        raise RuntimeError("recurrl's C++ kernels cannot be built: no C++ compiler")

    monkeypatch.setattr(_ext, "_loaded", False)
    monkeypatch.setattr(_ext, "_failure", None)
    monkeypatch.setattr(_ext, "load_extension", failing_load)
    assert "no C++ compiler" in _ext.try_load_extension()
    assert "no C++ compiler" in _ext.try_load_extension()
    assert calls == [1]  # no second build attempt in the process
    monkeypatch.setattr(_ext, "_loaded", True)
    assert _ext.try_load_extension() is None
