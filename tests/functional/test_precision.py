"""Recurrent matmul precision: user modes, the process-wide setting, the environment variable
``RECURRL_RNN_PRECISION`` and torch's float32 matmul precision, in that order."""

from __future__ import annotations

import pytest
import torch

from recurrl.functional.precision import (
    PRECISION_ENV_VAR,
    RecurrentMatmulPrecision,
    RecurrentMatmulPrecisionUserMode,
    _auto_mode,
    get_recurrent_matmul_precision,
    resolve_recurrent_matmul_precision,
    set_recurrent_matmul_precision,
    validate_recurrent_matmul_precision,
)

Mode = RecurrentMatmulPrecisionUserMode
Concrete = RecurrentMatmulPrecision


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    """No process mode, no env var and torch's default precision around every test."""
    monkeypatch.delenv(PRECISION_ENV_VAR, raising=False)
    torch_precision = torch.get_float32_matmul_precision()
    set_recurrent_matmul_precision(None)
    torch.set_float32_matmul_precision("highest")
    yield
    set_recurrent_matmul_precision(None)
    torch.set_float32_matmul_precision(torch_precision)


def test_env_var_name():
    assert PRECISION_ENV_VAR == "RECURRL_RNN_PRECISION"


def test_enums():
    assert [m.value for m in Concrete] == ["ieee", "tf32", "tf32x3"]
    assert {m.value for m in Mode} == {"ieee", "tf32", "tf32x3", "fast", "high-prec", "auto"}
    assert Mode("fast") == "fast"  # str enums compare with their values


@pytest.mark.parametrize(
    ("torch_mode", "expected"),
    [("highest", Mode.IEEE), ("high", Mode.HIGH_PREC), ("medium", Mode.FAST)],
)
def test_auto_follows_torch_float32_matmul_precision(torch_mode, expected):
    torch.set_float32_matmul_precision(torch_mode)
    assert _auto_mode() is expected


@pytest.mark.parametrize("mode", [m for m in Mode if m is not Mode.AUTO])
def test_set_recurrent_matmul_precision_modes(mode):
    set_recurrent_matmul_precision(mode.value)
    assert _auto_mode() is mode
    set_recurrent_matmul_precision(mode)  # the enum itself
    assert _auto_mode() is mode


def test_set_none_and_auto_clear_the_process_mode():
    torch.set_float32_matmul_precision("medium")
    set_recurrent_matmul_precision("tf32x3")
    set_recurrent_matmul_precision(None)
    assert _auto_mode() is Mode.FAST
    set_recurrent_matmul_precision("auto")
    assert _auto_mode() is Mode.FAST


@pytest.mark.parametrize("value", ["fp16", "", "IEEE", 3])
def test_set_invalid_mode(value):
    with pytest.raises(ValueError, match="must be one of"):
        set_recurrent_matmul_precision(value)
    assert _auto_mode() is Mode.IEEE  # unchanged


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ("tf32", Mode.TF32),
        ("fast", Mode.FAST),
        ("high-prec", Mode.HIGH_PREC),
        ("highest", Mode.IEEE),
        ("high", Mode.HIGH_PREC),
        ("medium", Mode.FAST),
    ],
)
def test_env_var(monkeypatch, env, expected):
    monkeypatch.setenv(PRECISION_ENV_VAR, env)
    assert _auto_mode() is expected


def test_env_var_auto_or_empty_defers_to_torch(monkeypatch):
    torch.set_float32_matmul_precision("high")
    for value in ["auto", ""]:
        monkeypatch.setenv(PRECISION_ENV_VAR, value)
        assert _auto_mode() is Mode.HIGH_PREC


def test_env_var_invalid(monkeypatch):
    monkeypatch.setenv(PRECISION_ENV_VAR, "bf16")
    with pytest.raises(ValueError, match=PRECISION_ENV_VAR) as info:
        _auto_mode()
    assert "'highest'" in str(info.value)  # torch's names are allowed there


