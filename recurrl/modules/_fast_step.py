"""The sequential step's fast path: one call of a recurrent module on a plain ``TensorDict``.

A policy acting in an env calls its recurrent module once per env step on a small batch,
where the cell itself costs a few tens of µs and everything around it (TensorDict reads
and writes, shape checks, reshapes) used to cost as much again. :func:`fast_step` runs the
usual call, a ``TensorDict`` (not a subclass or a lazy stack) whose input, ``is_init`` and
states are plain tensors of the expected shapes and dtypes, with:

* the per-module facts (keys, which of them are plain strings, the network's sizes, whether
  one fused cell operator runs the step) gathered once in a :class:`StepPlan`, and the
  per-batch shapes cached in it;
* plain-string keys read from the TensorDict's dict, and outputs written with tensordict's
  ``_set_str(..., validated=True)`` after the checks its validation would make (leading dims
  equal to the batch size by construction, same device), so a locked TensorDict still
  raises tensordict's own error;
* one-layer networks stepped on ``[N, S]`` states with the reset applied there
  (:func:`~recurrl.functional.recurrent.step.single_layer_step`), without the
  ``[N, 1, S]`` round trip of :func:`~recurrl.functional.recurrent.recurrent_step` (an
  unbatched env's ``[1, S]`` states are already the cell's shape: no reshape at all);
* with ``recurrent_backend="cpp"`` (and ``"auto"`` on CPU where recurrl's C++ kernels
  load), a one-layer LSTM or GRU stepped by one C++ operator
  (:func:`~recurrl.functional.recurrent.cpp_step.cpp_step_fn`: reset, gates and new
  ``[N, 1, S]`` states in one call), where autograd need not record; the checked path calls
  the same step.

Anything else returns ``None`` before writing anything, and the module takes its checked
path (:meth:`RecurrentModule._step_checked`), which converts what it can and raises the
documented errors. Both give identical TensorDicts (``tests/modules/test_fast_step.py``).
"""

from __future__ import annotations

from operator import methodcaller
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict
from torch import Tensor

from recurrl.functional.recurrent import RNNConfig, auto_step_runs_cpp, recurrent_step
from recurrl.functional.recurrent.cell import GRUKind, LSTMKind
from recurrl.functional.recurrent.cpp_step import cpp_step_fn
from recurrl.functional.recurrent.step import single_layer_step

if TYPE_CHECKING:
    from recurrl.modules.recurrent import RecurrentModule

__all__ = ["StepPlan", "fast_step", "step_plan"]

_BOOL = torch.bool
# map with C-level callables instead of comprehensions, which cost a function frame each on
# Python < 3.12 (a few tenths of a µs each, on a call of a few tens of µs)
_LAYER_0 = methodcaller("select", -2, 0)
_ADD_LAYER = methodcaller("unsqueeze", -2)


