"""The env transforms a policy needs, found from its modules: primers and ``is_init``.

The modules describe their recurrent state (``recurrent_state_spec``: key -> ``(shape,
dtype)``, or a ``make_tensordict_primer()`` method); the transforms are built here, on the
env side, so :mod:`recurrl.modules` does not import :mod:`recurrl.envs`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from tensordict.utils import NestedKey
from torch import nn

from recurrl.envs.transforms.init_tracker import InitTracker
from recurrl.envs.transforms.primer import TensorDictPrimer
from recurrl.envs.transforms.transform import Compose, Transform

__all__ = ["get_env_transforms_from_module", "get_primers_from_module"]


def _primer_maker(module: nn.Module) -> Callable[[], Transform] | None:
    """How ``module`` makes its primer: its own ``make_tensordict_primer`` (which a subclass
    may override), else :meth:`TensorDictPrimer.from_module` when it describes its state;
    ``None`` for a module without recurrent state."""
    make = getattr(module, "make_tensordict_primer", None)
    if callable(make):
        return make
    if hasattr(module, "recurrent_state_spec"):
        return lambda: TensorDictPrimer.from_module(module)
    return None


def get_primers_from_module(
    module: nn.Module, warn: bool = True, strict: bool = True
) -> TensorDictPrimer | Compose | None:
    """The primers every recurrent submodule of ``module`` needs, in module order.

    Every submodule with a ``make_tensordict_primer()`` method contributes its primer (a
    submodule that only describes its state with ``recurrent_state_spec`` contributes
    :meth:`TensorDictPrimer.from_module(sub) <recurrl.envs.TensorDictPrimer.from_module>`).
    Also importable from :mod:`recurrl.modules` and :mod:`recurrl.modules.utils`.

    Args:
        module: the policy (or any ``nn.Module``) to look through.
        warn: emit a ``UserWarning`` when ``module`` holds no recurrent module (a policy
            passed here usually should hold one). Default: True.
        strict: let an exception raised by a submodule's ``make_tensordict_primer()``
            propagate. With ``False`` such submodules are skipped, one ``UserWarning`` names
            their types, and the primers of the others are still returned. Default: True.

    Returns:
        ``None`` when no primer was made, the single ``TensorDictPrimer`` when there is
        one, and a ``Compose`` of them otherwise.

    Examples:
        >>> from tensordict.nn import TensorDictSequential as Seq
        >>> from torch import nn
        >>> from recurrl.modules import GRUModule, LSTMModule
        >>> policy = Seq(
        ...     LSTMModule(3, 8, in_key="obs", out_key="a"),
        ...     GRUModule(8, 4, in_keys=["a", "gru_h"], out_keys=["b", ("next", "gru_h")]),
        ... )
        >>> type(get_primers_from_module(policy)).__name__
        'Compose'
        >>> get_primers_from_module(nn.Linear(2, 2), warn=False) is None
        True
    """
    primers, failed = [], []
    for sub in module.modules():
        make = _primer_maker(sub)
        if make is None:
            continue
        if strict:
            primers.append(make())
            continue
        try:
            primers.append(make())
        except Exception as err:  # reported below, as strict=False asks
            failed.append(f"{type(sub).__name__} ({type(err).__name__}: {err})")
    if failed:
        warnings.warn(
            f"get_primers_from_module(strict=False): make_tensordict_primer() failed for "
            f"{len(failed)} submodule(s), whose primers are left out: {'; '.join(failed)}. "
            f"Their state keys will be missing from the env; call it with strict=True to "
            f"see the full error.",
            UserWarning,
            stacklevel=2,
        )
    if not primers:
        if warn:
            warnings.warn(
                f"get_primers_from_module: no primer found in {type(module).__name__} (it "
                f"holds no LSTMModule/GRUModule or other module with make_tensordict_primer"
                f"()); returning None. Pass warn=False if that is expected.",
                UserWarning,
                stacklevel=2,
            )
        return None
    if len(primers) == 1:
        return primers[0]
    return Compose(*primers)


def get_env_transforms_from_module(module: nn.Module, init_key: NestedKey = "is_init") -> (
    Compose | InitTracker
):  # fmt: skip
    """The env transforms a policy needs: an ``InitTracker`` and its recurrent modules' primers.

    Also importable from :mod:`recurrl.modules` and :mod:`recurrl.modules.utils`.

    Append the result to the env (``TransformedEnv(base_env, transforms)`` or
    ``env.append_transform(transforms)``) so that ``init_key`` marks episode starts and the
    hidden states ride from step to step.

    Args:
        module: the policy; its recurrent submodules are found as by
            :func:`get_primers_from_module`.
        init_key: the key ``InitTracker`` writes. recurrl's recurrent modules read
            ``"is_init"``; another key raises ``ValueError`` when ``module`` holds one
            (they would never see a reset). Default: ``"is_init"``.

    Returns:
        ``Compose(InitTracker(init_key), *primers)`` when ``module`` holds recurrent
        modules, else the bare ``InitTracker``.

    Examples:
        >>> from torch import nn
        >>> from recurrl.modules import GRUModule
        >>> gru = GRUModule(4, 8, in_keys=["obs", "rs"], out_keys=["features", ("next", "rs")])
        >>> transforms = get_env_transforms_from_module(gru)
        >>> [type(t).__name__ for t in transforms]
        ['InitTracker', 'TensorDictPrimer']
        >>> type(get_env_transforms_from_module(nn.Linear(2, 2))).__name__
        'InitTracker'
    """
    readers = [
        type(sub).__name__
        for sub in module.modules()
        if _primer_maker(sub) is not None and init_key not in getattr(sub, "in_keys", [init_key])
    ]
    if readers:
        raise ValueError(
            f"get_env_transforms_from_module: init_key={init_key!r} is not read by "
            f"{sorted(set(readers))}, which read 'is_init' to restart their hidden state; "
            f"with another key they would never see an episode start. Fix: keep the default "
            f"init_key='is_init'."
        )
    tracker = InitTracker(init_key=init_key)
    primers = get_primers_from_module(module, warn=False)
    if primers is None:
        return tracker
    return Compose(tracker, *(primers if isinstance(primers, Compose) else [primers]))
