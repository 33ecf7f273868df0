"""PettingZooEnv: N PettingZoo parallel envs as one recurrl env with agent groups."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from recurrl.envs._multiagent import AGENT_DONE_KEYS, GroupMap, group_agents, multiagent_specs
from recurrl.envs.common import EnvBase
from recurrl.envs.gym import space_to_spec
from recurrl.envs.utils import get_reset_mask

__all__ = ["PettingZooEnv"]

_INSTALL = "pip install 'recurrl[multiagent]' (pettingzoo and mpe2)"


def _import_task(task: str) -> Callable[..., Any]:
    """``"package:name"`` (or ``"name"``, looked up in mpe2) -> ``package.name.parallel_env``."""
    package, _, name = task.rpartition(":")
    package = package or "mpe2"
    try:
        module = importlib.import_module(f"{package}.{name}")
    except ImportError as err:
        raise ImportError(
            f"PettingZooEnv: cannot import the task {task!r} as module {package}.{name} "
            f"({err}). Fix: {_INSTALL}, and spell the task 'package:task' with the module "
            f"that holds it, e.g. 'mpe2:simple_spread_v3' or 'pettingzoo.sisl:multiwalker_v9'."
        ) from err
    factory = getattr(module, "parallel_env", None)
    if not callable(factory):
        raise ValueError(
            f"PettingZooEnv: module {package}.{name} has no parallel_env(): recurrl wraps "
            f"PettingZoo's parallel API only. Fix: pick a task with a parallel version."
        )
    return factory


class PettingZooEnv(EnvBase):
    """``num_envs`` PettingZoo parallel envs stepped in a loop, as one env of batch ``[N]``.

    Agents are grouped (default: all under ``"agents"``; agents of one group must share
    their observation and action spaces) and written with the multi-agent key convention
    (``docs/guides/multiagent.md``): ``(group, "observation")`` ``[N, n_agents, *obs]``,
    ``(group, "action")`` (``Discrete`` spaces: int64 ``[N, n_agents]``), ``(group,
    "mask")``, ``("next", group, "reward" | "done" | "terminated" | "truncated")``, and the
    env-level ``"done"`` / ``"terminated"`` / ``"truncated"`` ``[N, 1]``.

    Agents that left (PettingZoo removes them from ``env.agents``) or have not entered yet
    are masked: ``mask`` False, zero observation and reward, ``done`` True, and their action
    is not given to the PettingZoo env. An env row's episode ends when its ``env.agents`` is
    empty (or, with ``done_on_any=True``, as soon as one agent is done); ``truncated`` is
    ``terminated`` when an agent terminated at that step, ``truncated`` otherwise (agents
    still in when ``done_on_any`` ends the row are ``truncated``). The global
    ``state()`` is written as ``"state"`` ``[N, S]`` (``return_state``).

    Rows reset one by one (partial resets with ``"_reset"``); ``set_seed(s)`` (or ``seed=``)
    seeds the next reset of row ``i`` with ``s + i``, later resets continue each env's RNG.

    Args:
        task: ``"package:task"`` (``"mpe2:simple_spread_v3"``; a plain name is looked up in
            ``mpe2``), whose ``parallel_env(**kwargs)`` builds one env; or a callable
            returning a PettingZoo ``ParallelEnv``.
        num_envs: number of envs ``N`` (the batch size).
        return_state: write ``"state"``; ``None`` (default): when the env has ``state()``.
        group_map: ``None`` (one group ``"agents"``), ``"prefix"`` (one group per agent
            name prefix: ``"adversary_0"`` -> ``"adversary"``), or a dict group -> agent
            names.
        done_on_any: end the row's episode as soon as one agent is done.
        seed: seed of the first reset (see above).
        device: device of the tensors written.
        **kwargs: passed to ``parallel_env`` (e.g. ``N=3, max_cycles=25``).

    Examples:
        >>> env = PettingZooEnv("mpe2:simple_spread_v3", num_envs=2, seed=0, max_cycles=5)
        >>> td = env.reset()
        >>> td["agents", "observation"].shape, td["state"].shape
        (torch.Size([2, 3, 18]), torch.Size([2, 54]))
        >>> env.rollout(10)["next", "done"].squeeze(-1).tolist()
        [[False, False, False, False, True], [False, False, False, False, True]]
    """

    def __init__(
        self,
        task: str | Callable[..., Any],
        *,
        num_envs: int = 1,
        return_state: bool | None = None,
        group_map: GroupMap = None,
        done_on_any: bool = False,
        seed: int | None = None,
        device: torch.device | str = "cpu",
        **kwargs: Any,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"PettingZooEnv: expected num_envs >= 1, received {num_envs}.")
        super().__init__(device=device, batch_size=(num_envs,))
        factory = _import_task(task) if isinstance(task, str) else task
        self.task = task if isinstance(task, str) else getattr(task, "__name__", repr(task))
        self.envs = [factory(**kwargs) for _ in range(num_envs)]
        first = self.envs[0]
        if not hasattr(first, "possible_agents") or not callable(getattr(first, "step", None)):
            raise TypeError(
                f"PettingZooEnv: expected a PettingZoo ParallelEnv, received "
                f"{type(first).__name__}. Fix: pass a parallel env factory (e.g. "
                f"module.parallel_env), not the AEC env()."
            )
        self.possible_agents: list[str] = list(first.possible_agents)
        self.group_map = group_agents(
            self.possible_agents, lambda a: _space_key(first, a), group_map, "PettingZooEnv"
        )
        self.done_on_any = done_on_any
        self._seeds: list[int | None] = [None] * num_envs
        self.set_seed(seed)
        if return_state is None:
            return_state = _has_state(first)
        self.return_state = return_state
        state_dim = None
        if return_state:
            state_dim = int(np.prod(first.state_space.shape))
        groups = {}
        for group, names in self.group_map.items():
            agent = names[0]
            obs = space_to_spec(first.observation_space(agent))
            act = space_to_spec(first.action_space(agent))
            groups[group] = (len(names), obs, act)
        specs = multiagent_specs(self.batch_size, groups, state_dim=state_dim, device=self.device)
        self.observation_spec = specs["observation"]
        self.full_action_spec = specs["action"]
        self.full_reward_spec = specs["reward"]
        self.done_spec = specs["done"]
        self._leaf_specs = {g: (s[1], s[2]) for g, s in groups.items()}

    # --- conversions ---------------------------------------------------------------------
    def _group_values(self, rows: list[dict[str, Any]], group: str, key: str) -> torch.Tensor:
        """Stack ``rows[i][key][agent]`` into ``[N, n_agents, ...]`` (zeros where missing)."""
        names = self.group_map[group]
        obs_spec = self._leaf_specs[group][0]
        shape = {"observation": tuple(obs_spec.shape), "reward": (1,)}.get(key, (1,))
        dtype = {"observation": obs_spec.dtype, "reward": torch.float32}.get(key, torch.bool)
        np_dtype = torch.empty((), dtype=dtype).numpy().dtype
        out = np.zeros((len(rows), len(names), *shape), dtype=np_dtype)
        for i, row in enumerate(rows):
            values = row[key]
            for j, name in enumerate(names):
                if name in values:
                    out[i, j] = np.asarray(values[name], dtype=np_dtype).reshape(shape)
        return torch.from_numpy(out).to(self.device)

    def _state(self, env: Any) -> np.ndarray:
        return np.asarray(env.state(), dtype=np.float32).reshape(-1)

    def _output(self, rows: list[dict[str, Any]], step: bool) -> TensorDict:
        out: dict[str, Any] = {}
        b = self.batch_size
        for group, names in self.group_map.items():
            sub = {
                "observation": self._group_values(rows, group, "observation"),
                "mask": self._group_values(rows, group, "mask"),
            }
            if step:
                sub["reward"] = self._group_values(rows, group, "reward")
                for key in AGENT_DONE_KEYS:
                    sub[key] = self._group_values(rows, group, key)
            out[group] = TensorDict(sub, batch_size=(*b, len(names)), device=self.device)
        if self.return_state:
            states = np.stack([row["state"] for row in rows])
            out["state"] = torch.from_numpy(states).to(self.device)
        if step:
            for key in ("done", "terminated", "truncated"):
                flags = np.array([[row["row_" + key]] for row in rows], dtype=bool)
                out[key] = torch.from_numpy(flags).to(self.device)
        return TensorDict(out, batch_size=b, device=self.device)

    # --- hooks ---------------------------------------------------------------------------
    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        mask = get_reset_mask(tensordict, self.batch_size)
        rows = []
        for i, env in enumerate(self.envs):
            if mask is not None and not bool(mask[i]):
                rows.append(self._blank_row(env))  # replaced by the current values
                continue
            seed, self._seeds[i] = self._seeds[i], None
            obs, _ = env.reset(seed=seed)
            alive = set(env.agents)
            rows.append(
                {
                    "observation": obs,
                    "mask": {a: a in alive for a in self.possible_agents},
                    "state": self._state(env) if self.return_state else None,
                }
            )
        out = self._output(rows, step=False)
        for group in self.group_map:  # nobody is done at a reset
            sub = out.get(group)
            for key in AGENT_DONE_KEYS:
                sub.set(key, torch.zeros_like(sub.get("mask")))
        return out

    def _blank_row(self, env: Any) -> dict[str, Any]:
        row: dict[str, Any] = {"observation": {}, "mask": {}}
        if self.return_state:
            row["state"] = np.zeros(self.observation_spec["state"].shape[-1:], np.float32)
        return row

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        actions = {
            group: tensordict.get((group, "action")).cpu().numpy() for group in self.group_map
        }
        rows = [self._step_row(i, env, actions) for i, env in enumerate(self.envs)]
        return self._output(rows, step=True)

    def _step_row(self, i: int, env: Any, actions: dict[str, np.ndarray]) -> dict[str, Any]:
        alive = set(env.agents)
        given: dict[str, Any] = {}
        for group, names in self.group_map.items():
            act_spec = self._leaf_specs[group][1]
            for j, name in enumerate(names):
                if name in alive:  # masked agents are never stepped
                    value = actions[group][i, j]
                    given[name] = int(value) if act_spec.shape == () else value
        if given:
            obs, rew, term, trunc, _ = env.step(given)
        else:  # a finished row that was not reset: nothing acts
            obs, rew, term, trunc = {}, {}, {}, {}
        now = set(env.agents)
        done = {a: bool(term.get(a, False) or trunc.get(a, False)) or a not in now
                for a in self.possible_agents}  # fmt: skip
        row_done = not now or (self.done_on_any and any(done[a] for a in given))
        cut = {a: bool(trunc.get(a, False)) for a in self.possible_agents}
        if row_done:  # the row's episode ends for every agent; the ones still in are cut
            cut = {a: cut[a] or a in now for a in cut}
            done = dict.fromkeys(done, True)
        # the row ends by termination when an agent terminated at this step (done_on_any:
        # the others are cut short), by truncation otherwise
        row_trunc = row_done and not any(bool(term.get(a, False)) for a in given)
        return {
            "observation": obs,
            "mask": {a: a in now and not row_done for a in self.possible_agents},
            "reward": {a: float(v) for a, v in rew.items()},
            "done": done,
            "terminated": {a: done[a] and not cut[a] for a in done},
            "truncated": cut,
            "state": self._state(env) if self.return_state else None,
            "row_done": row_done,
            "row_terminated": row_done and not row_trunc,
            "row_truncated": row_trunc,
        }

    def _set_seed(self, seed: int | None) -> None:
        self._seeds = [None if seed is None else seed + i for i in range(len(self.envs))]

    def _close(self) -> None:
        for env in self.envs:
            env.close()

    def extra_repr(self) -> str:
        groups = {g: len(n) for g, n in self.group_map.items()}
        return f"task={self.task!r}, groups={groups}, {super().extra_repr()}"


def _has_state(env: Any) -> bool:
    space = getattr(env, "state_space", None)
    if space is None:
        return False
    try:
        env.state()
    except NotImplementedError:
        return False
    except Exception:  # some envs need a reset first; the state space says it has one
        return True
    return True


def _space_key(env: Any, agent: str) -> tuple[str, str]:
    return repr(env.observation_space(agent)), repr(env.action_space(agent))