def test_priority_process_then_env_then_torch(monkeypatch):
    torch.set_float32_matmul_precision("medium")
    assert _auto_mode() is Mode.FAST
    monkeypatch.setenv(PRECISION_ENV_VAR, "tf32x3")
    assert _auto_mode() is Mode.TF32X3
    set_recurrent_matmul_precision("ieee")
    assert _auto_mode() is Mode.IEEE


def test_torch_names_only_in_the_env_var():
    with pytest.raises(ValueError):
        set_recurrent_matmul_precision("highest")
    with pytest.raises(ValueError):
        validate_recurrent_matmul_precision("medium")


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("ieee", Concrete.IEEE),
        ("tf32", Concrete.TF32),
        ("tf32x3", Concrete.TF32X3),
        ("fast", Concrete.IEEE),
        ("high-prec", Concrete.IEEE),
    ],
)
def test_resolve_on_cpu(mode, expected):
    """GPU presets fall back to IEEE off Ampere; explicit TF32 modes are returned as asked."""
    assert resolve_recurrent_matmul_precision(mode, "cpu") is expected
    assert resolve_recurrent_matmul_precision(Mode(mode), None) is expected


def test_resolve_auto_goes_through_the_chain(monkeypatch):
    set_recurrent_matmul_precision("tf32")
    assert resolve_recurrent_matmul_precision("auto", "cpu") is Concrete.TF32
    set_recurrent_matmul_precision(None)
    monkeypatch.setenv(PRECISION_ENV_VAR, "tf32x3")
    assert resolve_recurrent_matmul_precision("auto") is Concrete.TF32X3
    monkeypatch.delenv(PRECISION_ENV_VAR)
    torch.set_float32_matmul_precision("medium")  # -> "fast" -> IEEE on CPU
    assert resolve_recurrent_matmul_precision("auto", "cpu") is Concrete.IEEE


def test_resolve_and_validate_invalid():
    with pytest.raises(ValueError, match="recurrent_matmul_precision"):
        resolve_recurrent_matmul_precision("bf16")
    with pytest.raises(ValueError, match="recurrent_matmul_precision"):
        validate_recurrent_matmul_precision("bf16")
    assert validate_recurrent_matmul_precision("high-prec") is Mode.HIGH_PREC


@pytest.mark.parametrize(
    ("process_mode", "expected"),
    [
        ("ieee", Concrete.IEEE),
        ("tf32", Concrete.TF32),
        ("tf32x3", Concrete.TF32X3),
        ("fast", Concrete.IEEE),  # presets resolve to ieee without tensor cores
        ("high-prec", Concrete.IEEE),
    ],
)
def test_get_recurrent_matmul_precision_is_concrete(process_mode, expected):
    set_recurrent_matmul_precision(process_mode)
    got = get_recurrent_matmul_precision("cpu")
    assert got is expected and got == expected.value
    assert isinstance(got, Concrete)


def test_get_recurrent_matmul_precision_follows_auto_and_default_device(monkeypatch):
    torch.set_float32_matmul_precision("highest")
    assert get_recurrent_matmul_precision("cpu") is Concrete.IEEE
    monkeypatch.setenv(PRECISION_ENV_VAR, "tf32x3")
    assert get_recurrent_matmul_precision("cpu") is Concrete.TF32X3
    # no argument: the current CUDA device, else the CPU; same answer as resolving "auto" there
    device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    set_recurrent_matmul_precision("fast")
    expected = resolve_recurrent_matmul_precision("auto", device)
    assert get_recurrent_matmul_precision() is expected


def test_get_recurrent_matmul_precision_is_exported_where_the_setter_is():
    import recurrl.functional as F
    import recurrl.modules as M

    assert M.get_recurrent_matmul_precision is get_recurrent_matmul_precision
    assert F.get_recurrent_matmul_precision is get_recurrent_matmul_precision
