"""``set_recurrent_mode``: context manager, decorator, nesting, values, thread-locality."""

from __future__ import annotations

import importlib
import threading

import pytest
import torch
from tensordict import TensorDict

from recurrl.modules import LSTMModule, recurrent_mode, set_recurrent_mode


def _in_thread(fn):
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as err:  # pragma: no cover - surfaced below
            box["error"] = err

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_default_is_sequential():
    assert recurrent_mode() is False


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, True), (False, False), ("recurrent", True), ("sequential", False)],
)
def test_context_manager_values(value, expected):
    with set_recurrent_mode(value) as ctx:
        assert recurrent_mode() is expected
        assert isinstance(ctx, set_recurrent_mode)
    assert recurrent_mode() is False


def test_default_argument_is_true():
    with set_recurrent_mode():
        assert recurrent_mode() is True


@pytest.mark.parametrize("value", ["Recurrent", "seq", 1, 0, None, "true"])
def test_bad_value(value):
    with pytest.raises(ValueError, match="'recurrent' or 'sequential'"):
        set_recurrent_mode(value)


def test_nesting_restores_the_enclosing_mode():
    with set_recurrent_mode(True):
        with set_recurrent_mode(False):
            assert recurrent_mode() is False
            with set_recurrent_mode("recurrent"):
                assert recurrent_mode() is True
            assert recurrent_mode() is False
        assert recurrent_mode() is True
    assert recurrent_mode() is False


def test_exception_inside_block_restores_mode():
    with pytest.raises(RuntimeError), set_recurrent_mode(True):
        raise RuntimeError("boom")
    assert recurrent_mode() is False


def test_open_block_count_returns_to_zero():
    """The count that lets the module skip the thread-local read: back to 0 after nested
    blocks, an exception and a block in another thread, and never 0 inside a block."""
    # the submodule (recurrl.modules.recurrent_mode is also the name of a function)
    rm = importlib.import_module("recurrl.modules.recurrent_mode")
    assert rm._open_blocks == 0 and rm._current() is None
    with set_recurrent_mode(True), set_recurrent_mode(False):
        assert rm._open_blocks == 2 and rm._current() is False
    with pytest.raises(RuntimeError), set_recurrent_mode(True):
        assert rm._open_blocks == 1
        raise RuntimeError("boom")
    assert _in_thread(lambda: _with_mode_in_block(rm)) == (1, True)
    assert rm._open_blocks == 0 and rm._current() is None


def _with_mode_in_block(rm):
    with set_recurrent_mode(True):
        return rm._open_blocks, rm._current()


def test_decorator():
    @set_recurrent_mode(True)
    def inside(a, *, b):
        """Docstring kept."""
        return recurrent_mode(), a + b

    assert inside(1, b=2) == (True, 3)
    assert recurrent_mode() is False
    assert inside.__name__ == "inside" and inside.__doc__ == "Docstring kept."

    @set_recurrent_mode("sequential")
    def seq():
        return recurrent_mode()

    with set_recurrent_mode(True):
        assert seq() is False
        assert recurrent_mode() is True


def test_same_object_reused_as_context_and_decorator():
    mode = set_recurrent_mode(True)
    with mode:
        assert recurrent_mode()
    with mode:
        with mode:
            assert recurrent_mode()
        assert recurrent_mode()
    assert not recurrent_mode()
    assert mode(lambda: recurrent_mode())() is True


def test_thread_started_inside_block_sees_module_default():
    plain = LSTMModule(3, 4, in_key="x", out_key="y")
    recurrent = LSTMModule(3, 4, in_key="x", out_key="y", default_recurrent_mode=True)
    with set_recurrent_mode(True):
        assert _in_thread(lambda: (recurrent_mode(), plain.recurrent_mode)) == (False, False)
        assert _in_thread(lambda: recurrent.recurrent_mode) is True
        assert plain.recurrent_mode is True  # main thread unaffected by the thread
    with set_recurrent_mode(False):
        assert _in_thread(lambda: recurrent.recurrent_mode) is True


def test_setting_in_a_thread_does_not_leak_to_main_thread():
    entered, release = threading.Event(), threading.Event()
    seen = {}

    def worker():
        with set_recurrent_mode(True):
            seen["thread"] = recurrent_mode()
            entered.set()
            release.wait(5)

    thread = threading.Thread(target=worker)
    thread.start()
    assert entered.wait(5)
    try:
        assert recurrent_mode() is False  # while the thread is inside its block
    finally:
        release.set()
        thread.join()
    assert seen["thread"] is True


def test_module_follows_the_mode():
    module = LSTMModule(3, 4, in_key="x", out_key="y")
    is_init = torch.zeros(2, 5, 1, dtype=torch.bool)
    is_init[:, 0] = True
    td = TensorDict(
        {
            "x": torch.randn(2, 5, 3),
            "is_init": is_init,
            "recurrent_state_h": torch.zeros(2, 5, 1, 4),
            "recurrent_state_c": torch.zeros(2, 5, 1, 4),
        },
        [2, 5],
    )
    # sequential mode treats [2, 5] as a batch of independent steps from zero states
    seq = module(td.clone())["y"]
    with set_recurrent_mode(True):
        rec = module(td.clone())["y"]
    torch.testing.assert_close(seq[:, 0], rec[:, 0])
    assert not torch.allclose(seq[:, 1:], rec[:, 1:])

    @set_recurrent_mode("recurrent")
    def loss(data):
        return module(data)["y"]

    torch.testing.assert_close(loss(td.clone()), rec)


def test_repr():
    assert repr(set_recurrent_mode("recurrent")) == "set_recurrent_mode(True)"
