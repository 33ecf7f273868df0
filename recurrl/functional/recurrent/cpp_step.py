"""One step of a one-layer LSTM/GRU in C++: the ``cpp`` backend's sequential step.

A policy acting in an env runs one step per env step on a small batch, where torch's
``lstm_cell``/``gru_cell`` dispatch a dozen small operators and the modules add a reset
(``masked_fill`` or ``where``) and the ``[N, 1, H]`` reshapes around them. The operators
``torch.ops.recurrl.lstm_step``/``gru_step`` (``recurrl/_ext/csrc/rnn.cpp``) do all of it in
one call: the reset as a select (a NaN or inf stored in a restarting row never reaches the
step), the two projections by BLAS into one scratch buffer, the gates with the row kernels of
the ``cpp`` scan (the numbers of one step of the ``cpp`` recurrent mode), and the new states in
the shape they came in (``[N, H]`` or ``[N, 1, H]``).

Inference only: the operators have no backward. :func:`cpp_step_fn` (what the modules call)
returns ``None`` where autograd would record (grad mode on and an input or weight requiring
grad), or the inputs are not CPU float32/float64, and the caller runs torch's cells instead.
Modules step by it with ``recurrent_backend="cpp"``, and with ``"auto"`` on CPU where the
kernels load (:func:`~recurrl.functional.recurrent.auto_step_runs_cpp`; there the step also
gives way to torch's cells under ``torch.compile`` and ``vmap``). Other backends step by
torch's cells.

Examples:
    >>> import torch
    >>> from recurrl._ext import extension_unavailable_reason
    >>> cell = torch.nn.GRUCell(3, 4)
    >>> x, h = torch.randn(5, 3), torch.randn(5, 4)
    >>> reset = torch.tensor([True, False, False, True, False])
    >>> if extension_unavailable_reason() is None:  # compiles once (~1 min)
    ...     with torch.no_grad():
    ...         y, (h1,) = cpp_cell_step("gru", x, (h,), reset, list(cell.parameters()))
    ...         assert torch.allclose(y, cell(x, h.masked_fill(reset[:, None], 0)), atol=1e-6)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from recurrl import _ext
from recurrl.functional.recurrent.config import RNNConfig
from recurrl.functional.recurrent.cpp import CPP_DTYPES

__all__ = ["CPP_STEPS", "CppStep", "cpp_cell_step", "cpp_step_fn"]

#: The C++ step operator of each cell kind, by name (``torch.ops.recurrl.<op>``). Every one
#: is called ``op(x, *states, reset, weight_ih, weight_hh[, bias_ih, bias_hh])`` and returns
#: ``(y, *new_states)``.
CPP_STEPS: dict[str, str] = {"lstm": "lstm_step", "gru": "gru_step"}

#: ``step(x, states, reset, weights) -> (y [N, H], new_states) | None``: ``x [N, F]``, states
#: each ``[N, H]`` or ``[N, 1, H]``, ``reset [N]``/``[N, 1]`` bool, ``weights`` the layer's
#: ``weight_ih, weight_hh[, bias_ih, bias_hh]``; ``None`` where torch's cells must run.
CppStep = Callable[[Tensor, Sequence[Tensor], Tensor, Sequence[Tensor]], tuple | None]

_F32, _F64 = CPP_DTYPES
_compiling = torch.compiler.is_compiling
_batched = torch._C._functorch.is_batchedtensor


def _operator(kind: str):
    name = CPP_STEPS.get(kind)
    if name is None:
        raise ValueError(
            f"the cpp backend's step runs {sorted(CPP_STEPS)}, received the {kind!r} cell. "
            f"Fix: recurrent_backend='scan' (its step runs torch's ops)."
        )
    _ext.load_extension()
    return getattr(torch.ops.recurrl, name).default


def cpp_cell_step(
    kind: str,
    x: Tensor,
    states: Sequence[Tensor],
    reset: Tensor | None,
    weights: Sequence[Tensor],
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """One step of a one-layer ``kind`` cell (``"lstm"`` or ``"gru"``) in C++.

    Args:
        kind: the cell kind, a key of :data:`CPP_STEPS`.
        x: ``[N, F]`` input, CPU, float32 or float64.
        states: the incoming states (``h`` first), each ``[N, H]`` or ``[N, 1, H]``.
        reset: ``[N]`` or ``[N, 1]`` bool, True where the row's incoming state is zero (a
            select: whatever the row holds, NaN included, is not read), or ``None``.
        weights: ``weight_ih [G*H, F], weight_hh [G*H, H]`` and optionally
            ``bias_ih, bias_hh [G*H]`` (``torch.nn.LSTMCell``/``GRUCell`` order).

    Returns:
        ``(y [N, H], new_states)``, each new state shaped as its input; ``y`` holds the new
        ``h`` in memory of its own.

    Raises:
        ValueError: a CUDA tensor, a dtype other than float32/float64, or an unknown kind.
        RuntimeError: shapes that do not fit (the operator's message), or an input that
            requires grad under grad mode (the operator has no backward).
    """
    if x.device.type != "cpu":
        raise ValueError(
            f"cpp_cell_step runs on CPU tensors only, received x on {x.device}. Fix: torch's "
            f"cells (torch.lstm_cell/gru_cell) on that device."
        )
    if x.dtype not in CPP_DTYPES:
        raise ValueError(
            f"cpp_cell_step runs {list(CPP_DTYPES)}, received {x.dtype}. Fix: convert the "
            f"weights and inputs (e.g. .float()), or use torch's cells."
        )
    if _records(x, states, weights):
        raise RuntimeError(
            "cpp_cell_step has no backward: expected no input requiring grad under grad mode, "
            "received one. Fix: call it under torch.no_grad(), or use torch's cells."
        )
    out = _operator(kind)(x, *states, reset, *weights)
    return out[0], tuple(out[1:])


def _records(x: Tensor, states: Sequence[Tensor], weights: Sequence[Tensor]) -> bool:
    """Whether autograd would record a step on these tensors."""
    return torch.is_grad_enabled() and (
        x.requires_grad
        or any(s.requires_grad for s in states)
        or any(w.requires_grad for w in weights)
    )


def cpp_step_fn(cfg: RNNConfig, *, eager_only: bool = False) -> CppStep | None:
    """The C++ step of the network ``cfg`` describes (:data:`CppStep`), or ``None`` when it has
    none (several layers, a projection, a kind outside :data:`CPP_STEPS`). Compiles the
    extension if it is not built yet.

    The step returns ``None`` where torch's cells must run instead: grad mode on with an
    input, a state or a weight requiring grad (no backward), or inputs that are not CPU
    float32/float64 (sequential mode keeps working on any device and dtype), and with
    ``eager_only`` (what ``recurrent_backend="auto"`` asks) under ``torch.compile`` or
    ``vmap`` too. The modules' fast and checked paths both call it, so they give the same
    numbers.

    Examples:
        >>> import torch
        >>> from recurrl._ext import extension_unavailable_reason
        >>> cfg = RNNConfig("lstm", 3, 4)
        >>> cell = torch.nn.LSTMCell(3, 4)
        >>> x, h, c = torch.randn(2, 3), torch.zeros(2, 1, 4), torch.zeros(2, 1, 4)
        >>> reset = torch.tensor([[True], [False]])
        >>> if extension_unavailable_reason() is None:
        ...     step = cpp_step_fn(cfg)
        ...     with torch.no_grad():
        ...         y, (h1, c1) = step(x, (h, c), reset, list(cell.parameters()))
        ...     assert h1.shape == (2, 1, 4) and torch.allclose(y, cell(x)[0], atol=1e-6)
        ...     assert step(x, (h, c), reset, list(cell.parameters())) is None  # grad: cells
    """
    if cfg.num_layers != 1 or cfg.proj_size or cfg.mode not in CPP_STEPS:
        return None
    op = _operator(cfg.mode)
    params = cfg.params_per_layer

    def step(x: Tensor, states: Sequence[Tensor], reset: Tensor, weights: Sequence[Tensor]):
        dtype = x.dtype
        if (dtype is not _F32 and dtype is not _F64) or not x.is_cpu:
            return None
        if eager_only and (_compiling() or _batched(x)):
            return None
        if torch.is_grad_enabled() and _records(x, states, weights[:params]):
            return None
        out = op(x, *states, reset, *weights[:params])
        return out[0], out[1:]

    return step
