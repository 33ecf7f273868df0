"""VmasEnv: a VMAS scenario (vectorized, torch-native) as one recurrl env with agent groups."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from recurrl.envs._multiagent import AGENT_DONE_KEYS, GroupMap, group_agents, multiagent_specs
from recurrl.envs.common import EnvBase
from recurrl.envs.specs import Bounded, Categorical, TensorSpec, Unbounded
from recurrl.envs.utils import count_true, get_reset_mask

__all__ = ["VmasEnv"]

_INSTALL = "pip install 'recurrl[vmas]' (vmas)"


def _import_vmas() -> Any:
    try:
        import vmas
    except ImportError as err:
        raise ImportError(f"VmasEnv needs the vmas package ({err}). Fix: {_INSTALL}.") from err
    return vmas


def _space_to_spec(space: Any, owner: str) -> TensorSpec:
    """One agent's VMAS space (``gym.spaces`` Box or Discrete) -> a spec without batch dims."""
    kind = type(space).__name__
    if kind == "Box":
        low = torch.as_tensor(space.low, dtype=torch.float32)
        high = torch.as_tensor(space.high, dtype=torch.float32)
        if not (torch.isfinite(low).any() or torch.isfinite(high).any()):
            return Unbounded(tuple(space.shape))
        return Bounded(low, high, shape=tuple(space.shape))
    if kind == "Discrete":
        return Categorical(int(space.n))
    raise NotImplementedError(
        f"{owner}: VMAS space {kind} is not supported (Box and Discrete are). Fix: build the "
        f"scenario without dict_spaces / multidiscrete_actions."
    )