class StepPlan:
    """What :func:`fast_step` needs of a module, derived from its keys and network once.

    Rebuilt when the module's config (``_cfg``), ``python_based``, recurrent options or keys
    change (compared at every call: the keys are assignable lists).
    """

    __slots__ = (
        "batches", "cell", "cfg", "cpp_step", "fused", "in_keys", "kind", "next_keys",
        "options", "out_key", "out_keys", "params", "plain_in", "python_based", "single_layer",
        "state_keys", "x_key",
    )  # fmt: skip

    def __init__(self, module: RecurrentModule, cfg: RNNConfig) -> None:
        self.cfg = cfg
        self.python_based = module.python_based
        self.options = module._recurrent_options
        self.in_keys = list(module._in_keys)
        self.out_keys = list(module._out_keys)
        #: input and state keys (``is_init`` is read by name)
        self.x_key = self.in_keys[0]
        self.state_keys = tuple(self.in_keys[1:-1])
        #: all of them plain strings: read from the TensorDict's dict
        self.plain_in = all(type(k) is str for k in self.in_keys)
        self.out_key = self.out_keys[0]
        #: the state outputs' names inside ``"next"``, or ``None`` if one is not a plain
        #: ``("next", name)`` key (they are then written with ``td.set``)
        names = [
            k[1] if type(k) is tuple and len(k) == 2 and k[0] == "next" else None
            for k in self.out_keys[1:]
        ]
        self.next_keys = None if None in names else tuple(names)
        self.single_layer = cfg.num_layers == 1
        self.fused = not self.python_based and not cfg.proj_size
        self.kind = cfg.kind
        self.params = cfg.params_per_layer
        #: torch's fused cell operator, called directly on a one-layer LSTM or GRU (what the
        #: kind's ``fused_cell`` calls: the same numbers), else ``None``
        self.cell = None
        if self.fused and self.single_layer:
            if type(self.kind) is LSTMKind:
                self.cell = torch.lstm_cell
            elif type(self.kind) is GRUKind:
                self.cell = torch.gru_cell
        #: the C++ step of a one-layer LSTM/GRU with ``recurrent_backend="cpp"``, and with
        #: ``"auto"`` for a CPU float32/float64 module where the kernels load (it rounds as
        #: the cpp scan does, not as torch's cells), else ``None``
        self.cpp_step = None
        backend = self.options.backend
        if backend == "cpp" and not self.python_based:
            self.cpp_step = cpp_step_fn(cfg)
        elif backend == "auto" and self.single_layer and self.fused:
            weight = module._flat_weights()[0]
            if auto_step_runs_cpp(cfg.mode, weight.device, weight.dtype):
                self.cpp_step = cpp_step_fn(cfg, eager_only=True)
        #: per batch size, see :meth:`shapes`
        self.batches: dict[torch.Size, tuple[Any, ...]] = {}

    def shapes(self, batch: torch.Size) -> tuple[Any, ...]:
        """For a batch size: the expected shapes of the input, ``is_init`` and the states,
        ``N``, whether the batch is ``[N]``, the shapes of the output and new states, and
        whether the batch is ``[]`` (an unbatched env)."""
        shapes = self.batches.get(batch)
        if shapes is None:
            cfg = self.cfg
            state_shapes = tuple((*batch, cfg.num_layers, size) for size in cfg.state_sizes)
            shapes = (
                (*batch, cfg.input_size),
                (*batch, 1),
                state_shapes,
                batch.numel(),
                len(batch) == 1,
                (*batch, cfg.proj_size or cfg.hidden_size),
                state_shapes,
                len(batch) == 0,
            )
            self.batches[batch] = shapes
        return shapes


def step_plan(module: RecurrentModule) -> StepPlan:
    """The module's plan, rebuilt if its config, ``python_based``, recurrent options or keys
    changed."""
    # what module._current_config() does, inlined (this runs at every env step)
    cfg = module._cfg
    if cfg.dropout != module._modules[module._rnn_name].dropout:
        cfg = module._current_config()
    plan = module._step_plan
    if (
        plan is None
        or plan.cfg is not cfg
        or plan.python_based != module.python_based
        or plan.options is not module._recurrent_options
        or plan.in_keys != module._in_keys
        or plan.out_keys != module._out_keys
    ):
        plan = module._step_plan = StepPlan(module, cfg)
    return plan


def _read(
    plan: StepPlan, td: TensorDict, shapes: tuple[Any, ...], dtype: torch.dtype
) -> tuple[Tensor, Tensor, list[Tensor]] | None:
    """Input, ``is_init`` and states when all are plain tensors of the expected shapes and
    dtypes (``dtype`` the parameters') on the TensorDict's device, else ``None``."""
    entries = td._tensordict
    if plan.plain_in:
        x = entries.get(plan.x_key)
        states = list(map(entries.get, plan.state_keys))
    else:
        x = td.get(plan.x_key, None)
        states = [td.get(key, None) for key in plan.state_keys]
    is_init = entries.get("is_init")
    if (
        type(x) is not Tensor
        or x.shape != shapes[0]
        or x.dtype != dtype
        or type(is_init) is not Tensor
        or is_init.shape != shapes[1]
        or is_init.dtype != _BOOL
    ):
        return None
    for s, shape in zip(states, shapes[2]):  # as many (both come from the plan)
        if type(s) is not Tensor or s.shape != shape or s.dtype != dtype:
            return None
    device = td._device
    if device is not None and x.device != device:
        return None
    return x, is_init, states


def _any_on_cpu(mask: Tensor) -> bool:
    """``bool(mask.any())`` for a bool CPU tensor, read without torch ops: ``item()`` of a
    single flag, Python's ``any`` over the bytes of more (``any()`` and its host read cost
    several µs, numpy's ``count_nonzero`` ~0.4 µs more than the bytes)."""
    if mask.numel() == 1:
        return mask.item()
    return any(mask.numpy().tobytes())


