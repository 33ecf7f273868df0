"""A lean per-step call of the usual policy composition, with the same result.

A collector calls its policy once per step, and for the usual policy (a
``TensorDictSequential`` of ``TensorDictModule`` wrappers around small networks, a recurrent
module among them) tensordict's generic call machinery costs about as much as the networks
themselves: every wrapper goes through ``nn.Module.__call__``, the ``dispatch`` and
``skip_existing`` decorators, keyword handling and ``TensorDict.from_any`` on every output.

:func:`plan_policy` recognises that composition when nothing in it uses those features
(no hooks, plain keyword-free wrappers writing in place, default sequence options) and
returns a function that reads the ``in_keys``, calls the wrapped networks and writes the
``out_keys`` directly; networks and recurrl's recurrent modules (``LSTMModule``,
``GRUModule``, any ``RecurrentModule`` whose call is the base's) that have no hooks are
called through their ``forward``. Anything it does not recognise is called as it
is, so the plan of a policy it cannot improve is the policy itself (or ``None``: call the
policy). Tests compare the plan with the policy on many compositions, including every case
it must refuse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import Tensor, nn
from torch.nn.modules import module as _torch_module

from recurrl.modules import RecurrentModule

__all__ = ["plan_policy"]

Step = Callable[[TensorDictBase], TensorDictBase]

# Process-wide hooks that nn.Module.__call__ would run for every module.
_GLOBAL_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_forward_hooks_with_kwargs",
    "_global_forward_hooks_always_called",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
)


def _global_hooks() -> bool:
    return any(getattr(_torch_module, name, None) for name in _GLOBAL_HOOKS)


def _has_hooks(module: nn.Module) -> bool:
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or getattr(module, "_backward_pre_hooks", None)
    )


def _skip_existing_active() -> bool:
    try:
        from tensordict.nn import skip_existing
    except ImportError:  # pragma: no cover - every supported tensordict has it
        return True
    return bool(skip_existing())


def _plain_sequence(seq: nn.Module) -> bool:
    """A ``TensorDictSequential`` whose call runs its modules in place, nothing more."""
    try:
        return (
            type(seq) is TensorDictSequential
            and not _has_hooks(seq)
            and seq.inplace in (True, None)  # None (the default): return what ran
            and not seq._select_before_return
            and not seq.partial_tolerant
        )
    except AttributeError:  # a tensordict version with other options: do not guess
        return False


def _plain_module(mod: nn.Module) -> bool:
    """A ``TensorDictModule`` that passes its ``in_keys`` positionally to a callable and
    writes what it returns under its ``out_keys``, in place."""
    try:
        return (
            type(mod) is TensorDictModule
            and not _has_hooks(mod)
            and mod._kwargs is None
            and mod.method is None
            and not mod.method_kwargs
            and mod.inplace is True
            and list(mod.out_keys) == list(mod.out_keys_source)
            and all(isinstance(k, (str, tuple)) for k in (*mod.in_keys, *mod.out_keys))
        )
    except AttributeError:
        return False


def _module_step(mod: TensorDictModule) -> Step:
    """Read ``in_keys``, call ``mod.module``, write ``out_keys``: what ``mod(td)`` does."""
    fn = mod.module
    if isinstance(fn, nn.Module) and _bare_module(fn):
        fn = fn.forward  # Module.__call__ would only look for hooks
    in_keys = list(mod.in_keys)
    out_keys = list(mod.out_keys)
    single = len(out_keys) == 1 and out_keys[0] != "_"
    # Plain-string keys of a plain TensorDict: read from its dict and written with
    # _set_str, which makes set's checks itself (set only unravels the key first).
    plain_in = all(type(k) is str for k in in_keys)
    plain_out = single and type(out_keys[0]) is str

    def step(td: TensorDictBase) -> TensorDictBase:
        plain = type(td) is TensorDict
        if plain and plain_in:
            inputs = list(map(td._tensordict.get, in_keys))
        else:
            inputs = [td.get(k, None) for k in in_keys]
        if not all(isinstance(x, Tensor) for x in inputs):
            return mod(td)  # missing or non-tensor inputs: the wrapper's own handling
        out = fn(*inputs)
        if single and type(out) is Tensor:
            if plain and plain_out:
                td._set_str(out_keys[0], out, inplace=False, validated=False)
            else:
                td.set(out_keys[0], out)
            return td
        return _write(mod, td, out, out_keys)

    return step


def _write(mod: TensorDictModule, td: TensorDictBase, out: Any, out_keys: list) -> TensorDictBase:
    """Write a wrapped callable's result like ``TensorDictModule.forward`` does."""
    if out is None:
        out = ()
    if isinstance(out, (dict, TensorDictBase)) and all(k in out for k in out_keys):
        out = tuple(out[k] for k in out_keys)
    if not isinstance(out, tuple):
        out = (out,)
    if len(out) != len(out_keys):
        raise RuntimeError(
            f"{type(mod).__name__} with out_keys={out_keys} returned {len(out)} values; "
            f"expected one per out key."
        )
    for key, value in zip(out_keys, out, strict=True):
        if key != "_":
            td.set(key, value if type(value) is Tensor else TensorDict.from_any(value))
    return td


def _sequence_step(seq: TensorDictSequential) -> Step:
    steps = [_plan(m) for m in seq._module_iter()]

    def step(td: TensorDictBase) -> TensorDictBase:
        for i, run in enumerate(steps):
            try:
                td = run(td)
            except Exception as err:
                if hasattr(err, "add_note"):  # Python >= 3.11
                    err.add_note(f"Failed while executing module '{i}' of the policy.")
                raise
        return td

    return step


def _bare_module(module: nn.Module) -> bool:
    """No hooks and not compiled with ``module.compile()``: calling it is calling its
    ``forward`` (process-wide hooks are checked once, by :func:`plan_policy`)."""
    return not _has_hooks(module) and getattr(module, "_compiled_call_impl", None) is None


def _plain_recurrent(module: nn.Module) -> bool:
    """A bare recurrl ``RecurrentModule`` (``LSTMModule``, ``GRUModule`` or another cell's
    module) whose call is the base's: ``forward``, ``__call__`` and ``_call_impl`` not
    overridden, so that calling ``forward`` is calling the module. A subclass that changes
    any of them is called as it is."""
    cls = type(module)
    return (
        isinstance(module, RecurrentModule)
        and cls.forward is RecurrentModule.forward
        and cls.__call__ is RecurrentModule.__call__
        and cls._call_impl is RecurrentModule._call_impl
        and _bare_module(module)
    )


def _plan(module: Any) -> Step:
    if isinstance(module, nn.Module) and _plain_sequence(module):
        return _sequence_step(module)
    if isinstance(module, nn.Module) and _plain_module(module):
        return _module_step(module)
    if isinstance(module, nn.Module) and _plain_recurrent(module):
        return module.forward  # reads the recurrent mode at every call, as module(td) does
    return module  # called as it is


def plan_policy(policy: Any) -> Step | None:
    """A function giving the same TensorDict as ``policy(td)``, with less per-call work.

    Returns ``None`` when ``policy`` is not a plain ``TensorDictSequential`` (call it as
    it is) or when process-wide module hooks or tensordict's ``skip_existing`` are active
    (the plan would bypass them). Build a new plan whenever the policy's structure, hooks or
    those settings may have changed: the collector builds one per batch.
    """
    if not isinstance(policy, nn.Module) or not _plain_sequence(policy):
        return None
    if _global_hooks() or _skip_existing_active():
        return None
    return _sequence_step(policy)
