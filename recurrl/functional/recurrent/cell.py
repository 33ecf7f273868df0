"""Cell kinds: what a recurrent cell is, for every backend, and the registry of kinds.

A :class:`CellKind` describes one cell (the LSTM, the GRU, or one a user registers): its gate
count and state layout, its input projection, one step from a projected input, torch's fused
operators when it has them, and what the ``pad`` family needs to freeze or flush its state.
:class:`RNNConfig.mode <recurrl.functional.recurrent.config.RNNConfig>` names a registered
kind, and every backend either runs a kind or refuses it by name when a module is built
(:func:`recurrl.functional.recurrent.check_recurrent_options`).

A new cell is one subclass and one :func:`register_cell_kind` call (see
``docs/adding_a_cell.md``):

    >>> import torch
    >>> from recurrl.functional.recurrent.cell import CellKind, register_cell_kind
    >>> class Elman(CellKind):
    ...     name, gates, state_names = "elman_doc", 1, ("h",)
    ...     def step_projected(self, cfg, w, xp, state):
    ...         return (torch.tanh(xp + state[0] @ w.weight_hh.t() + w.bias_hh),)
    >>> kind = register_cell_kind(Elman())
    >>> get_cell_kind("elman_doc") is kind
    True
    >>> unregister_cell_kind("elman_doc")

Weights follow torch's layout for every kind: per layer ``weight_ih [G*H, F]``,
``weight_hh [G*H, O]``, then ``bias_ih``/``bias_hh [G*H]`` when the network has biases (and
the LSTM's ``weight_hr`` with a projection), as ``torch.nn.LSTM._flat_weights`` orders them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from recurrl.functional import cells

if TYPE_CHECKING:
    from recurrl.functional.recurrent.config import LayerWeights, RNNConfig
    from recurrl.functional.recurrent.pad.costs import PadCosts

__all__ = [
    "CELL_KINDS",
    "CellKind",
    "GRUKind",
    "LSTMKind",
    "PadGates",
    "get_cell_kind",
    "register_cell_kind",
    "unregister_cell_kind",
]


@dataclass(frozen=True)
class PadGates:
    """How the ``pad`` family's flag columns drive a gated cell (see
    :mod:`~recurrl.functional.recurrent.pad.frozen` and
    :mod:`~recurrl.functional.recurrent.pad.flush`).

    Each entry maps a gate block (its index in the ``G`` blocks of ``weight_ih``'s rows) to
    the sign of the saturating weight ``s`` put there: a sigmoid gate at ``-s`` is exactly 0,
    at ``+s`` exactly 1.

    Attributes:
        freeze: the blocks that hold the state unchanged on a padding step.
        flush: the blocks that make the state exactly zero on a flush step.
        cell_state: the second state is a cell state ``c`` with the LSTM's gate layout
            (``i, f, g`` first): the flush layout adds a freeze column to carry it to the end
            of a row, and rebuilds it at the other trajectory ends from the gates.
        flush_cancels_candidate_bias: the flush column also carries ``-bias_ih`` on the last
            block (the GRU, whose candidate is not gated by ``r`` on its input side).
        time_major: the frozen windows run time-major (oneDNN's own layout for the LSTM);
            batch-first otherwise (torch's GRU loop, whose rounding depends on it).
        stagger: start pieces at later window boundaries where they pad least (kernels that
            cost mostly per row-step).
        costs: the kind's :class:`~recurrl.functional.recurrent.pad.costs.PadCosts`
            (``None``: the entry of ``PAD_COSTS`` under the kind's name).
    """

    freeze: dict[int, int]
    flush: dict[int, int]
    cell_state: bool = False
    flush_cancels_candidate_bias: bool = False
    time_major: bool = False
    stagger: bool = False
    costs: PadCosts | None = None


class CellKind:
    """One kind of recurrent cell. Subclass, set the class attributes, implement
    :meth:`step_projected`; override the rest only where the cell differs.

    Attributes:
        name: the ``mode`` string that selects it (``RNNConfig(mode=...)``).
        gates: blocks of ``hidden_size`` rows in ``weight_ih``/``weight_hh`` (``G``).
        state_names: one name per state tensor, ``h`` first (``("h", "c")`` for the LSTM).
        supports_proj: whether ``proj_size > 0`` is meaningful (the LSTM only).
        recurrent_weights: the layers have ``weight_hh`` (and ``bias_hh``); False for cells
            whose state update reads no matrix of the state (linear-recurrent cells such as
            minGRU: per layer only ``weight_ih[, bias_ih]``).
        auto_pad_on_cpu: ``recurrent_backend="auto"`` picks ``pad`` on CPU for this cell
            (measured faster there than ``scan``: the LSTM); otherwise ``scan`` on CPU.
        pad: what the ``pad`` family's frozen and flush layouts need, or ``None`` when the
            cell cannot be frozen or flushed by saturated gates (``pad`` then runs plain time
            windows, which need :meth:`fused_sequence` or a python runner).
    """

    name: ClassVar[str]
    gates: ClassVar[int]
    state_names: ClassVar[tuple[str, ...]] = ("h",)
    supports_proj: ClassVar[bool] = False
    recurrent_weights: ClassVar[bool] = True
    auto_pad_on_cpu: ClassVar[bool] = False
    pad: ClassVar[PadGates | None] = None

    @property
    def num_states(self) -> int:
        """Number of state tensors (2 for the LSTM, 1 for the GRU)."""
        return len(self.state_names)

    def state_sizes(self, cfg: RNNConfig) -> tuple[int, ...]:
        """Feature size of each state tensor; ``h`` has the output's size."""
        return (cfg.output_size,) + (cfg.hidden_size,) * (self.num_states - 1)

    def project(self, cfg: RNNConfig, w: LayerWeights, x: Tensor) -> Tensor:
        """The input projection of every step, ``x [*, F] -> [*, G*H]``, done once outside
        a time loop: ``x W_ih^T + b_ih`` unless the cell folds more into it."""
        return F.linear(x, w.weight_ih, w.bias_ih)

    def step_projected(
        self, cfg: RNNConfig, w: LayerWeights, xp: Tensor, state: tuple[Tensor, ...]
    ) -> tuple[Tensor, ...]:
        """One step from the projected input ``xp [N, G*H]`` and the states (each
        ``[N, S]``): the new states, ``h`` first. Differentiable torch ops only (it runs
        under autograd, ``vmap`` and ``torch.compile``)."""
        raise NotImplementedError(f"cell kind {self.name!r} does not define step_projected")

    def step(
        self,
        cfg: RNNConfig,
        w: LayerWeights,
        x: Tensor,
        state: tuple[Tensor, ...],
        *,
        fused: bool,
    ) -> tuple[Tensor, ...]:
        """One step from the raw input ``x [N, F]``. ``fused`` allows torch's fused cell
        operator where the kind has one (same numbers, faster)."""
        return self.step_projected(cfg, w, self.project(cfg, w, x), state)

    def fused_cell(
        self, x: Tensor, state: tuple[Tensor, ...], weights: Sequence[Tensor]
    ) -> tuple[Tensor, ...] | None:
        """torch's fused one-step operator on one layer without projection (``weights``: the
        layer's ``weight_ih, weight_hh[, bias_ih, bias_hh]``), or ``None`` when the kind has
        none. The acting hot path of one-layer networks."""
        return None

    def fused_sequence(
        self,
        cfg: RNNConfig,
        weights: Sequence[Tensor],
        x: Tensor,
        hx: tuple[Tensor, ...],
        *,
        dropout: float,
        training: bool,
        batch_first: bool,
        num_layers: int | None = None,
    ) -> tuple[Tensor, tuple[Tensor, ...]] | None:
        """torch's fused multi-layer sequence operator on ``x`` from states ``hx`` (each
        ``[L, N, S]``), or ``None`` when the kind has none. ``weights`` may carry extra input
        columns (the ``pad`` family's flags)."""
        return None

    @property
    def has_fused_sequence(self) -> bool:
        """Whether :meth:`fused_sequence` is implemented (``pad`` needs it, or a runner)."""
        return type(self).fused_sequence is not CellKind.fused_sequence

    def layer_param_count(self, cfg: RNNConfig) -> int | None:
        """Parameters per layer in the flat weight list, for a kind with its own per-layer
        parameters (e.g. the LRU's); ``None``: torch's layout (``weight_ih``,
        ``weight_hh``, biases, projection) as :attr:`RNNConfig.params_per_layer` counts it."""
        return None

    def split_layer(self, cfg: RNNConfig, chunk: Sequence[Tensor]) -> LayerWeights | None:
        """One layer's parameters from its slice of the flat weight list, for a kind with
        its own layout (a ``NamedTuple`` its own methods read); ``None``: torch's layout."""
        return None

    def h_bound(self, cfg: RNNConfig, w: LayerWeights, h0: Tensor) -> Tensor | float:
        """A bound on ``|h|`` over a layer's run from the start states ``h0`` (no host sync);
        needed by the ``pad`` family only."""
        raise NotImplementedError(f"cell kind {self.name!r} has no bound on |h| for pad")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class LSTMKind(CellKind):
    """The LSTM (gates ``i, f, g, o``; states ``h``, ``c``; optional projection)."""

    name = "lstm"
    gates = 4
    state_names = ("h", "c")
    supports_proj = True
    auto_pad_on_cpu = True
    pad = PadGates(
        freeze={0: -1, 1: +1},  # i == 0, f == 1: c carried (h is read at the last real step)
        flush={0: -1, 1: -1},  # i == f == 0: c == 0, h == o * tanh(0) == 0
        cell_state=True,
        time_major=True,
        stagger=True,
    )

    def project(self, cfg: RNNConfig, w: LayerWeights, x: Tensor) -> Tensor:
        bias = w.bias_ih
        if bias is not None:
            bias = bias + w.bias_hh  # the LSTM only ever uses the sum of its two biases
        return F.linear(x, w.weight_ih, bias)

    def step_projected(self, cfg, w, xp, state):
        return cells.lstm_cell_from_projection(xp, state[0], state[1], w.weight_hh, w.weight_hr)

    def step(self, cfg, w, x, state, *, fused):
        if fused and w.weight_hr is None:
            return torch.lstm_cell(x, state, w.weight_ih, w.weight_hh, w.bias_ih, w.bias_hh)
        return cells.lstm_cell(
            x, state, w.weight_ih, w.weight_hh, w.bias_ih, w.bias_hh, w.weight_hr
        )

    def fused_cell(self, x, state, weights):
        return torch.lstm_cell(x, state, *weights)

    def fused_sequence(
        self, cfg, weights, x, hx, *, dropout, training, batch_first, num_layers=None
    ):
        layers = cfg.num_layers if num_layers is None else num_layers
        hx = tuple(t.contiguous() for t in hx)  # cuDNN refuses a non-contiguous state
        y, h, c = torch.lstm(
            x, hx, list(weights), cfg.bias, layers, dropout, training, False, batch_first
        )
        return y, (h, c)

    def h_bound(self, cfg, w, h0):
        # h = o * tanh(c), then projected
        return w.weight_hr.abs().sum(1).max() if cfg.proj_size else 1.0


class GRUKind(CellKind):
    """The GRU (gates ``r, z, n``; state ``h``)."""

    name = "gru"
    gates = 3
    pad = PadGates(
        freeze={1: +1},  # z == 1: h = (1 - z) n + z h == h
        flush={0: -1, 1: -1},  # r == z == 0, and the candidate's bias cancelled: h == 0
        flush_cancels_candidate_bias=True,
    )

    def step_projected(self, cfg, w, xp, state):
        return (cells.gru_cell_from_projection(xp, state[0], w.weight_hh, w.bias_hh),)

    def step(self, cfg, w, x, state, *, fused):
        if fused:
            return (torch.gru_cell(x, state[0], w.weight_ih, w.weight_hh, w.bias_ih, w.bias_hh),)
        return (cells.gru_cell(x, state[0], w.weight_ih, w.weight_hh, w.bias_ih, w.bias_hh),)

    def fused_cell(self, x, state, weights):
        return (torch.gru_cell(x, state[0], *weights),)

    def fused_sequence(
        self, cfg, weights, x, hx, *, dropout, training, batch_first, num_layers=None
    ):
        layers = cfg.num_layers if num_layers is None else num_layers
        y, h = torch.gru(
            x,
            hx[0].contiguous(),
            list(weights),
            cfg.bias,
            layers,
            dropout,
            training,
            False,
            batch_first,
        )
        return y, (h,)

    def h_bound(self, cfg, w, h0):
        # a GRU state is a convex combination of candidates in [-1, 1] and its start state
        if not h0.numel():
            return 1.0
        # A NaN start state (its own row's business) must not make the flag column NaN: every
        # row multiplies that column by 0 on its real steps, and 0 * NaN = NaN. A non-finite
        # bound becomes 1e30, which the columns clamp to anyway; a finite one is left as is.
        return h0.detach().abs().amax().clamp(min=1.0).nan_to_num(nan=1e30, posinf=1e30)


#: The registered kinds by name. Add to it with :func:`register_cell_kind`.
CELL_KINDS: dict[str, CellKind] = {}


def register_cell_kind(kind: CellKind, *, replace: bool = False) -> CellKind:
    """Make ``kind`` selectable as ``mode=kind.name``; returns it.

    Raises ``ValueError`` for a name already registered (unless ``replace``) and for a kind
    whose class attributes are missing or inconsistent.
    """
    if not isinstance(kind, CellKind):
        raise TypeError(
            f"register_cell_kind expects a CellKind instance, received {type(kind).__name__}. "
            f"Subclass recurrl.functional.recurrent.cell.CellKind and pass an instance."
        )
    name = getattr(kind, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{type(kind).__name__}.name must be a non-empty string, got {name!r}.")
    gates = getattr(kind, "gates", None)
    if not isinstance(gates, int) or gates < 1:
        raise ValueError(f"{type(kind).__name__}.gates must be a positive int, got {gates!r}.")
    if not kind.state_names or not all(isinstance(s, str) for s in kind.state_names):
        raise ValueError(
            f"{type(kind).__name__}.state_names must name at least one state, got "
            f"{kind.state_names!r}."
        )
    if name in CELL_KINDS and not replace:
        raise ValueError(
            f"cell kind {name!r} is already registered ({CELL_KINDS[name]!r}). Pick another "
            f"name, or pass replace=True."
        )
    CELL_KINDS[name] = kind
    return kind


def unregister_cell_kind(name: str) -> None:
    """Remove a kind registered with :func:`register_cell_kind` (the built-ins stay)."""
    if name in _BUILTIN:
        raise ValueError(f"cell kind {name!r} is built in and cannot be unregistered.")
    CELL_KINDS.pop(name, None)


def get_cell_kind(name: str) -> CellKind:
    """The registered kind called ``name``; ``ValueError`` naming the choices otherwise.

    Examples:
        >>> get_cell_kind("gru").gates
        3
        >>> get_cell_kind("rnn")
        Traceback (most recent call last):
        ...
        ValueError: unknown recurrent cell mode 'rnn': expected one of ['gru', 'lru', ...]...
    """
    kind = CELL_KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ValueError(
            f"unknown recurrent cell mode {name!r}: expected one of {sorted(CELL_KINDS)}. "
            f"A new cell is registered with "
            f"recurrl.functional.recurrent.cell.register_cell_kind."
        )
    return kind


_BUILTIN = ("lstm", "gru")
register_cell_kind(LSTMKind())
register_cell_kind(GRUKind())