#: the zero a reset writes, a 0-dim float tensor: ``torch.where`` with it takes ~1.1 µs less
#: than ``masked_fill(mask, 0)`` on a few rows (no scalar wrapping); a 0-dim operand does
#: not change the result's dtype, so the values are those of the masked_fill
_ZERO = torch.zeros(())


def _reset(mask: Tensor, state: Tensor) -> Tensor:
    """``state.masked_fill(mask, 0)``, the same values (``+0.0`` in the masked rows, NaN
    included), by ``torch.where`` with a 0-dim zero on CPU."""
    if state.is_cpu:
        return torch.where(mask, _ZERO, state)
    return state.masked_fill(mask, 0)


def _one_layer(
    plan: StepPlan, weights: list[Tensor], x: Tensor, is_init: Tensor, states: list[Tensor],
    shapes: tuple[Any, ...],
) -> tuple[Tensor, list[Tensor]]:  # fmt: skip
    """A one-layer step on ``[N, S]`` states: the reset mask ``[N, 1]`` broadcasts over the
    features, and the states need no ``[N, 1, S]`` round trip."""
    _, _, state_shapes, n, flat, y_shape, out_shapes, unbatched = shapes
    cell = plan.cell
    if unbatched and cell is not None:
        # an unbatched env (one GymEnv): x [F], is_init [1] and states [1, S], whose layer
        # dim is the cell's batch of one, so only x gains a dim and y loses one (the same
        # operators as below, without the reshapes)
        x = x.unsqueeze(0)
        if cell is torch.lstm_cell:
            h, c = states
            if not is_init.is_cpu or is_init.item():
                h, c = _reset(is_init, h), _reset(is_init, c)
            h, c = cell(x, (h, c), *weights[: plan.params])
            return h.squeeze(0), [h, c]
        h = states[0]
        if not is_init.is_cpu or is_init.item():
            h = _reset(is_init, h)
        h = cell(x, h, *weights[: plan.params])
        return h.squeeze(0), [h]
    if flat and cell is not None:
        # the collector's [N] batch of a one-layer LSTM or GRU: the fewest operators, each
        # the one the general branch below runs (same numbers)
        if cell is torch.lstm_cell:
            h, c = states
            h = h.squeeze(-2)
            c = c.squeeze(-2)
            if not is_init.is_cpu or _any_on_cpu(is_init):
                h, c = _reset(is_init, h), _reset(is_init, c)
            h, c = cell(x, (h, c), *weights[: plan.params])
            return h, [h.unsqueeze(-2), c.unsqueeze(-2)]
        h = states[0].squeeze(-2)
        if not is_init.is_cpu or _any_on_cpu(is_init):
            h = _reset(is_init, h)
        h = cell(x, h, *weights[: plan.params])
        return h, [h.unsqueeze(-2)]
    if flat:
        mask = is_init
        states = list(map(_LAYER_0, states))
    else:
        x = x.reshape(n, x.shape[-1])
        mask = is_init.reshape(n, 1)
        states = [s.reshape(n, shape[-1]) for s, shape in zip(states, state_shapes)]
    # skipping the reset when nothing restarts is free on CPU only (elsewhere the question
    # costs a device synchronisation), as in the checked path
    if not mask.is_cpu or _any_on_cpu(mask):
        states = list(map(methodcaller("masked_fill", mask, 0), states))
    # single_layer_step, inlined
    new = plan.kind.fused_cell(x, states, weights[: plan.params]) if plan.fused else None
    if new is None:
        new = single_layer_step(plan.cfg, weights, x, states, fused=plan.fused)
    y = new[0]
    if flat:
        return y, list(map(_ADD_LAYER, new))
    return y.reshape(y_shape), [s.reshape(shape) for s, shape in zip(new, out_shapes)]


