"""``TransformerModule``: attention over the last steps as memory, with the contract of
:class:`~recurrl.modules.LSTMModule`.

The network (:class:`~recurrl.modules.nets.transformer.GatedTransformer`, GTrXL-style gated
layers with rotary positions) runs on plain tensors; this module reads the input, the stored
memory and ``is_init`` from a TensorDict and writes the output and ``("next", memory)``,
through the keys and the validating readers every :class:`RecurrentModule` shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor, nn

from recurrl.functional.recurrent import RecurrentOptions
from recurrl.modules.nets.transformer import GatedTransformer
from recurrl.modules.recurrent import RecurrentModule
from recurrl.modules.registry import register_memory

__all__ = ["TransformerConfig", "TransformerModule"]


@dataclass(frozen=True)
class TransformerConfig:
    """Static description of a :class:`GatedTransformer` (what ``module.config`` returns)."""

    input_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    memory_length: int
    feedforward_size: int
    bias: bool
    dropout: float
    #: no output projection (read by the shared option checks)
    proj_size: int = 0

    @property
    def state_sizes(self) -> tuple[int, int]:
        """Last dim of each state: the memory ``M * H`` and the count ``1``."""
        return (self.memory_length * self.hidden_size, 1)


class TransformerModule(RecurrentModule):
    """A GTrXL-style transformer on TensorDicts whose memory is its last ``M`` steps.

    The same contract as :class:`LSTMModule` (keys, the two modes, resets, ``("next", ...)``
    exact at trajectory ends, :meth:`make_tensordict_primer`, collector auto-wiring through
    :attr:`recurrent_state_spec`): ``in_keys = [input, memory, count, "is_init"]``,
    ``out_keys = [output, ("next", memory), ("next", count)]``.

    * ``memory`` ``[*B, num_layers, M * H]``: per layer, its last ``M = memory_length``
      inputs, oldest first (``[M, H]`` flattened; layer 0's inputs are the projected
      observations, layer ``l``'s the outputs of layer ``l - 1``). A stored frame costs
      ``num_layers * M * H`` floats: 4096 (16 KiB in float32) for one layer of ``H = 64``
      with ``M = 64``, against ``H`` for a GRU.
    * ``count`` ``[*B, num_layers, 1]``: how many of those slots (the last ones) hold steps
      of the current episode, ``0..M`` (an integer stored in the parameters' dtype; the
      primer's zeros start an episode). The other slots are ignored, and written as zeros.

    Each layer (Parisotto et al. 2019, GTrXL: pre-norm, GRU-type gates in place of the
    residual sums; rotary positions of Su et al. 2021, so scores depend only on distances;
    see :mod:`recurrl.modules.nets.transformer`) lets a step attend to itself and to at most
    ``M`` earlier steps of its episode.

    * Sequential mode: ``is_init`` True *selects* an empty memory (count 0, zeros): nothing
      of the finished episode, NaNs included, reaches the next. The step attends to the
      valid slots and itself; the buffer is shifted by one slot (fixed size).
    * Recurrent mode: a ``[*B, T]`` batch runs each layer as one attention pass, causal,
      over a sliding window of ``M`` steps, block-diagonal across the ``is_init`` inside a
      row, each row starting from the memory stored at its first step. An ``is_init`` whose
      stored memory is not empty (a slice of a trajectory glued mid-row, a burn-in restart)
      starts from that memory, as recurrent mode does for every module: such rows are cut
      there first. Keys and values that are not finite are zeroed for the other episodes'
      queries (selected, never multiplied).

    Replay needs no stored memory beyond a slice's first step, and even that can be
    recomputed: the memory at step ``s`` depends on the inputs of the ``num_layers * M``
    steps before it only, so a burn-in over them (or from the episode start, if nearer)
    starting from an empty memory rebuilds it exactly.

    Args:
        input_size: features of the input ``F``.
        hidden_size: features of the layers and the output ``H``.
        num_layers: stacked gated layers. Default: 1.
        bias: biases in the linear layers. Default: True.
        dropout: dropout on the attention and MLP outputs (training only; it makes
            sequential and recurrent mode differ while it is active). Default: 0.
        recurrent_backend: accepted for the trainer's uniform signature: only ``"auto"``
            (attention runs no recurrent cell, so the cell backends ``pad``, ``scan``,
            ``cpp``... do not apply); anything else raises ``ValueError``. Default: "auto".

    Keyword Args:
        num_heads: attention heads, dividing ``hidden_size``; ``None`` takes the most of 4,
            2, 1 that divides it. Default: None.
        memory_length: steps ``M`` of memory per layer (>= 1). Default: 64.
        feedforward_size: hidden features of each layer's MLP (``None``: ``hidden_size``).
            Default: None.
        in_key: the input key; the state keys default to ``"recurrent_state_memory"`` and
            ``"recurrent_state_count"``. Exclusive with ``in_keys``.
        in_keys: ``[input, memory, count]`` keys (``"is_init"`` is appended). Exclusive with
            ``in_key``.
        out_keys: ``[output, ("next", memory), ("next", count)]``. Exclusive with ``out_key``.
        transformer: an existing
            :class:`~recurrl.modules.nets.transformer.GatedTransformer` to wrap, exclusive
            with the arguments that build one.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.modules import TransformerModule, set_recurrent_mode
        >>> net = TransformerModule(3, 8, memory_length=4, in_key="obs", out_key="features")
        >>> net.in_keys
        ['obs', 'recurrent_state_memory', 'recurrent_state_count', 'is_init']
        >>> step = TensorDict({"obs": torch.randn(2, 3),
        ...                    "is_init": torch.ones(2, 1, dtype=torch.bool)}, batch_size=[2])
        >>> out = net(step)
        >>> out["next", "recurrent_state_memory"].shape, out["next", "recurrent_state_count"]
        (torch.Size([2, 1, 32]), tensor([[[1.]],
        <BLANKLINE>
                [[1.]]]))
        >>> seq = TensorDict({"obs": torch.randn(2, 10, 3),
        ...                   "recurrent_state_memory": torch.zeros(2, 10, 1, 32),
        ...                   "recurrent_state_count": torch.zeros(2, 10, 1, 1),
        ...                   "is_init": torch.zeros(2, 10, 1, dtype=torch.bool)},
        ...                  batch_size=[2, 10])
        >>> with set_recurrent_mode(True):
        ...     out = net(seq)
        >>> out["features"].shape
        torch.Size([2, 10, 8])
    """

    cell = None  # no recurrent cell kind: the cell backends do not apply
    network_attr = "transformer"
    default_state_keys = ("recurrent_state_memory", "recurrent_state_count")
    network_class = GatedTransformer
    python_network_class = GatedTransformer
    #: every step goes through the validating readers (there is no fused fast path)
    _step_shortcuts: ClassVar[bool] = False

    def __init__(
        self,
        input_size: int | None = None,
        hidden_size: int | None = None,
        num_layers: int = 1,
        bias: bool = True,
        dropout: float = 0.0,
        recurrent_backend: str = "auto",
        *,
        num_heads: int | None = None,
        memory_length: int = 64,
        feedforward_size: int | None = None,
        in_key: NestedKey | None = None,
        in_keys: Sequence[NestedKey] | None = None,
        out_key: NestedKey | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        device: torch.device | str | None = None,
        transformer: GatedTransformer | None = None,
        default_recurrent_mode: bool | None = None,
    ) -> None:
        # RecurrentModule's constructor builds an RNN of a registered cell kind; this one
        # builds the transformer and shares the rest (keys, readers, options, primers)
        super(RecurrentModule, self).__init__()
        name = type(self).__name__
        self.in_keys, self.out_keys = self._resolve_keys(in_key, in_keys, out_key, out_keys)
        if transformer is None:
            if input_size is None or hidden_size is None:
                raise ValueError(
                    f"{name}: input_size and hidden_size are required (or pass an existing "
                    f"network with transformer=...), got input_size={input_size!r}, "
                    f"hidden_size={hidden_size!r}."
                )
            transformer = GatedTransformer(
                input_size, hidden_size, num_layers, num_heads=num_heads,
                memory_length=memory_length, feedforward_size=feedforward_size, bias=bias,
                dropout=dropout, device=device,
            )  # fmt: skip
        else:
            given = {
                "input_size": input_size, "hidden_size": hidden_size,
                "num_layers": None if num_layers == 1 else num_layers,
                "bias": None if bias else bias, "dropout": dropout or None,
                "num_heads": num_heads,
                "memory_length": None if memory_length == 64 else memory_length,
                "feedforward_size": feedforward_size,
            }  # fmt: skip
            clash = [k for k, v in given.items() if v is not None]
            if clash:
                raise ValueError(
                    f"{name}: transformer= wraps an existing network and is exclusive with "
                    f"the arguments that build one; drop {clash} (they are read from it)."
                )
            if not isinstance(transformer, GatedTransformer):
                raise ValueError(
                    f"{name}: transformer= must be a recurrl.modules.nets.transformer."
                    f"GatedTransformer, got {type(transformer).__name__}."
                )
            if device is not None:
                transformer = transformer.to(device)
        if default_recurrent_mode is not None and not isinstance(default_recurrent_mode, bool):
            raise ValueError(
                f"{name}: default_recurrent_mode must be a bool or None, "
                f"got {default_recurrent_mode!r}."
            )
        self._set_rnn(transformer, True)
        self._recurrent_options = self._checked(
            recurrent_backend, "none", torch.float32, "auto", python_based=True, device=device,
            proj_size=0,
        )  # fmt: skip
        self.default_recurrent_mode = bool(default_recurrent_mode)

    # ------------------------------------------------------------------ the shared parts
    @staticmethod
    def _convert(rnn: nn.Module, cls: type[nn.Module]) -> nn.Module:
        return rnn  # one network, python-native: nothing to convert

    def _set_rnn(self, rnn: nn.Module, python_based: bool) -> None:
        super()._set_rnn(rnn, True)

    @classmethod
    def memory_backend_refusal(cls, backend: str) -> str | None:
        """Why ``recurrent_backend=backend`` cannot run this module (``None`` for
        ``"auto"``, the only one); read by the trainer's config through the registry."""
        if backend == "auto":
            return None
        return (
            f"recurrent_backend={backend!r} does not apply to {cls.__name__}: attention runs "
            f"no recurrent cell, so only 'auto' (one attention pass per layer) is accepted."
        )

    def _checked(
        self, backend: str, recompute: str, compute_dtype: torch.dtype, precision: str, *,
        python_based: bool, device: torch.device | str | None, proj_size: int,
    ) -> RecurrentOptions:  # fmt: skip
        """Only the defaults: the options tune the cell backends, which attention does not
        use; anything else raises ``ValueError`` naming the option."""
        name = type(self).__name__
        refusal = self.memory_backend_refusal(backend)
        if refusal is not None:
            raise ValueError(f"{name}: {refusal} Fix: recurrent_backend='auto'.")
        given = {"recurrent_recompute": (recompute, "none"),
                 "recurrent_compute_dtype": (compute_dtype, torch.float32),
                 "recurrent_matmul_precision": (precision, "auto")}  # fmt: skip
        for option, (value, default) in given.items():
            if value != default:
                raise ValueError(
                    f"{name}: {option}={value!r} tunes the recurrent cell backends, which "
                    f"attention does not use. Fix: leave it at {default!r}."
                )
        return RecurrentOptions(backend, recompute, compute_dtype, precision)  # type: ignore[arg-type]

    @property
    def config(self) -> TransformerConfig:  # type: ignore[override]
        """Static description of the wrapped network."""
        net = self.rnn
        return TransformerConfig(
            net.input_size, net.hidden_size, net.num_layers, net.num_heads, net.memory_length,
            net.feedforward_size, bool(net.bias), float(net.dropout),
        )  # fmt: skip

    @property
    def memory_length(self) -> int:
        """Steps of memory per layer ``M``."""
        return self.rnn.memory_length

    @property
    def recurrent_state_spec(self) -> dict[NestedKey, tuple[torch.Size, torch.dtype]]:
        """Shape (without batch dims) and dtype of the state keys: the memory
        ``[num_layers, M * H]`` and the count ``[num_layers, 1]``, both the parameters'
        dtype (the primer's zeros are an empty memory)."""
        cfg = self._cfg
        dtype = next(self.rnn.parameters()).dtype
        return {
            key: (torch.Size([cfg.num_layers, size]), dtype)
            for key, size in zip(self.state_keys, cfg.state_sizes, strict=True)
        }

    # ------------------------------------------------------------------ forward
    def forward(
        self, tensordict: TensorDictBase | Tensor | None = None, *args: Tensor, **kwargs: Any
    ) -> TensorDictBase | Tensor | tuple[Tensor, ...]:
        """Read the input, memory and ``is_init``; write the output and ``("next", ...)``.

        Called with tensors (keywords named after the ``in_keys``), returns the
        ``out_keys`` entries, as :meth:`RecurrentModule.forward` documents. Shapes:
        sequential mode ``x [*B, F]``, memory ``[*B, L, M * H]``, count ``[*B, L, 1]``,
        ``is_init [*B, 1]``; recurrent mode the same with a time dim ``T`` last among the
        batch dims. A missing state is read as an empty memory where every row starts an
        episode, and raises ``KeyError`` otherwise.
        """
        if tensordict is None or isinstance(tensordict, Tensor):
            return self._forward_tensors(tensordict, args, kwargs)
        if self.recurrent_mode:
            return self._forward_sequence(tensordict)
        return self._forward_step(tensordict)

    def _counts(self, count: Tensor, read: Tensor) -> Tensor:
        """``count`` as int64 where ``read`` (broadcast) is True, 0 elsewhere; a value read
        that is not an integer in ``[0, M]`` raises ``ValueError`` (a count is never
        rounded or clamped: it would silently change which steps are remembered)."""
        m = self.memory_length
        count = torch.where(read, count, 0.0)
        wrong = (count != count.round()) | (count < 0) | (count > m)  # NaN: wrong too
        if bool(wrong.any()):
            values = count[wrong].unique().tolist()
            raise ValueError(
                f"{type(self).__name__}: the count state {self.state_keys[1]!r} must hold "
                f"integers in [0, memory_length={m}] (the valid memory slots), received "
                f"{values[:6]}. Fix: pass the count this module wrote, or zeros (an empty "
                f"memory, as the primer writes) with is_init True."
            )
        return count.long()

    def _forward_step(self, td: TensorDictBase) -> TensorDictBase:
        batch = td.batch_size
        cfg, net = self._cfg, self.rnn
        x = self._read_input(td, batch, next(net.parameters()).dtype)
        is_init = self._read_is_init(td, batch)
        memory, count = self._read_states(td, batch, x, is_init)
        n, layers, m, size = batch.numel(), cfg.num_layers, cfg.memory_length, cfg.hidden_size
        reset = is_init.reshape(n, 1)
        # an episode start selects an empty memory: nothing of the last one is read
        memory = torch.where(reset[..., None, None], 0.0, memory.reshape(n, layers, m, size))
        y, memory, count = net.step(
            x.reshape(n, x.shape[-1]), memory, self._counts(count.reshape(n, layers), ~reset)
        )
        td.set(self.out_keys_source[0], y.reshape(*batch, size))
        td.set(self.out_keys_source[1], memory.reshape(*batch, layers, m * size))
        td.set(self.out_keys_source[2], count.to(x.dtype).reshape(*batch, layers, 1))
        return td

    def _forward_sequence(self, td: TensorDictBase) -> TensorDictBase:
        batch = td.batch_size
        if not batch:
            raise ValueError(
                f"{type(self).__name__} in recurrent mode needs a time dimension (the last "
                f"batch dim), got a TensorDict with batch_size []. Give it [T] or [*B, T] "
                f"data, or run it outside set_recurrent_mode(True) for a single step."
            )
        cfg, net = self._cfg, self.rnn
        x = self._read_input(td, batch, next(net.parameters()).dtype)
        is_init = self._read_is_init(td, batch)
        steps = batch[-1]
        memory, count = self._read_states(td, batch, x, is_init[..., 0] if steps else is_init)
        layers, m, size = cfg.num_layers, cfg.memory_length, cfg.hidden_size
        if batch.numel() == 0:
            y = x.new_zeros(*batch, size)
            nxt_memory, nxt_count = torch.zeros_like(memory), torch.zeros_like(count)
        else:
            n = batch.numel() // steps
            is_init = is_init.reshape(n, steps)
            restart = is_init.clone()
            restart[:, 0] = True  # where the stored memory is read
            y, nxt_memory, nxt_count = net.sequence(
                x.reshape(n, steps, x.shape[-1]),
                memory.reshape(n, steps, layers, m, size),
                self._counts(count.reshape(n, steps, layers), restart[..., None]),
                is_init,
            )
        td.set(self.out_keys_source[0], y.reshape(*batch, size))
        td.set(self.out_keys_source[1], nxt_memory.reshape(*batch, layers, m * size))
        td.set(self.out_keys_source[2], nxt_count.to(x.dtype).reshape(*batch, layers, 1))
        return td

    def extra_repr(self) -> str:
        return (
            f"in_keys={self.in_keys}, out_keys={self.out_keys}, "
            f"memory_length={self.memory_length}"
        )


register_memory("transformer", TransformerModule, ("memory", "count"))
