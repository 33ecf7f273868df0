"""TensorDictPrimer: declare extra keys (e.g. recurrent states) and fill them on reset."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase, unravel_key
from torch import nn

from recurrl.envs._torchrl import import_torchrl, spec_to_torchrl
from recurrl.envs.specs import Composite, TensorSpec, Unbounded
from recurrl.envs.transforms.transform import Transform
from recurrl.envs.utils import RESET_KEY, get_reset_mask, where_reset

__all__ = ["TensorDictPrimer"]

DefaultValue = float | Callable[[], Any] | Mapping[NestedKey, float | Callable[[], Any]]


class TensorDictPrimer(Transform):
    """Declare keys in the env specs and write their initial value on reset.

    Every primer key is registered in the observation spec *and* the state spec, so
    ``step_mdp`` promotes ``("next", key)`` to ``key``: a recurrent state written by the
    policy under ``("next", key)`` rides to the next step. On reset the keys are filled
    with ``default_value`` (zeros by default) for the envs being reset; envs not being
    reset keep the incoming value. On step, a key the policy did not write under
    ``"next"`` is copied forward unchanged (so a non-recurrent policy leaves it as is).

    Specs may be given without the env batch dims: with ``expand_specs=None`` (default) a
    spec whose leading dims differ from the env batch size is expanded to
    ``[*B, *spec.shape]``; ``True`` always expands (use it when a feature dim may equal the
    batch size, e.g. ``(num_layers, H)`` with ``num_layers == N``); ``False`` never does.
    A ``Composite`` given with the env batch shape (``Composite(k=Unbounded((N, 4)),
    shape=(N,))`` on a batch-``[N]`` env) already holds the batch dims and is never expanded.

    Agent groups (multi-agent envs, ``docs/guides/multiagent.md``): a key under a group,
    e.g. ``("agents", "rs_h")`` with spec ``[n_agents, num_layers, H]``, is zero-filled
    ``[*B, n_agents, num_layers, H]`` for the env rows being reset like any other key; and
    on step, the agents whose own episode starts at this step (``(group, "is_init")`` of
    the step input, written by an ``InitTracker``: an agent re-entering mid-episode) get
    their initial value stored under ``(group, key)`` of the step input, the other agents'
    values left alone. A recurrent module ignored that agent's incoming state at this step
    (its ``is_init``); storing the initial state there makes a replay that restarts from
    the stored state at every ``is_init`` compute the same, as after an env reset, while
    ``("next", group, key)`` stays the module's exact output.

    Adding a primer for a key the env already declares raises (a second primer for the
    same keys is a bug); use :func:`~recurrl.envs.transforms.find_transform` to check.

    Args:
        primers: dict or Composite mapping (nested) keys to specs; a value may itself be a
            Composite (or dict) of specs, whose leaves become nested keys.
        random: draw the initial values from the specs at every reset (``spec.rand()``,
            torch's global RNG) instead of ``default_value``. Exclusive with
            ``default_value`` (a ``default_value`` of ``0``, the default fill, is accepted
            with it, as by the reference).
        default_value: initial value: a number (default ``0.0``); a callable taking no
            argument and returning a tensor broadcastable to ``[*B, *spec.shape]``, called
            once per key and reset (once per reset for all keys with
            ``single_default_value=True``); or a dict giving a number/callable per key.
        reset_key: key of the partial-reset mask. Default ``"_reset"``.
        expand_specs: see above.
        single_default_value: see ``default_value``.
        **kwargs: more primers, ``key=spec``.

    Examples:
        >>> from recurrl.envs.specs import Unbounded
        >>> from recurrl.envs.transforms import TransformedEnv
        >>> from recurrl.testing import CountingEnv
        >>> primer = TensorDictPrimer(rs_h=Unbounded((1, 4)), rs_c=Unbounded((1, 4)))
        >>> primer
        TensorDictPrimer(keys=['rs_h', 'rs_c'], default_value=0.0)
        >>> env = TransformedEnv(CountingEnv(batch_size=(3,)), primer)
        >>> td = env.reset()
        >>> td["rs_h"].shape, td["rs_h"].abs().sum().item()
        (torch.Size([3, 1, 4]), 0.0)
        >>> td = env.step(env.rand_action(td))
        >>> td["next", "rs_h"] = torch.ones(3, 1, 4)  # what a recurrent policy writes
        >>> env.step_mdp(td)["rs_h"].sum().item()
        12.0

        A state per agent, under an agent group:

        >>> from recurrl.testing import MultiAgentRecallEnv
        >>> primer = TensorDictPrimer({("agents", "rs_h"): Unbounded((3, 1, 4))}, expand_specs=True)
        >>> env = TransformedEnv(MultiAgentRecallEnv(batch_size=(2,), n_agents=3), primer)
        >>> env.reset()["agents", "rs_h"].shape
        torch.Size([2, 3, 1, 4])
    """

    # On a partial reset _reset writes out_keys already merged with the current values.
    _partial_reset_merges = True

    def __init__(
        self,
        primers: Mapping[NestedKey, TensorSpec] | Composite | None = None,
        random: bool | None = None,
        default_value: DefaultValue | None = None,
        reset_key: NestedKey | None = None,
        expand_specs: bool | None = None,
        single_default_value: bool = False,
        **kwargs: TensorSpec,
    ) -> None:
        specs = _collect_primers(primers, kwargs)
        keys = specs.keys(include_nested=True, leaves_only=True)
        super().__init__(in_keys=keys, out_keys=keys)
        if random and not _is_default_fill(default_value):
            raise ValueError(
                f"TensorDictPrimer: random=True draws the initial values from the specs, and "
                f"default_value={default_value!r} gives them: the two are exclusive. Fix: "
                f"pass random=True alone, or default_value alone."
            )
        if random:
            default_value = None  # 0 (the default fill) given with random=True
        if isinstance(default_value, Mapping):
            given = {unravel_key(k) for k in default_value}
            missing = [k for k in keys if unravel_key(k) not in given]
            extra = [k for k in given if k not in {unravel_key(k) for k in keys}]
            if missing or extra:
                raise ValueError(
                    f"TensorDictPrimer: the default_value dict must have one entry per primer "
                    f"key {keys}; missing {missing}, unknown {extra}."
                )
            default_value = {unravel_key(k): v for k, v in default_value.items()}
        self.primers = specs
        #: Batch shape of a Composite given as ``primers`` (``()`` otherwise): its leaves
        #: already hold these leading dims, so an env of that batch size is not expanded to.
        self._given_batch = primers.shape if isinstance(primers, Composite) else torch.Size()
        self.random = bool(random)
        self.default_value: DefaultValue = 0.0 if default_value is None else default_value
        self.reset_key: NestedKey = RESET_KEY if reset_key is None else reset_key
        self.expand_specs = expand_specs
        self.single_default_value = single_default_value
        self.__dict__["_expanded_cache"] = {}

    @classmethod
    def from_module(
        cls, module: nn.Module, *, device: torch.device | str | None = None
    ) -> TensorDictPrimer:
        """The primer of a module that describes its recurrent state.

        ``module.recurrent_state_spec`` maps every state key to ``(shape, dtype)``, the
        shape without batch dims (``[num_layers, S]`` for recurrl's recurrent modules).
        The primer declares one :class:`~recurrl.envs.specs.Unbounded` spec per key, zeros
        on reset, expanded to ``[*B, *shape]`` whatever the env batch size
        (``expand_specs=True``). This is what ``module.make_tensordict_primer()`` returns:
        the module only describes its state and the env side builds the transform, so
        :mod:`recurrl.modules` never imports :mod:`recurrl.envs`.

        Args:
            module: any ``nn.Module`` with a ``recurrent_state_spec`` mapping.
            device: device of the specs; ``None`` (default) takes the device of the
                module's first parameter or buffer (CPU when it has none).

        Returns:
            A ``TensorDictPrimer`` over the module's state keys.

        Raises:
            TypeError: ``module`` has no ``recurrent_state_spec`` mapping.

        Examples:
            >>> from recurrl.modules import LSTMModule
            >>> lstm = LSTMModule(3, 8, num_layers=2, in_key="obs", out_key="features")
            >>> primer = TensorDictPrimer.from_module(lstm)
            >>> primer
            TensorDictPrimer(keys=['recurrent_state_h', 'recurrent_state_c'], default_value=0.0)
            >>> primer.primers["recurrent_state_h"].shape
            torch.Size([2, 8])
        """
        state = getattr(module, "recurrent_state_spec", None)
        if not isinstance(state, Mapping):
            got = "" if state is None else f" whose recurrent_state_spec is {type(state).__name__}"
            raise TypeError(
                f"TensorDictPrimer.from_module: expected a module with a recurrent_state_spec "
                f"mapping (state key -> (shape, dtype)), received {type(module).__name__}{got}"
                f". Fix: pass a recurrent module (LSTMModule, GRUModule, a RecurrentModule), "
                f"or build TensorDictPrimer({{key: Unbounded(shape)}}) by hand."
            )
        if device is None:
            tensor = next(itertools.chain(module.parameters(), module.buffers()), None)
            device = None if tensor is None else tensor.device
        return cls(
            {key: Unbounded(shape=shape, dtype=dtype, device=device)
             for key, (shape, dtype) in state.items()},
            expand_specs=True,
        )  # fmt: skip

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_expanded_cache"] = {}
        return state

    # --- specs ---------------------------------------------------------------------------
    def _expanded(self, batch_size: torch.Size, device: torch.device | None) -> Composite:
        """The primer specs with the env batch dims ``[*B, *shape]``, on ``device``."""
        cache_key = (tuple(batch_size), device)
        cache = self.__dict__["_expanded_cache"]
        if cache_key not in cache:
            out = Composite(shape=batch_size, device=device)
            n = len(batch_size)
            # A Composite given with the env batch shape holds batched leaves already: it
            # is never expanded again (expand_specs=True expanded it to [*B, *B, ...]).
            given_batched = n > 0 and tuple(self._given_batch[:n]) == tuple(batch_size)
            for key, spec in self.primers.items(include_nested=True, leaves_only=True):
                has_batch = tuple(spec.shape[:n]) == tuple(batch_size)
                if given_batched:
                    pass
                elif self.expand_specs or (self.expand_specs is None and not has_batch):
                    spec = spec.expand(*batch_size, *spec.shape)
                elif not has_batch:
                    raise ValueError(
                        f"TensorDictPrimer: spec for {key!r} has shape {tuple(spec.shape)}, "
                        f"expected it to start with the env batch size {tuple(batch_size)} "
                        f"(expand_specs=False). Fix: expand_specs=True or expand the spec."
                    )
                out[key] = spec
            cache[cache_key] = out
        return cache[cache_key]

    def _register(self, spec: Composite, spec_name: str) -> Composite:
        for key, primer_spec in self._expanded(spec.shape, spec.device).items(True, True):
            if key in spec:
                raise ValueError(
                    f"TensorDictPrimer: duplicate primer for key {key!r}: the env already "
                    f"declares it in its {spec_name} (a primer for it is already attached?). "
                    f"Check with find_transform(env, TensorDictPrimer) before adding one."
                )
            spec[key] = primer_spec.clone()
        return spec

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        return self._register(observation_spec, "observation_spec")

    def transform_state_spec(self, state_spec: Composite) -> Composite:
        return self._register(state_spec, "state_spec")

    # --- values --------------------------------------------------------------------------
    def _device(self, tensordict: TensorDictBase) -> torch.device | None:
        if tensordict.device is not None:
            return tensordict.device
        return self.parent.device if self.parent is not None else None

    def _fresh(self, key: NestedKey, spec: TensorSpec, shared: Any) -> torch.Tensor:
        if self.random:
            return spec.rand()
        value = self.default_value
        if isinstance(value, Mapping):
            value = value[unravel_key(key)]
        if callable(value):
            value = shared if shared is not None else value()
        tensor = torch.as_tensor(value, dtype=spec.dtype, device=spec.device)
        try:
            return tensor.expand(spec.shape).clone()
        except RuntimeError as err:
            raise ValueError(
                f"TensorDictPrimer: default value for {key!r} has shape {tuple(tensor.shape)}, "
                f"expected a shape broadcastable to {tuple(spec.shape)} ([*B, *spec.shape])."
            ) from err

    def _leaves(
        self, batch_size: torch.Size, device: torch.device | None
    ) -> list[tuple[NestedKey, TensorSpec]]:
        """``(key, expanded spec)`` of every primer leaf, cached with the expanded specs (a
        partial reset walked the nested spec every time)."""
        cache_key = ("leaves", tuple(batch_size), device)
        cache = self.__dict__["_expanded_cache"]
        leaves = cache.get(cache_key)
        if leaves is None:
            specs = self._expanded(batch_size, device)
            leaves = list(specs.items(include_nested=True, leaves_only=True))
            cache[cache_key] = leaves
        return leaves

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        batch_size = tensordict_reset.batch_size
        mask = get_reset_mask(tensordict, batch_size, self.reset_key)
        shared = None
        if self.single_default_value and callable(self.default_value):
            shared = self.default_value()
        reset_view = None
        for key, spec in self._leaves(batch_size, self._device(tensordict_reset)):
            current = tensordict.get(key, None) if mask is not None else None
            fill = self._fill_value(key)
            if fill is not None and _same_layout(current, spec, mask):
                # A partial reset to a number: filling the reset envs of the current value
                # gives what where_reset(mask, fresh, current) gives, without building fresh.
                if reset_view is None or reset_view.ndim != current.ndim:
                    reset_view = mask.reshape(*mask.shape, *[1] * (current.ndim - mask.ndim))
                tensordict_reset.set(key, current.masked_fill(reset_view, fill))
                continue
            tensordict_reset.set(key, where_reset(mask, self._fresh(key, spec, shared), current))
        return tensordict_reset

    def _fused_reset(
        self,
        tensordict: TensorDictBase,
        tensordict_reset: TensorDictBase,
        new: dict,
        mask: torch.Tensor | None,
    ) -> bool:
        if self.reset_key != RESET_KEY or self.random:
            return False
        batch_size = tensordict_reset.batch_size
        # get(str) of a plain TensorDict is a lookup in its dict; one mask view per ndim
        entries = tensordict._tensordict if type(tensordict) is TensorDict else None
        views: dict[int, torch.Tensor] = {}
        for key, spec in self._leaves(batch_size, self._device(tensordict_reset)):
            fill = self._fill_value(key)
            if not isinstance(key, str) or fill is None:
                return False
            if mask is None:
                new[key] = self._fresh(key, spec, None)
                continue
            current = entries.get(key) if entries is not None else tensordict.get(key, None)
            if not _same_layout(current, spec, mask):
                return False  # _reset's general case
            view = views.get(current.ndim)
            if view is None:
                view = mask.reshape(*mask.shape, *[1] * (current.ndim - mask.ndim))
                views[current.ndim] = view
            new[key] = current.masked_fill(view, fill)
        return True

    def _fused_step(
        self, tensordict: TensorDictBase, next_tensordict: TensorDictBase, new: dict
    ) -> bool:
        # get(str) of a plain TensorDict is a lookup in its dict: done directly
        written = next_tensordict._tensordict if type(next_tensordict) is TensorDict else None
        for key in self.out_keys:
            if not isinstance(key, str):
                return False
            if key in new:
                continue  # an earlier transform wrote the next value
            if written is not None:
                if written.get(key) is not None:
                    continue  # the policy wrote the next value
            elif next_tensordict.get(key, None) is not None:
                continue
            current = tensordict.get(key, None)
            if current is None:
                return False  # _step raises, naming the key
            new[key] = current
        return True

    def _fill_value(self, key: NestedKey) -> float | None:
        """The number ``key`` is reset to, or ``None`` (random or callable initial values)."""
        if self.random:
            return None
        value = self.default_value
        if isinstance(value, Mapping):
            value = value[unravel_key(key)]
        return None if callable(value) else value

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        written = next_tensordict.keys(include_nested=True)
        for key in self.out_keys:
            if key in written:
                continue  # the policy wrote the next value
            current = tensordict.get(key, None)
            if current is None:
                raise KeyError(
                    f"TensorDictPrimer: {key!r} is missing from the step input; the primer "
                    f"writes it on reset. Fix: start from env.reset() (or env.rollout)."
                )
            next_tensordict.set(key, current)
        for key, spec in self._leaves(tensordict.batch_size, self._device(tensordict)):
            if isinstance(key, tuple) and len(key) > 1:
                self._restart_agents(tensordict, key, spec)
        return next_tensordict

    def _restart_agents(
        self, tensordict: TensorDictBase, key: tuple[str, ...], spec: TensorSpec
    ) -> None:
        """Store the initial value of ``key`` for the agents whose ``(key[0], "is_init")``
        is set in the step input (a new tensor: the old one may be the previous step's
        ``("next", key)``, which stays as written)."""
        starts = tensordict.get((key[0], "is_init"), None)
        value = tensordict.get(key, None)
        if starts is None or value is None or starts.shape[:-1] != value.shape[: starts.ndim - 1]:
            return  # not an agent group with a per-agent is_init
        view = starts.reshape(*starts.shape[:-1], *[1] * (value.ndim - starts.ndim + 1))
        fill = self._fill_value(key)
        if fill is not None:
            tensordict.set(key, value.masked_fill(view, fill))
        else:
            tensordict.set(key, torch.where(view, self._fresh(key, spec, None), value))

    def to_torchrl(self) -> Any:
        """TorchRL's ``TensorDictPrimer`` over the same keys, specs and initial values.

        The specs become their ``torchrl.data`` counterparts; ``random``, a number or a dict of
        numbers as ``default_value``, a non-default ``reset_key`` and ``expand_specs`` carry
        over (TorchRL reads ``expand_specs=None`` more strictly: it raises on a batched env
        when the specs lack the batch dims, where recurrl expands them). What a module's
        ``make_tensordict_primer()`` returns converts as is.

        Raises:
            ValueError: a callable ``default_value`` (TorchRL calls it with another contract).
            ImportError: torchrl is not installed.

        Examples:
            >>> import pytest; torchrl = pytest.importorskip("torchrl")  # recurrl[torchrl]
            >>> from recurrl.envs.specs import Unbounded
            >>> t = TensorDictPrimer(rs_h=Unbounded((1, 4)), expand_specs=True).to_torchrl()
            >>> isinstance(t, torchrl.envs.TensorDictPrimer), t.primers["rs_h"].shape
            (True, torch.Size([1, 4]))
        """
        owner = f"{type(self).__name__}.to_torchrl"
        values = self.default_value
        given = values.values() if isinstance(values, Mapping) else [values]
        if not self.random and any(callable(v) for v in given):
            raise ValueError(
                f"{owner}: a callable default_value does not convert (TorchRL calls it with "
                f"another contract: it must return a value of the expanded spec's shape, or "
                f"one TensorDict with single_default_value=True). Fix: build "
                f"torchrl.envs.TensorDictPrimer by hand, or use a number as default_value."
            )
        envs = import_torchrl("envs", owner)
        specs = spec_to_torchrl(self.primers, owner)
        default = None if self.random else values
        if isinstance(default, Mapping):
            default = dict(default)
        reset_key = None if self.reset_key == RESET_KEY else self.reset_key
        return envs.TensorDictPrimer(
            specs, random=self.random or None, default_value=default, reset_key=reset_key,
            expand_specs=self.expand_specs,
        )  # fmt: skip

    def extra_repr(self) -> str:
        init = "random=True" if self.random else f"default_value={self.default_value!r}"
        return f"keys={self.out_keys}, {init}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"


def _same_layout(value: torch.Tensor | None, spec: TensorSpec, mask: torch.Tensor) -> bool:
    """``value`` is a tensor of exactly the spec's shape, dtype and device (the mask's)."""
    return (
        value is not None
        and value.shape == spec.shape
        and value.dtype == spec.dtype
        and value.device == spec.device == mask.device
    )


def _is_default_fill(value: Any) -> bool:
    """``default_value`` not given, or given as the default fill 0 (the reference accepts
    ``random=True`` with a falsy ``default_value``)."""
    if value is None:
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def _leaves(key: NestedKey, spec: Any) -> list[tuple[NestedKey, Any]]:
    """``(key, leaf)`` pairs of one primer entry: a leaf spec, or a Composite / dict of
    them (nested keys as tuples, as the reference's nested primers)."""
    if isinstance(spec, Composite):
        spec = dict(spec.items(include_nested=True, leaves_only=True))
    if isinstance(spec, Mapping):
        prefix = (key,) if isinstance(key, str) else tuple(key)
        out: list[tuple[NestedKey, Any]] = []
        for sub_key, sub_spec in spec.items():
            sub = (sub_key,) if isinstance(sub_key, str) else tuple(sub_key)
            out += _leaves((*prefix, *sub), sub_spec)
        return out
    return [(key, spec)]


def _collect_primers(
    primers: Mapping[NestedKey, TensorSpec] | Composite | None, kwargs: dict[str, TensorSpec]
) -> Composite:
    items: list[tuple[NestedKey, Any]] = []
    if isinstance(primers, Composite):
        items += primers.items(include_nested=True, leaves_only=True)
    elif primers is not None:
        if not isinstance(primers, Mapping):
            raise TypeError(
                f"TensorDictPrimer: expected primers as a dict or Composite of specs, received "
                f"{type(primers).__name__}."
            )
        items += [leaf for key, spec in primers.items() for leaf in _leaves(key, spec)]
    items += [leaf for key, spec in kwargs.items() for leaf in _leaves(key, spec)]
    if not items:
        raise ValueError(
            "TensorDictPrimer: expected at least one primer, received none. "
            "Example: TensorDictPrimer(rs_h=Unbounded((num_layers, hidden_size)))."
        )
    out = Composite()
    for key, spec in items:
        if not isinstance(spec, TensorSpec):
            raise TypeError(
                f"TensorDictPrimer: expected a TensorSpec (or a Composite of them) for key "
                f"{key!r}, received {type(spec).__name__}."
            )
        key = unravel_key(key)
        if key in out:
            raise ValueError(f"TensorDictPrimer: key {key!r} is given twice.")
        out[key] = spec
    return out
