"""Python-native ``LSTMCell``, ``GRUCell``, ``LSTM`` and ``GRU`` modules.

They take the constructor arguments, parameter names, parameter shapes and initialisation of
their :mod:`torch.nn` namesakes, so a ``state_dict`` moves between the two unchanged and the
outputs agree to float tolerance. Unlike the fused kernels behind :class:`torch.nn.LSTM`,
they are written with plain differentiable tensor operations (the step functions of
:mod:`recurrl.functional.cells`), so they work under :func:`torch.vmap`,
:func:`torch.func.functional_call` over stacked parameters, :func:`torch.func.grad` and
:func:`torch.compile`, and can be read and modified.

Differences from :mod:`torch.nn`: ``bidirectional=True`` and ``PackedSequence`` inputs are not
supported (a recurrent policy only ever reads the past; use :class:`torch.nn.LSTM` /
:class:`torch.nn.GRU` for those), and inter-layer dropout draws its own masks, so training-mode
outputs with ``dropout > 0`` match torch's only in distribution.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from recurrl.functional.cells import (
    gru_cell,
    gru_cell_from_projection,
    lstm_cell,
    lstm_cell_from_projection,
)

__all__ = ["GRU", "LSTM", "GRUCell", "LSTMCell"]


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} should be an int, received {type(value).__name__} ({value!r}); "
            f"pass a positive integer."
        )
    if value <= 0:
        raise ValueError(f"{name} must be greater than zero, received {value}.")


def _check_shape(what: str, tensor: Tensor, expected: tuple[int, ...]) -> None:
    """Raise the ``RuntimeError`` torch raises for a mis-sized input or state, with both shapes."""
    if tuple(tensor.shape) != expected:
        raise RuntimeError(
            f"{what}: expected shape {list(expected)}, received {list(tensor.shape)}."
        )



def _missing_hook(net: object, hook: str) -> str:
    """What a python-native network without one of its cell's hooks is told."""
    return (
        f"{type(net).__name__} does not implement {hook}, one of the four hooks of a "
        f"python-native recurrent network (_state_sizes, _unpack_hx, _input_bias, _step). "
        f"Fix: define it, as LSTM and GRU in recurrl/modules/nets/rnn.py do."
    )

class _CellBase(nn.Module):
    """Parameters, initialisation and input checks shared by :class:`LSTMCell` and
    :class:`GRUCell`; subclasses set the gate count and write ``forward``."""

    _num_gates: ClassVar[int]

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        _check_positive_int("input_size", input_size)
        _check_positive_int("hidden_size", hidden_size)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        factory = {"device": device, "dtype": dtype}
        gates = self._num_gates * hidden_size
        self.weight_ih = nn.Parameter(torch.empty(gates, input_size, **factory))
        self.weight_hh = nn.Parameter(torch.empty(gates, hidden_size, **factory))
        if bias:
            self.bias_ih = nn.Parameter(torch.empty(gates, **factory))
            self.bias_hh = nn.Parameter(torch.empty(gates, **factory))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw every parameter from ``U(-1/sqrt(H), 1/sqrt(H))``, as torch does."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for param in self.parameters():
            nn.init.uniform_(param, -bound, bound)

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        return text if self.bias else text + ", bias=False"

    def _as_batch(self, input: Tensor) -> tuple[Tensor, bool]:
        """Return ``input`` as ``[B, F]`` and whether it was batched to begin with."""
        name = type(self).__name__
        if input.dim() not in (1, 2):
            raise ValueError(
                f"{name}: expected input to be 1D [F] or 2D [B, F], got {input.dim()}D "
                f"(shape {list(input.shape)}); flatten extra batch dimensions or use "
                f"torch.vmap."
            )
        batched = input.dim() == 2
        x = input if batched else input.unsqueeze(0)
        _check_shape(f"{name} input", x, (x.shape[0], self.input_size))
        return x, batched

    def _state(self, hx: Tensor | None, x: Tensor, batched: bool, what: str) -> Tensor:
        """A zero state for ``hx=None``, else ``hx`` checked against ``[B, H]`` (``[H]``)."""
        if hx is None:
            return x.new_zeros(x.shape[0], self.hidden_size)
        expected = (x.shape[0], self.hidden_size)
        _check_shape(f"{type(self).__name__} {what}", hx, expected if batched else expected[1:])
        return hx if batched else hx.unsqueeze(0)