class VmasEnv(EnvBase):
    """A VMAS scenario with ``num_envs`` vectorized envs, as one env of batch ``[num_envs]``.

    VMAS simulates all envs in a few torch ops (CPU or CUDA); this env converts its per-agent
    lists into the multi-agent key convention (``docs/guides/multiagent.md``):
    ``(group, "observation")`` ``[N, n_agents, F]``, ``(group, "action")`` (continuous:
    ``[N, n_agents, A]`` within the scenario's bounds; discrete: int64 ``[N, n_agents]``),
    ``(group, "mask")`` (always True: VMAS agents stay for the whole episode),
    ``("next", group, "reward")`` ``[N, n_agents, 1]``, per-agent done keys (the env row's,
    for every agent) and ``"state"`` ``[N, n_agents * F]``: every agent's observation,
    concatenated (VMAS has no separate global state). ``terminated`` comes from the
    scenario, ``truncated`` from ``max_steps``; finished rows are reset one by one with
    VMAS's ``reset_at``.

    Args:
        scenario: a VMAS scenario name (``"balance"``, ``"navigation"``, ...) or object.
        num_envs: number of vectorized envs ``N``.
        continuous_actions: continuous (default) or discrete actions.
        max_steps: episode horizon (sets ``truncated``); ``None``: the scenario's own end.
        group_map: ``None`` (all agents under ``"agents"``), ``"prefix"`` or a dict group ->
            agent names (agents of one group must share their spaces).
        seed: VMAS's seed. VMAS keeps one random state for all its envs in a process
            (not torch's global one): to reproduce a reset, ``set_seed`` right before it.
        device: where VMAS simulates and the tensors live.
        **kwargs: scenario arguments, passed to ``vmas.make_env`` (e.g. ``n_agents=4``).

    Examples:
        >>> env = VmasEnv("balance", num_envs=8, max_steps=5, seed=0)
        >>> td = env.reset()
        >>> td["agents", "observation"].shape, td["state"].shape
        (torch.Size([8, 3, 16]), torch.Size([8, 48]))
        >>> data = env.rollout(5)
        >>> data["agents", "action"].shape, data["next", "truncated"][:, -1].all().item()
        (torch.Size([8, 5, 3, 2]), True)
    """

    def __init__(
        self,
        scenario: str | Any,
        *,
        num_envs: int = 1,
        continuous_actions: bool = True,
        max_steps: int | None = None,
        group_map: GroupMap = None,
        seed: int | None = None,
        device: torch.device | str = "cpu",
        **kwargs: Any,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"VmasEnv: expected num_envs >= 1, received {num_envs}.")
        super().__init__(device=device, batch_size=(num_envs,))
        vmas = _import_vmas()
        self.scenario = scenario if isinstance(scenario, str) else type(scenario).__name__
        self.continuous_actions = continuous_actions
        self._env = vmas.make_env(
            scenario,
            num_envs=num_envs,
            device=self.device,
            continuous_actions=continuous_actions,
            max_steps=max_steps,
            seed=seed,
            terminated_truncated=True,
            **kwargs,
        )
        names = [agent.name for agent in self._env.agents]
        obs_spaces = dict(zip(names, self._env.observation_space, strict=True))
        act_spaces = dict(zip(names, self._env.action_space, strict=True))
        self.group_map = group_agents(
            names, lambda a: (repr(obs_spaces[a]), repr(act_spaces[a])), group_map, "VmasEnv"
        )
        self._index = {name: i for i, name in enumerate(names)}
        groups = {}
        state_dim = 0
        for group, members in self.group_map.items():
            obs = _space_to_spec(obs_spaces[members[0]], "VmasEnv")
            act = _space_to_spec(act_spaces[members[0]], "VmasEnv")
            if len(obs.shape) != 1:
                raise NotImplementedError(
                    f"VmasEnv: expected flat observations [F], received shape "
                    f"{tuple(obs.shape)} for group {group!r}."
                )
            groups[group] = (len(members), obs, act)
            state_dim += len(members) * obs.shape[0]
        specs = multiagent_specs(self.batch_size, groups, state_dim=state_dim, device=self.device)
        self.observation_spec = specs["observation"]
        self.full_action_spec = specs["action"]
        self.full_reward_spec = specs["reward"]
        self.done_spec = specs["done"]

    @property
    def vmas_env(self) -> Any:
        """The wrapped ``vmas`` Environment."""
        return self._env

    def _output(self, obs: list[torch.Tensor], done: torch.Tensor | None = None) -> TensorDict:
        b = self.batch_size
        out: dict[str, Any] = {}
        parts = []
        for group, members in self.group_map.items():
            stacked = torch.stack([obs[self._index[a]] for a in members], dim=1).to(self.device)
            parts.append(stacked.flatten(1))
            n = len(members)
            flags = torch.zeros((*b, n, 1), dtype=torch.bool, device=self.device)
            if done is not None:
                flags = flags | done.reshape(*b, 1, 1)
            sub = {"observation": stacked, "mask": torch.ones_like(flags)}
            sub.update({key: flags.clone() for key in AGENT_DONE_KEYS})
            out[group] = TensorDict(sub, batch_size=(*b, n), device=self.device)
        out["state"] = torch.cat(parts, dim=-1)
        return TensorDict(out, batch_size=b, device=self.device)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        mask = get_reset_mask(tensordict, self.batch_size)
        if mask is None or count_true(mask) == mask.numel():
            obs = self._env.reset()
        else:
            rows = mask.nonzero().flatten().tolist()
            for i in rows[:-1]:
                self._env.reset_at(i, return_observations=False)
            obs = self._env.reset_at(rows[-1]) if rows else self._observations()
        return self._output(list(obs))

    def _observations(self) -> list[torch.Tensor]:
        return [self._env.scenario.observation(agent) for agent in self._env.agents]

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        actions: list[torch.Tensor | None] = [None] * len(self._index)
        for group, members in self.group_map.items():
            action = tensordict.get((group, "action"))
            for j, name in enumerate(members):
                actions[self._index[name]] = action[:, j]
        obs, rewards, terminated, truncated, _ = self._env.step(actions)
        terminated = terminated.reshape(*self.batch_size, 1).to(self.device)
        truncated = truncated.reshape(*self.batch_size, 1).to(self.device)
        truncated = truncated & ~terminated  # an ended episode is terminated first
        done = terminated | truncated
        out = self._output(list(obs), done)
        for group, members in self.group_map.items():
            reward = torch.stack([rewards[self._index[a]] for a in members], dim=1)
            sub = out.get(group)
            sub.set("reward", reward.unsqueeze(-1).to(self.device, torch.float32))
            n = len(members)
            sub.set("terminated", terminated.unsqueeze(-1).expand(-1, n, 1).clone())
            sub.set("truncated", truncated.unsqueeze(-1).expand(-1, n, 1).clone())
        out.update({"done": done, "terminated": terminated, "truncated": truncated})
        return out

    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            self._env.seed(seed)

    def extra_repr(self) -> str:
        groups = {g: len(n) for g, n in self.group_map.items()}
        return f"scenario={self.scenario!r}, groups={groups}, {super().extra_repr()}"
