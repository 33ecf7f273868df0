"""check_env_specs: run an env briefly and compare everything it returns with its specs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from tensordict import NestedKey, TensorDictBase

from recurrl.envs.specs import Composite, TensorSpec
from recurrl.envs.utils import RESET_KEY

if TYPE_CHECKING:
    from recurrl.envs.common import EnvBase

__all__ = ["check_env_specs"]


def _merge(env: EnvBase, *names: str) -> dict[NestedKey, tuple[str, TensorSpec]]:
    """Leaf key -> (name of the first spec declaring it, leaf spec)."""
    out: dict[NestedKey, tuple[str, TensorSpec]] = {}
    for name in names:
        spec: Composite = getattr(env, name)
        for key, leaf in spec.items(include_nested=True, leaves_only=True):
            out.setdefault(key, (name, leaf))
    return out


def _short(value: torch.Tensor) -> str:
    flat = value.detach().flatten()
    text = str(flat[:8].tolist())
    return text if flat.numel() <= 8 else text[:-1] + ", ...]"


def _check_leaf(
    where: str, key: NestedKey, spec_name: str, spec: TensorSpec, value: object
) -> None:
    prefix = f"check_env_specs: {where}: key {key!r} ({spec_name})"
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{prefix}: expected a tensor, received {type(value).__name__}.")
    if value.shape != spec.shape or value.dtype != spec.dtype:
        raise ValueError(
            f"{prefix}: expected shape {tuple(spec.shape)} and dtype {spec.dtype}, received "
            f"shape {tuple(value.shape)} and dtype {value.dtype}."
        )
    if spec.device is not None and value.device != spec.device:
        raise ValueError(f"{prefix}: expected device {spec.device}, received {value.device}.")
    if not spec.is_in(value):
        raise ValueError(
            f"{prefix}: values outside the spec: expected values of {spec!r}, received "
            f"{_short(value)}."
        )


def _check_td(
    where: str,
    td: TensorDictBase,
    required: dict[NestedKey, tuple[str, TensorSpec]],
    optional: dict[NestedKey, tuple[str, TensorSpec]] | None = None,
) -> None:
    """Every required key present and valid, optional ones valid if present, no others."""
    optional = optional or {}
    received = td.keys(include_nested=True, leaves_only=True)
    for key, (spec_name, spec) in required.items():
        if key not in received:
            raise ValueError(
                f"check_env_specs: {where}: key {key!r} declared in {spec_name} is missing; "
                f"received keys {sorted(map(str, received))}."
            )
        _check_leaf(where, key, spec_name, spec, td.get(key))
    for key in received:
        if key in required:
            continue
        if key not in optional:
            raise ValueError(
                f"check_env_specs: {where}: key {key!r} is not declared in any spec (it would "
                f"not be carried by step_mdp). Fix: declare it in the observation_spec (or "
                f"state_spec), or stop writing it."
            )
        spec_name, spec = optional[key]
        _check_leaf(where, key, spec_name, spec, td.get(key))


def _check_done(where: str, next_td: TensorDictBase) -> None:
    keys = next_td.keys()
    if not {"done", "terminated", "truncated"} <= set(keys):
        return
    ended = next_td.get("terminated") | next_td.get("truncated")
    if bool((ended & ~next_td.get("done")).any()):
        raise ValueError(
            f"check_env_specs: {where}: 'done' must be set wherever 'terminated' or "
            f"'truncated' is; received done={next_td.get('done').flatten().tolist()}, "
            f"terminated | truncated={ended.flatten().tolist()}."
        )


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):  # random actions use torch's global RNG
        torch.manual_seed(seed)
        yield


def check_env_specs(env: EnvBase, *, seed: int | None = None, steps: int = 8) -> None:
    """Run ``env`` for a few random steps and check every output against its specs.

    Checked: the ``reset`` output (observation, state and done keys, no others); the
    random action (action spec); every step's ``"next"`` (observation, reward and done
    keys, state keys when written, no undeclared key); ``done`` set wherever
    ``terminated`` or ``truncated`` is; the root after ``step_mdp`` and after the partial
    reset of finished envs; and that ``env.fake_tensordict()`` has the keys of a real
    step. Each value must have the spec's shape, dtype and device and satisfy ``is_in``.

    Args:
        env: the env (base or transformed).
        seed: seeds the env and, inside a forked RNG, torch's global RNG (random
            actions); ``None`` leaves both as they are.
        steps: number of steps (finished envs are reset partially and continue).

    Raises:
        ValueError: naming the phase, the key and the spec, with expected vs received.

    Examples:
        >>> from recurrl.testing import CountingEnv
        >>> check_env_specs(CountingEnv(batch_size=(2,), max_steps=[2, 3]), seed=0)
    """
    if steps < 1:
        raise ValueError(f"check_env_specs: expected steps >= 1, received {steps}.")
    root = _merge(env, "observation_spec", "state_spec", "done_spec")
    nxt = _merge(env, "observation_spec", "full_reward_spec", "done_spec")
    state = _merge(env, "state_spec")
    action = _merge(env, "full_action_spec")
    with _seeded(seed):
        if seed is not None:
            env.set_seed(seed)
        td = env.reset()
        _check_td("reset", td, root)
        for t in range(steps):
            td = env.rand_action(td)
            _check_td(f"step {t} (root, with the action)", td, {**root, **action})
            td = env.step(td)
            next_td = td.get("next")
            _check_td(f"step {t} ('next')", next_td, nxt, state)
            _check_done(f"step {t} ('next')", next_td)
            if t == 0:
                _check_fake_keys(env, td)
            td = env.step_mdp(td)
            _check_td(f"step {t} (root after step_mdp)", td, root)
            done = td.get("done", None)
            if done is not None and bool(done.any()):
                td.set(RESET_KEY, done.clone())
                reset_td = env.reset(td)
                del td[RESET_KEY]
                _check_td(f"step {t} (partial reset of the finished envs)", reset_td, root)
                td.update(reset_td)


def _check_fake_keys(env: EnvBase, real: TensorDictBase) -> None:
    fake_keys = set(env.fake_tensordict().keys(include_nested=True, leaves_only=True))
    real_keys = set(real.keys(include_nested=True, leaves_only=True))
    if fake_keys != real_keys:
        raise ValueError(
            f"check_env_specs: env.fake_tensordict() and a real step hold different keys: "
            f"only in fake {sorted(map(str, fake_keys - real_keys))}, only in the real step "
            f"{sorted(map(str, real_keys - fake_keys))}."
        )
