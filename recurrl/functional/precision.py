"""Matmul precision of the fused recurrent GPU backend.

The ``triton`` backend's recurrent matmul can run in full IEEE float32 (``"ieee"``), in TF32
on tensor cores (``"tf32"``, cuDNN's default on Ampere and later), or in compensated TF32
(``"tf32x3"``, about 22 mantissa bits on tensor cores). Users may also ask for a preset that
depends on the GPU (``"fast"``, ``"high-prec"``) or for ``"auto"``, which follows, in order:
the process-wide mode set by :func:`set_recurrent_matmul_precision`, the environment variable
``RECURRL_RNN_PRECISION``, and :func:`torch.get_float32_matmul_precision`
(``"highest"`` -> ``"ieee"``, ``"high"`` -> ``"high-prec"``, ``"medium"`` -> ``"fast"``).
Other backends ignore the precision.
"""

from __future__ import annotations

import enum
import os

import torch

__all__ = [
    "PRECISION_ENV_VAR",
    "RecurrentMatmulPrecision",
    "RecurrentMatmulPrecisionUserMode",
    "get_recurrent_matmul_precision",
    "resolve_recurrent_matmul_precision",
    "set_recurrent_matmul_precision",
    "validate_recurrent_matmul_precision",
]

PRECISION_ENV_VAR = "RECURRL_RNN_PRECISION"


class RecurrentMatmulPrecision(str, enum.Enum):
    """A concrete precision of the recurrent matmul."""

    IEEE = "ieee"
    TF32 = "tf32"
    TF32X3 = "tf32x3"


class RecurrentMatmulPrecisionUserMode(str, enum.Enum):
    """Everything a user may ask for: a concrete precision, a GPU-aware preset, or ``auto``."""

    IEEE = "ieee"
    TF32 = "tf32"
    TF32X3 = "tf32x3"
    FAST = "fast"
    HIGH_PREC = "high-prec"
    AUTO = "auto"


_TORCH_TO_MODE = {"highest": "ieee", "high": "high-prec", "medium": "fast"}
_process_mode: RecurrentMatmulPrecisionUserMode | None = None


def _parse(mode: str | enum.Enum, source: str) -> RecurrentMatmulPrecisionUserMode:
    value = mode.value if isinstance(mode, enum.Enum) else mode
    value = _TORCH_TO_MODE.get(value, value) if source == PRECISION_ENV_VAR else value
    try:
        return RecurrentMatmulPrecisionUserMode(value)
    except ValueError:
        allowed = [m.value for m in RecurrentMatmulPrecisionUserMode]
        if source == PRECISION_ENV_VAR:
            allowed += list(_TORCH_TO_MODE)
        raise ValueError(f"{source} must be one of {allowed}, got {mode!r}.") from None


def set_recurrent_matmul_precision(mode: str | RecurrentMatmulPrecisionUserMode | None) -> None:
    """Set the process-wide precision that ``recurrent_matmul_precision="auto"`` resolves to.

    ``None`` clears it (``auto`` then follows ``RECURRL_RNN_PRECISION`` and torch's float32
    matmul precision).

    Examples:
        >>> set_recurrent_matmul_precision("tf32x3")
        >>> get_recurrent_matmul_precision()
        <RecurrentMatmulPrecision.TF32X3: 'tf32x3'>
        >>> set_recurrent_matmul_precision(None)
    """
    global _process_mode
    _process_mode = None if mode is None else _parse(mode, "recurrent matmul precision")


def _auto_mode() -> RecurrentMatmulPrecisionUserMode:
    """The mode ``"auto"`` currently stands for, before GPU-dependent resolution."""
    if _process_mode is not None and _process_mode is not RecurrentMatmulPrecisionUserMode.AUTO:
        return _process_mode
    env = os.environ.get(PRECISION_ENV_VAR)
    if env:
        parsed = _parse(env, PRECISION_ENV_VAR)
        if parsed is not RecurrentMatmulPrecisionUserMode.AUTO:
            return parsed
    return RecurrentMatmulPrecisionUserMode(_TORCH_TO_MODE[torch.get_float32_matmul_precision()])


def get_recurrent_matmul_precision(
    device: torch.device | str | None = None,
) -> RecurrentMatmulPrecision:
    """The concrete precision ``recurrent_matmul_precision="auto"`` runs at now.

    Follows the process-wide mode, ``RECURRL_RNN_PRECISION`` and torch's float32 matmul
    precision, in that order, and resolves the GPU-aware presets (``"fast"``,
    ``"high-prec"``) for ``device`` (default: the current CUDA device when CUDA is
    available, else the CPU). A module's own ``recurrent_matmul_precision`` other than
    ``"auto"`` overrides this; see :func:`resolve_recurrent_matmul_precision`.

    Returns:
        One of ``"ieee"``, ``"tf32"``, ``"tf32x3"`` (a :class:`RecurrentMatmulPrecision`,
        a ``str`` enum that compares equal to these strings).

    Examples:
        >>> set_recurrent_matmul_precision("fast")
        >>> get_recurrent_matmul_precision("cpu")  # no tensor cores: the preset gives ieee
        <RecurrentMatmulPrecision.IEEE: 'ieee'>
        >>> get_recurrent_matmul_precision("cpu") == "ieee"
        True
        >>> set_recurrent_matmul_precision(None)
    """
    if device is None:
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    return resolve_recurrent_matmul_precision(RecurrentMatmulPrecisionUserMode.AUTO, device)


def resolve_recurrent_matmul_precision(
    mode: str | RecurrentMatmulPrecisionUserMode, device: torch.device | str | None = None
) -> RecurrentMatmulPrecision:
    """Resolve a user mode to a concrete precision for ``device``.

    TF32 modes need a CUDA GPU of compute capability 8.0 (Ampere) or newer; elsewhere the
    presets resolve to ``"ieee"``. An explicit ``"tf32"``/``"tf32x3"`` is returned as asked.

    Examples:
        >>> resolve_recurrent_matmul_precision("fast", "cpu")
        <RecurrentMatmulPrecision.IEEE: 'ieee'>
        >>> resolve_recurrent_matmul_precision("tf32x3", "cpu")
        <RecurrentMatmulPrecision.TF32X3: 'tf32x3'>
    """
    user = _parse(mode, "recurrent_matmul_precision")
    if user is RecurrentMatmulPrecisionUserMode.AUTO:
        user = _auto_mode()
    if user.value in {p.value for p in RecurrentMatmulPrecision}:
        return RecurrentMatmulPrecision(user.value)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    ampere = (
        dev.type == "cuda"
        and torch.cuda.is_available()
        and (torch.cuda.get_device_capability(dev)[0] >= 8)
    )
    if not ampere:
        return RecurrentMatmulPrecision.IEEE
    fast = user is RecurrentMatmulPrecisionUserMode.FAST
    return RecurrentMatmulPrecision.TF32 if fast else RecurrentMatmulPrecision.TF32X3


def validate_recurrent_matmul_precision(mode: str | enum.Enum) -> RecurrentMatmulPrecisionUserMode:
    """Parse a constructor argument, raising ``ValueError`` with the allowed values."""
    return _parse(mode, "recurrent_matmul_precision")
