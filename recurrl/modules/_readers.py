"""The validating readers of :class:`~recurrl.modules.recurrent.RecurrentModule`.

They read the input, ``is_init`` and the stored states from a TensorDict, convert what can be
converted without guessing (0/1 integer flags, states of another float dtype) and raise
naming the key, what was expected, what was received and the fix otherwise. The module's fast
paths decline to these on anything unusual, and the tests use them as the oracle. A call with
tensors instead of a TensorDict (``module(obs=x, is_init=m, ...)``) is read here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

if TYPE_CHECKING:
    from recurrl.functional.recurrent import RNNConfig

__all__ = ["IS_INIT_KEY", "CheckedReaders"]

IS_INIT_KEY = "is_init"
#: integer dtypes an ``is_init`` of 0/1 values may come in (cast to bool after a value check)
_INTEGER_FLAGS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _as_key(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def _show(key: NestedKey) -> str:
    key = _as_key(key)
    return repr(key[0]) if len(key) == 1 else repr(key)


class CheckedReaders:
    """Mixin of :class:`~recurrl.modules.recurrent.RecurrentModule`: its checked readers."""

    _cfg: RNNConfig
    in_keys: list[NestedKey]

    def _read_input(self, td: TensorDictBase, batch: torch.Size, dtype: torch.dtype) -> Tensor:
        """The input ``[*batch, F]``, which must have the parameters' ``dtype``."""
        key = self.in_keys[0]
        x = td.get(key, None)
        if x is None:
            raise KeyError(
                f"{type(self).__name__}: input key {_show(key)} not found in the TensorDict "
                f"(keys: {sorted(map(str, td.keys(True, True)))})."
            )
        size = self.rnn.input_size
        if x.shape[: len(batch)] != batch or x.dim() != len(batch) + 1 or x.shape[-1] != size:
            raise ValueError(
                f"{type(self).__name__}: input {_show(key)} must have shape "
                f"[*B, {size}] with batch dims {list(batch)}, got {list(x.shape)}."
            )
        if x.dtype != dtype:
            # Not cast: a float64 observation into a float32 network (or a float16 one) is
            # usually a pipeline bug, and which precision the user wants is theirs to say.
            raise TypeError(
                f"{type(self).__name__}: input {_show(key)} has dtype {x.dtype}, but the "
                f"module's parameters are {dtype}. Fix: cast the input to the parameters' "
                f"dtype (x.to({dtype}), e.g. x.float()), or the module to the input's "
                f"(module.to({x.dtype}))."
            )
        return x

    def _read_is_init(self, td: TensorDictBase, batch: torch.Size) -> Tensor:
        is_init = td.get(IS_INIT_KEY, None)
        if is_init is None:
            raise KeyError(
                f"{type(self).__name__}: key 'is_init' not found in the TensorDict. It marks "
                f"episode starts, so the hidden state is reset there, and is written by the "
                f"InitTracker transform. Fix: env = env.append_transform(InitTracker()) "
                f"(from recurrl.envs import InitTracker)."
            )
        if is_init.shape == (*batch, 1):
            is_init = is_init.squeeze(-1)
        if is_init.shape != batch:
            raise ValueError(
                f"{type(self).__name__}: 'is_init' must have shape [*B, 1] (or [*B]) with "
                f"batch dims {list(batch)}, i.e. {[*batch, 1]}; received "
                f"{list(is_init.shape)}. Fix: one flag per step, as InitTracker writes it "
                f"(env.append_transform(InitTracker()))."
            )
        return is_init if is_init.dtype == torch.bool else self._is_init_as_bool(is_init)

    def _is_init_as_bool(self, is_init: Tensor) -> Tensor:
        """A non-bool ``is_init``: 0/1 integers are cast (one host sync, off the usual path);
        anything else raises, since no reading of it is certain to be the intended one."""
        name = type(self).__name__
        if is_init.dtype in _INTEGER_FLAGS:
            if bool(((is_init == 0) | (is_init == 1)).all()):
                return is_init.bool()
            values = torch.unique(is_init).tolist()
            raise ValueError(
                f"{name}: 'is_init' of dtype {is_init.dtype} must hold only 0 and 1, received "
                f"the values {values[:6]}{'...' if len(values) > 6 else ''}. Fix: pass a bool "
                f"tensor, True at the first step of every episode (as InitTracker writes it)."
            )
        raise TypeError(
            f"{name}: 'is_init' must be a bool tensor (or 0/1 integers), True at the first "
            f"step of every episode; received dtype {is_init.dtype}. A floating flag is not "
            f"cast: thresholding it, or multiplying a state by it, could silently give a wrong "
            f"answer. Fix: pass is_init.bool() (or the comparison that defines it, e.g. "
            f"is_init > 0.5); InitTracker writes bool."
        )

    def _read_states(
        self, td: TensorDictBase, batch: torch.Size, like: Tensor, starts: Tensor
    ) -> tuple[Tensor, ...]:
        """Stored states, each ``[*batch, L, S]``.

        ``starts`` flags, per row, whether the state is needed only at episode starts:
        ``is_init`` ``[*B]`` in sequential mode, ``is_init`` at the first step ``[*B']`` in
        recurrent mode (later steps need the stored state only where ``is_init`` is True). A
        missing state key is filled with zeros, the state of an episode start, when every row
        starts one; a row that continues a trajectory raises instead.
        """
        cfg = self._cfg
        states = []
        for key, size in zip(self.state_keys, cfg.state_sizes, strict=True):
            expected = (*batch, cfg.num_layers, size)
            value = td.get(key, None)
            if value is None:
                continuing = int((~starts).sum())
                if continuing:
                    where = (
                        "at their first step (is_init False there)"
                        if self.recurrent_mode
                        else "(is_init False)"
                    )
                    raise KeyError(
                        f"{type(self).__name__}: hidden-state key {_show(key)} not found in "
                        f"the TensorDict, and {continuing} of {starts.numel()} rows continue a "
                        f"trajectory {where}, so zeros would silently drop their memory. The "
                        f"env must carry the state from step to step, which the "
                        f"TensorDictPrimer transform sets up. Fix: env = env.append_transform("
                        f"module.make_tensordict_primer()) (or get_env_transforms_from_module("
                        f"policy) for a whole policy); or pass the state."
                    )
                value = like.new_zeros(expected)
            elif value.shape != expected:
                raise ValueError(
                    f"{type(self).__name__}: hidden state {_show(key)} must have shape "
                    f"[*B, num_layers, H] = {list(expected)}, got {list(value.shape)}."
                )
            states.append(value if value.dtype == like.dtype else value.to(like.dtype))
        return tuple(states)

    def _forward_tensors(
        self, first: Tensor | None, args: tuple[Tensor, ...], kwargs: dict[str, Any]
    ) -> Tensor | tuple[Tensor, ...]:
        """``forward`` called with tensors: TensorDict in, the ``out_keys`` tensors out."""
        name = type(self).__name__
        positional = ([] if first is None else [first]) + list(args)
        names = ["_".join(_as_key(key)) for key in self.in_keys]
        if len(positional) > len(names):
            raise TypeError(
                f"{name}: at most {len(names)} positional tensors ({names}), got {len(positional)}."
            )
        values: dict[NestedKey, Tensor] = {}
        for key, kw in zip(self.in_keys, names, strict=True):
            if positional:
                if kw in kwargs:
                    raise RuntimeError(f"{name}: {kw!r} given both positionally and by keyword.")
                values[key] = positional.pop(0)
            elif kw in kwargs:
                values[key] = kwargs.pop(kw)
        if kwargs:
            raise TypeError(
                f"{name}: unexpected keyword argument(s) {sorted(kwargs)}. Called with tensors, "
                f"the module takes its in_keys as keywords: {names} (a nested key's parts "
                f"joined with '_'), or a TensorDict."
            )
        x = values.get(self.in_keys[0])
        if not isinstance(x, Tensor):
            raise TypeError(
                f"{name}: called without a TensorDict, the input {names[0]}=<tensor> is "
                f"required (got {type(x).__name__}); the module's keywords are {names}."
            )
        batch = x.shape[:-1]
        for key, kw in zip(self.in_keys, names, strict=True):
            value = values.get(key)
            if value is not None and (
                not isinstance(value, Tensor) or value.shape[: len(batch)] != batch
            ):
                shape = list(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(
                    f"{name}: {kw}= must be a tensor whose leading dims are the input's batch "
                    f"dims {list(batch)} (the input {names[0]} is {list(x.shape)} = [*B, "
                    f"features]), got {shape}."
                )
        td = TensorDict(values, batch_size=batch, device=x.device)
        out = self.forward(td)
        results = tuple(out.get(key) for key in self.out_keys)
        return results[0] if len(results) == 1 else results