class LSTMCell(_CellBase):
    """A python-native drop-in for :class:`torch.nn.LSTMCell`.

    Same constructor, parameters (``weight_ih [4H, F]``, ``weight_hh [4H, H]``,
    ``bias_ih [4H]``, ``bias_hh [4H]``), initialisation and ``forward`` as torch's cell.

    Args:
        input_size: number of input features ``F``.
        hidden_size: number of hidden features ``H``.
        bias: whether to learn ``bias_ih`` and ``bias_hh``.
        device, dtype: where and how the parameters are created.

    Shapes:
        ``forward(input, hx=None)`` takes ``input [B, F]`` (or unbatched ``[F]``) and
        ``hx = (h, c)`` each ``[B, H]`` (or ``[H]``; zeros when ``None``), and returns the
        new ``(h, c)`` with the same shapes.

    Examples:
        >>> import torch
        >>> cell = LSTMCell(3, 4)
        >>> reference = torch.nn.LSTMCell(3, 4)
        >>> _ = reference.load_state_dict(cell.state_dict())
        >>> x = torch.randn(2, 3)
        >>> h, c = cell(x)
        >>> ref_h, ref_c = reference(x)
        >>> h.shape, torch.allclose(h, ref_h, atol=1e-6), torch.allclose(c, ref_c, atol=1e-6)
        (torch.Size([2, 4]), True, True)
    """

    _num_gates = 4

    def forward(
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        x, batched = self._as_batch(input)
        h0, c0 = (None, None) if hx is None else hx
        h = self._state(h0, x, batched, "hx[0]")
        c = self._state(c0, x, batched, "hx[1]")
        h, c = lstm_cell(x, (h, c), self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(_CellBase):
    """A python-native drop-in for :class:`torch.nn.GRUCell`.

    Same constructor, parameters (``weight_ih [3H, F]``, ``weight_hh [3H, H]``,
    ``bias_ih [3H]``, ``bias_hh [3H]``), initialisation and ``forward`` as torch's cell.

    Args:
        input_size: number of input features ``F``.
        hidden_size: number of hidden features ``H``.
        bias: whether to learn ``bias_ih`` and ``bias_hh``.
        device, dtype: where and how the parameters are created.

    Shapes:
        ``forward(input, hx=None)`` takes ``input [B, F]`` (or unbatched ``[F]``) and
        ``hx [B, H]`` (or ``[H]``; zeros when ``None``), and returns the new ``h`` with the
        shape of ``hx``.

    Examples:
        >>> import torch
        >>> cell = GRUCell(3, 4)
        >>> reference = torch.nn.GRUCell(3, 4)
        >>> _ = reference.load_state_dict(cell.state_dict())
        >>> x, h = torch.randn(3), torch.randn(4)
        >>> out = cell(x, h)
        >>> out.shape, torch.allclose(out, reference(x, h), atol=1e-6)
        (torch.Size([4]), True)
    """

    _num_gates = 3

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        x, batched = self._as_batch(input)
        h = self._state(hx, x, batched, "hx")
        h = gru_cell(x, h, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return h if batched else h.squeeze(0)


class _RecurrentBase(nn.Module):
    """Parameters, checks and the layer-by-layer, step-by-step unroll shared by :class:`LSTM`
    and :class:`GRU`.

    A subclass only says how many gates it has, which bias goes into the input projection,
    how one recurrent step reads a precomputed projection, and how its ``hx`` is packed; the
    state is handled here as a tuple whose first entry is the layer's output.
    """

    _num_gates: ClassVar[int]

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self._check_arguments(input_size, hidden_size, num_layers, dropout, bidirectional)
        if isinstance(proj_size, bool) or not isinstance(proj_size, int) or proj_size < 0:
            raise ValueError(
                f"proj_size should be a non-negative integer (0 disables the projection), "
                f"received {proj_size!r}."
            )
        if proj_size >= hidden_size:
            raise ValueError(
                f"proj_size has to be smaller than hidden_size, received proj_size={proj_size} "
                f"and hidden_size={hidden_size}; lower proj_size or pass proj_size=0."
            )
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = False
        self.proj_size = proj_size
        self._register_parameters({"device": device, "dtype": dtype})
        self.reset_parameters()

    def _check_arguments(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int,
        dropout: float,
        bidirectional: bool,
    ) -> None:
        name = type(self).__name__
        if bidirectional:
            raise ValueError(
                f"bidirectional=True is not supported by recurrl's {name}: a recurrent policy "
                f"may only read the past. Use torch.nn.{name}(..., bidirectional=True) instead."
            )
        _check_positive_int("input_size", input_size)
        _check_positive_int("hidden_size", hidden_size)
        _check_positive_int("num_layers", num_layers)
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, numbers.Real)
            or not 0 <= dropout <= 1
        ):
            raise ValueError(
                f"dropout should be a number in range [0, 1] representing the probability of "
                f"an element being zeroed, received {dropout!r}."
            )
        if dropout > 0 and num_layers == 1:
            warnings.warn(
                f"dropout is applied to the outputs of all but the last layer, so it has no "
                f"effect with num_layers=1 (received dropout={dropout}); set num_layers > 1 "
                f"or dropout=0.",
                UserWarning,
                stacklevel=4,
            )

    def _register_parameters(self, factory: dict) -> None:
        """Create the parameters in torch's order, recording their names per layer."""
        gates = self._num_gates * self.hidden_size
        out_size = self.proj_size or self.hidden_size
        self._flat_weights_names: list[str] = []
        for k in range(self.num_layers):
            layer_in = self.input_size if k == 0 else out_size
            shapes = {f"weight_ih_l{k}": (gates, layer_in), f"weight_hh_l{k}": (gates, out_size)}
            if self.bias:
                shapes.update({f"bias_ih_l{k}": (gates,), f"bias_hh_l{k}": (gates,)})
            if self.proj_size > 0:
                shapes[f"weight_hr_l{k}"] = (self.proj_size, self.hidden_size)
            for pname, shape in shapes.items():
                setattr(self, pname, nn.Parameter(torch.empty(shape, **factory)))
                self._flat_weights_names.append(pname)

    def reset_parameters(self) -> None:
        """Draw every parameter from ``U(-1/sqrt(H), 1/sqrt(H))``, as torch does."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for param in self.parameters():
            nn.init.uniform_(param, -bound, bound)

    @property
    def flat_weights(self) -> list[Tensor]:
        """Parameters in the order of ``torch.nn.LSTM._flat_weights``: per layer
        ``w_ih, w_hh, (b_ih, b_hh), (w_hr)``, layers concatenated."""
        return [getattr(self, name) for name in self._flat_weights_names]

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            text += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        if not self.bias:
            text += ", bias=False"
        if self.batch_first:
            text += ", batch_first=True"
        if self.dropout != 0:
            text += f", dropout={self.dropout}"
        return text

    # -- hooks -----------------------------------------------------------------------------

    def _state_sizes(self) -> tuple[int, ...]:
        """Feature size of each state entry (the first one is the layer's output)."""
        raise NotImplementedError(_missing_hook(self, "_state_sizes()"))

    def _unpack_hx(self, hx: object) -> tuple[Tensor, ...] | None:
        raise NotImplementedError(_missing_hook(self, "_unpack_hx(hx)"))

    def _input_bias(self, layer: int) -> Tensor | None:
        """The bias added to the precomputed input projection of ``layer``."""
        raise NotImplementedError(_missing_hook(self, "_input_bias(layer)"))

    def _step(self, x_proj: Tensor, state: tuple[Tensor, ...], layer: int) -> tuple[Tensor, ...]:
        """One recurrent step of ``layer`` from the input projection ``x_proj [B, G*H]``."""
        raise NotImplementedError(_missing_hook(self, "_step(x_proj, state, layer)"))

    # -- unroll ----------------------------------------------------------------------------

    def _as_time_major(self, input: Tensor) -> tuple[Tensor, bool]:
        """Return ``input`` as ``[T, B, F]`` and whether it was batched to begin with."""
        name = type(self).__name__
        if isinstance(input, PackedSequence):
            raise TypeError(
                f"recurrl's {name} does not take a PackedSequence; pass a padded "
                f"[T, B, F] tensor (and reset the state per sequence) or use torch.nn.{name}."
            )
        if input.dim() not in (2, 3):
            layout = "[B, T, F]" if self.batch_first else "[T, B, F]"
            raise ValueError(
                f"{name}: expected input to be 2D [T, F] or 3D {layout}, got {input.dim()}D "
                f"(shape {list(input.shape)}); flatten extra batch dimensions or use torch.vmap."
            )
        batched = input.dim() == 3
        if not batched:
            x = input.unsqueeze(1)
        else:
            x = input.transpose(0, 1) if self.batch_first else input
        if x.shape[0] == 0:
            raise RuntimeError(f"{name}: expected a sequence length larger than 0, received 0.")
        _check_shape(f"{name} input (time-major)", x, (*x.shape[:2], self.input_size))
        return x, batched

    def _initial_state(self, hx: object, x: Tensor, batched: bool) -> tuple[Tensor, ...]:
        """Zeros for ``hx=None``, else ``hx`` checked against ``[L, B, *]`` (``[L, *]``)."""
        sizes = self._state_sizes()
        batch = x.shape[1]
        states = self._unpack_hx(hx)
        if states is None:
            return tuple(x.new_zeros(self.num_layers, batch, size) for size in sizes)
        name = type(self).__name__
        checked = []
        for i, (state, size) in enumerate(zip(states, sizes, strict=True)):
            expected = (self.num_layers, batch, size) if batched else (self.num_layers, size)
            _check_shape(f"{name} hx[{i}]" if len(sizes) > 1 else f"{name} hx", state, expected)
            checked.append(state if batched else state.unsqueeze(1))
        return tuple(checked)

    def _unroll(self, x: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Run all layers over ``x [T, B, F]`` from ``state`` (entries ``[L, B, *]``)."""
        finals = []
        for layer in range(self.num_layers):
            # The input projection does not depend on the recurrence: one matmul for all steps.
            x_proj = x @ getattr(self, f"weight_ih_l{layer}").t()
            bias = self._input_bias(layer)
            if bias is not None:
                x_proj = x_proj + bias
            layer_state = tuple(s[layer] for s in state)
            outputs = []
            for x_proj_t in x_proj.unbind(0):
                layer_state = self._step(x_proj_t, layer_state, layer)
                outputs.append(layer_state[0])
            x = torch.stack(outputs, dim=0)
            if self.training and self.dropout > 0 and layer < self.num_layers - 1:
                x = F.dropout(x, p=self.dropout, training=True)
            finals.append(layer_state)
        return x, tuple(torch.stack(entry, dim=0) for entry in zip(*finals, strict=True))

    def _run(self, input: Tensor, hx: object) -> tuple[Tensor, tuple[Tensor, ...]]:
        x, batched = self._as_time_major(input)
        state = self._initial_state(hx, x, batched)
        output, final = self._unroll(x, state)
        if not batched:
            return output.squeeze(1), tuple(s.squeeze(1) for s in final)
        return (output.transpose(0, 1) if self.batch_first else output), final


class LSTM(_RecurrentBase):
    """A python-native drop-in for a unidirectional :class:`torch.nn.LSTM`.

    Same constructor, parameters (``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``,
    ``bias_hh_l{k}``, ``weight_hr_l{k}``), initialisation and ``forward`` as torch's module.
    Each layer projects all time steps' inputs in one matmul, then loops over time with
    only the recurrent matmul.

    Args:
        input_size: number of input features ``F``.
        hidden_size: number of hidden (cell) features ``H``.
        num_layers: number of stacked layers ``L``.
        bias: whether to learn ``bias_ih_l{k}`` and ``bias_hh_l{k}``.
        batch_first: whether batched ``input`` and ``output`` are ``[B, T, *]`` rather than
            ``[T, B, *]`` (``hx`` is ``[L, B, *]`` either way).
        dropout: probability of zeroing the outputs of every layer but the last, in
            training mode only.
        bidirectional: must be ``False``; use :class:`torch.nn.LSTM` for bidirectional RNNs.
        proj_size: if ``> 0``, the hidden state is projected to ``P = proj_size`` features.
        device, dtype: where and how the parameters are created.

    Shapes:
        ``forward(input, hx=None)`` takes ``input [T, B, F]`` (``[B, T, F]`` if
        ``batch_first``, or unbatched ``[T, F]``) and ``hx = (h_0 [L, B, P], c_0 [L, B, H])``
        (``[L, P]``, ``[L, H]`` unbatched; zeros when ``None``; ``P = H`` without projection),
        and returns ``(output [T, B, P], (h_n [L, B, P], c_n [L, B, H]))``.

    Examples:
        >>> import torch
        >>> lstm = LSTM(3, 8, num_layers=2, batch_first=True, proj_size=4)
        >>> reference = torch.nn.LSTM(3, 8, num_layers=2, batch_first=True, proj_size=4)
        >>> _ = reference.load_state_dict(lstm.state_dict())
        >>> x = torch.randn(5, 7, 3)  # [B, T, F]
        >>> out, (h, c) = lstm(x)
        >>> ref_out, (ref_h, ref_c) = reference(x)
        >>> out.shape, h.shape, c.shape
        (torch.Size([5, 7, 4]), torch.Size([2, 5, 4]), torch.Size([2, 5, 8]))
        >>> torch.allclose(out, ref_out, atol=1e-5) and torch.allclose(c, ref_c, atol=1e-5)
        True
    """

    _num_gates = 4

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            input_size,
            hidden_size,
            num_layers,
            bias,
            batch_first,
            dropout,
            bidirectional,
            proj_size,
            device,
            dtype,
        )

    def _state_sizes(self) -> tuple[int, ...]:
        return (self.proj_size or self.hidden_size, self.hidden_size)

    def _unpack_hx(self, hx: object) -> tuple[Tensor, ...] | None:
        if hx is None:
            return None
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(
                f"LSTM: expected hx to be a tuple (h_0, c_0) of tensors, received "
                f"{type(hx).__name__}; pass (h_0, c_0) or None for zeros."
            )
        return tuple(hx)

    def _input_bias(self, layer: int) -> Tensor | None:
        # Both LSTM biases only ever appear summed, so both fold into the input projection.
        if not self.bias:
            return None
        return getattr(self, f"bias_ih_l{layer}") + getattr(self, f"bias_hh_l{layer}")

    def _step(self, x_proj: Tensor, state: tuple[Tensor, ...], layer: int) -> tuple[Tensor, ...]:
        h, c = state
        weight_hr = getattr(self, f"weight_hr_l{layer}") if self.proj_size > 0 else None
        return lstm_cell_from_projection(
            x_proj, h, c, getattr(self, f"weight_hh_l{layer}"), weight_hr
        )

    def forward(
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        output, (h_n, c_n) = self._run(input, hx)
        return output, (h_n, c_n)


class GRU(_RecurrentBase):
    """A python-native drop-in for a unidirectional :class:`torch.nn.GRU`.

    Same constructor, parameters (``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``,
    ``bias_hh_l{k}``), initialisation and ``forward`` as torch's module. Each layer projects
    all time steps' inputs in one matmul, then loops over time with only the recurrent matmul.

    Args:
        input_size: number of input features ``F``.
        hidden_size: number of hidden features ``H``.
        num_layers: number of stacked layers ``L``.
        bias: whether to learn ``bias_ih_l{k}`` and ``bias_hh_l{k}``.
        batch_first: whether batched ``input`` and ``output`` are ``[B, T, *]`` rather than
            ``[T, B, *]`` (``hx`` is ``[L, B, H]`` either way).
        dropout: probability of zeroing the outputs of every layer but the last, in
            training mode only.
        bidirectional: must be ``False``; use :class:`torch.nn.GRU` for bidirectional RNNs.
        device, dtype: where and how the parameters are created.

    Shapes:
        ``forward(input, hx=None)`` takes ``input [T, B, F]`` (``[B, T, F]`` if
        ``batch_first``, or unbatched ``[T, F]``) and ``hx [L, B, H]`` (``[L, H]`` unbatched;
        zeros when ``None``), and returns ``(output [T, B, H], h_n [L, B, H])``.

    Examples:
        >>> import torch
        >>> gru = GRU(3, 4, num_layers=2)
        >>> reference = torch.nn.GRU(3, 4, num_layers=2)
        >>> _ = reference.load_state_dict(gru.state_dict())
        >>> x, h0 = torch.randn(7, 5, 3), torch.randn(2, 5, 4)  # [T, B, F], [L, B, H]
        >>> out, h = gru(x, h0)
        >>> ref_out, ref_h = reference(x, h0)
        >>> out.shape, h.shape, torch.allclose(out, ref_out, atol=1e-5)
        (torch.Size([7, 5, 4]), torch.Size([2, 5, 4]), True)
    """

    _num_gates = 3

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            input_size,
            hidden_size,
            num_layers,
            bias,
            batch_first,
            dropout,
            bidirectional,
            0,
            device,
            dtype,
        )

    def _state_sizes(self) -> tuple[int, ...]:
        return (self.hidden_size,)

    def _unpack_hx(self, hx: object) -> tuple[Tensor, ...] | None:
        if hx is None:
            return None
        if not isinstance(hx, Tensor):
            raise TypeError(
                f"GRU: expected hx to be a tensor h_0, received {type(hx).__name__}; pass a "
                f"[num_layers, B, H] tensor or None for zeros."
            )
        return (hx,)

    def _input_bias(self, layer: int) -> Tensor | None:
        # Only b_ih folds in: the GRU multiplies the n-part of b_hh by the reset gate.
        return getattr(self, f"bias_ih_l{layer}") if self.bias else None

    def _step(self, x_proj: Tensor, state: tuple[Tensor, ...], layer: int) -> tuple[Tensor, ...]:
        bias_hh = getattr(self, f"bias_hh_l{layer}") if self.bias else None
        h = gru_cell_from_projection(
            x_proj, state[0], getattr(self, f"weight_hh_l{layer}"), bias_hh
        )
        return (h,)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        output, (h_n,) = self._run(input, hx)
        return output, h_n
