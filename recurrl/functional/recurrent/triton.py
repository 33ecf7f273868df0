"""Availability checks for the ``triton`` backend (fused GPU kernel of the scan)."""

from __future__ import annotations

import importlib.util
import os

import torch

__all__ = ["triton_unavailable_reason"]


def triton_unavailable_reason(device: torch.device | str | None = None) -> str | None:
    """Why ``recurrent_backend="triton"`` cannot run here, or ``None`` if it can.

    The backend needs the optional ``triton`` package (``pip install 'recurrl[gpu]'``) and a
    CUDA device; ``TRITON_INTERPRET=1`` lets Triton execute kernels on CPU tensors.

    Examples:
        >>> reason = triton_unavailable_reason("cpu")
        >>> reason is None or isinstance(reason, str)
        True
    """
    if importlib.util.find_spec("triton") is None:
        return (
            "recurrent_backend='triton' needs the optional dependency triton, which is not "
            "installed. Install it with: pip install 'recurrl[gpu]' (or pick "
            "recurrent_backend='pad' or 'scan', which need nothing extra)."
        )
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    on_cuda = torch.device(device).type == "cuda" if device is not None else False
    if not (on_cuda or interpret or torch.cuda.is_available()):
        return (
            "recurrent_backend='triton' runs on CUDA devices, and none is available. Use "
            "recurrent_backend='pad' or 'scan' on CPU, or set TRITON_INTERPRET=1 to run the "
            "kernel in Triton's CPU interpreter (slow; meant for tests)."
        )
    return (
        "recurrent_backend='triton' is accepted by name, but this version of recurrl ships "
        "no Triton kernel yet. Use recurrent_backend='pad' (fused torch kernels) or 'scan'."
    )