def _cpp(
    plan: StepPlan, weights: list[Tensor], x: Tensor, is_init: Tensor, states: list[Tensor],
    shapes: tuple[Any, ...],
) -> tuple[Tensor, Any] | None:  # fmt: skip
    """The C++ step (``plan.cpp_step``): the reset, the gates and the new states in one
    operator; ``None`` where it cannot run (autograd would record, not CPU float32/float64):
    torch's cells run instead."""
    _, _, state_shapes, n, flat, y_shape, out_shapes, unbatched = shapes
    if flat:  # [N, 1, S] states in and out
        return plan.cpp_step(x, states, is_init, weights)
    if unbatched:  # [1, S] states and is_init [1]: already the operator's [n, S] and [n]
        out = plan.cpp_step(x.unsqueeze(0), states, is_init, weights)
        return None if out is None else (out[0].squeeze(0), out[1])
    x = x.reshape(n, x.shape[-1])
    states = [s.reshape(n, shape[-1]) for s, shape in zip(states, state_shapes)]
    out = plan.cpp_step(x, states, is_init.reshape(n), weights)
    if out is None:
        return None
    y, new = out
    return y.reshape(y_shape), [s.reshape(shape) for s, shape in zip(new, out_shapes)]


def _layers(
    module: RecurrentModule, plan: StepPlan, weights: list[Tensor], x: Tensor, is_init: Tensor,
    states: list[Tensor], shapes: tuple[Any, ...],
) -> tuple[Tensor, list[Tensor]]:  # fmt: skip
    """A step of a stacked (or projected) network: :func:`recurrent_step` on ``[N, L, S]``."""
    _, _, state_shapes, n, flat, y_shape, out_shapes, _ = shapes
    if not flat:
        x = x.reshape(n, x.shape[-1])
        states = [s.reshape(n, *shape[-2:]) for s, shape in zip(states, state_shapes)]
    if not is_init.is_cpu or _any_on_cpu(is_init):
        reset = is_init.reshape(n, 1, 1)
        states = [s.masked_fill(reset, 0) for s in states]
    y, new = recurrent_step(
        plan.cfg, weights, x, tuple(states), training=module.training,
        python_based=plan.python_based,
    )  # fmt: skip
    if flat:
        return y, list(new)
    return y.reshape(y_shape), [s.reshape(shape) for s, shape in zip(new, out_shapes)]


def _write(plan: StepPlan, td: TensorDict, y: Tensor, new: list[Tensor]) -> None:
    """Write the output and the new states as ``td.set`` would.

    The values' leading dims are the batch size by construction, and they are on the
    input's device, which is the TensorDict's: what tensordict's validation would check, so
    plain keys are set with ``validated=True`` (a locked TensorDict still raises there).
    """
    out_key = plan.out_key
    if type(out_key) is str:
        td._set_str(out_key, y, inplace=False, validated=True)
    else:
        td.set(out_key, y)
    nxt = td._tensordict.get("next")
    if (
        plan.next_keys is not None
        and type(nxt) is TensorDict
        and nxt._batch_size == td._batch_size
        and (nxt._device is None or nxt._device == y.device)
    ):
        for name, s in zip(plan.next_keys, new):  # as many (the cell returns every state)
            nxt._set_str(name, s, inplace=False, validated=True)
    elif (
        nxt is None
        and plan.next_keys is not None
        and not td._is_locked
        and td._maybe_names() is None
        and (td._device is None or td._device == y.device)
    ):
        # no "next" yet (the usual step): built with its entries, as td.set(("next", name))
        # would build it (td.empty(), then each state set), in one construction
        entries = dict(zip(plan.next_keys, new))
        nxt = TensorDict._new_unsafe(entries, batch_size=td._batch_size, device=td._device)
        td._set_str("next", nxt, inplace=False, validated=True)
    else:
        for key, s in zip(plan.out_keys[1:], new):
            td.set(key, s)


def fast_step(module: RecurrentModule, td: TensorDict) -> TensorDict | None:
    """One sequential step of ``module`` on the plain ``TensorDict`` ``td``, written into it
    and returned; ``None``, with ``td`` untouched, when the call is not the usual one."""
    plan = step_plan(module)
    batch = td._batch_size
    shapes = plan.batches.get(batch) or plan.shapes(batch)
    rnn = module._modules[module._rnn_name]  # module._flat_weights(), inlined
    weights = rnn.flat_weights if plan.python_based else rnn._flat_weights
    read = _read(plan, td, shapes, weights[0].dtype)
    if read is None:
        return None
    out = None if plan.cpp_step is None else _cpp(plan, weights, *read, shapes)
    if out is not None:
        y, new = out
    elif plan.single_layer:
        y, new = _one_layer(plan, weights, *read, shapes)
    else:
        y, new = _layers(module, plan, weights, *read, shapes)
    _write(plan, td, y, new)
    return td
