"""The C++ extension loader: availability, the build directory, errors, the AOT command."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

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


# ------------------------------------------------------------------ the build lock
def test_a_torch_lock_file_left_by_a_killed_build_is_removed_before_building(
    tmp_path, monkeypatch, capsys
):
    """torch's lock file only goes when its builder removes it: after a builder was killed,
    every later load would wait on it forever. recurrl's lock says it is stale."""
    import torch.utils.cpp_extension as cpp_extension

    directory = tmp_path / "build"
    directory.mkdir()
    (directory / "lock").touch()  # what a build killed mid-way leaves

    def load(**kwargs):
        assert not (directory / "lock").exists()  # torch would have waited on it forever
        Path(kwargs["build_directory"], f"{_ext.EXTENSION_NAME}.so").write_bytes(b"")

    monkeypatch.setattr(_ext, "_loaded", False)
    monkeypatch.setattr(_ext, "extension_unavailable_reason", lambda: None)
    monkeypatch.setenv("RECURRL_EXT_DIR", str(directory))
    monkeypatch.setattr(cpp_extension, "load", load)
    _ext.load_extension()
    assert _ext.extension_loaded()
    err = capsys.readouterr().err
    assert "left by a build of its C++ kernels that was killed" in err


@pytest.mark.skipif(sys.platform == "win32", reason="flock: POSIX only")
def test_the_build_lock_is_released_when_its_holder_is_killed(tmp_path):
    """A builder SIGKILLed while it holds the lock (a preempted node, a Ray worker replaced
    mid-build) does not block the next one."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from recurrl._ext import build_lock\n"
            "with build_lock(Path(sys.argv[1])):\n"
            "    Path(sys.argv[1], 'lock').touch()  # as torch's build does\n"
            "    print('held', flush=True); time.sleep(600)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        holder.kill()
        holder.wait(timeout=30)
        done = threading.Event()

        def acquire():
            with _ext.build_lock(tmp_path):
                done.set()

        thread = threading.Thread(target=acquire, daemon=True)
        thread.start()
        assert done.wait(timeout=30), "the lock of a killed builder was not released"
        assert not (tmp_path / "lock").exists()
    finally:
        holder.kill()


@pytest.mark.skipif(sys.platform == "win32", reason="flock: POSIX only")
def test_a_second_builder_waits_for_a_live_one_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(_ext, "_WAIT_NOTICE_S", 0.1)
    entered, release, order = threading.Event(), threading.Event(), []

    def first():
        with _ext.build_lock(tmp_path):
            (tmp_path / "lock").touch()  # a live build's torch lock: not stale, kept
            entered.set()
            release.wait(timeout=30)
            order.append("first")
            (tmp_path / "lock").unlink()

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    assert entered.wait(timeout=30)
    threading.Timer(0.5, release.set).start()
    with _ext.build_lock(tmp_path):
        order.append("second")
    thread.join(timeout=30)
    assert order == ["first", "second"]
    err = capsys.readouterr().err
    assert "waiting for another process building its C++ kernels" in err
    assert "removing" not in err
