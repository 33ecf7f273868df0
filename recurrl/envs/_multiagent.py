"""Specs and helpers of the multi-agent key convention, shared by the multi-agent envs.

The convention (see ``docs/guides/multiagent.md``): an env of batch ``[*B]`` holds the
agents of one group under a group key (default ``"agents"``), a sub-TensorDict of batch
``[*B, n_agents]``:

- ``(group, "observation")`` ``[*B, n_agents, *obs_shape]``, ``(group, "mask")``
  ``[*B, n_agents, 1]`` bool (the agent acts at this step), observation keys;
- ``(group, "action")`` ``[*B, n_agents, *act_shape]`` (discrete: int64 ``[*B, n_agents]``);
- ``("next", group, "reward")`` ``[*B, n_agents, 1]``;
- ``("next", group, "done" | "terminated" | "truncated")`` ``[*B, n_agents, 1]`` bool, next to
  the env-level ``"done"`` / ``"terminated"`` / ``"truncated"`` ``[*B, 1]``;
- ``"state"`` ``[*B, S]``: the global state, where the env has one.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence

import torch

from recurrl.envs.specs import Categorical, Composite, TensorSpec, Unbounded

__all__ = [
    "AGENT_DONE_KEYS",
    "DEFAULT_GROUP",
    "agent_groups",
    "group_agents",
    "multiagent_specs",
]

DEFAULT_GROUP = "agents"
AGENT_DONE_KEYS = ("done", "terminated", "truncated")


def multiagent_specs(
    batch_size: Sequence[int],
    groups: dict[str, tuple[int, TensorSpec, TensorSpec]],
    *,
    state_dim: int | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, Composite]:
    """The specs of a multi-agent env, following the key convention.

    Args:
        batch_size: env batch shape ``B``.
        groups: group name -> ``(n_agents, observation spec, action spec)``, the leaf
            specs of ONE agent without batch dims (``[*obs_shape]``, ``[*act_shape]``);
            they are expanded to ``[*B, n_agents, ...]``.
        state_dim: size ``S`` of the env-level ``"state"`` ``[*B, S]`` (``None``: none).
        device: device of every spec.

    Returns:
        ``{"observation", "action", "reward", "done"}`` -> Composite of shape ``B``, for the
        env's ``observation_spec``, ``full_action_spec``, ``full_reward_spec`` and
        ``done_spec``.

    Examples:
        >>> specs = multiagent_specs((4,), {"agents": (3, Unbounded(5), Categorical(2))})
        >>> specs["observation"]["agents", "observation"].shape
        torch.Size([4, 3, 5])
        >>> specs["action"]["agents", "action"].shape
        torch.Size([4, 3])
        >>> sorted(map(str, specs["done"].keys(include_nested=True, leaves_only=True)))[:3]
        ["('agents', 'done')", "('agents', 'terminated')", "('agents', 'truncated')"]
    """
    b = torch.Size(batch_size)
    flag = Categorical(2, shape=(*b, 1), dtype=torch.bool)
    obs = Composite(shape=b)
    act = Composite(shape=b)
    rew = Composite(shape=b)
    done = Composite({k: flag.clone() for k in AGENT_DONE_KEYS}, shape=b)
    for group, (n, obs_leaf, act_leaf) in groups.items():
        if not isinstance(group, str) or group in (*AGENT_DONE_KEYS, "state", "next"):
            raise ValueError(
                f"multiagent_specs: expected a group name other than done keys, 'state' and "
                f"'next', received {group!r}."
            )
        if n < 1:
            raise ValueError(f"multiagent_specs: group {group!r} needs n_agents >= 1, got {n}.")
        gb = (*b, n)
        agent_flag = Categorical(2, shape=(*gb, 1), dtype=torch.bool)
        obs[group] = Composite(
            observation=obs_leaf.expand(*gb, *obs_leaf.shape),
            mask=agent_flag.clone(),
            shape=gb,
        )
        act[group] = Composite(action=act_leaf.expand(*gb, *act_leaf.shape), shape=gb)
        rew[group] = Composite(reward=Unbounded((*gb, 1)), shape=gb)
        done[group] = Composite({k: agent_flag.clone() for k in AGENT_DONE_KEYS}, shape=gb)
    if state_dim is not None:
        obs["state"] = Unbounded((*b, state_dim))
    return {
        name: spec.to(device)
        for name, spec in {"observation": obs, "action": act, "reward": rew, "done": done}.items()
    }


def agent_groups(observation_spec: Composite, batch_ndim: int) -> dict[str, int]:
    """Group name -> number of agents, for the groups of an env's observation spec.

    A group is a sub-Composite with one more batch dim than the env that holds a
    ``"mask"`` entry (the convention's marker of an agent group).

    Examples:
        >>> specs = multiagent_specs((2,), {"agents": (3, Unbounded(5), Categorical(2))})
        >>> agent_groups(specs["observation"], 1)
        {'agents': 3}
    """
    out: dict[str, int] = {}
    for key in observation_spec:
        sub = observation_spec[key]
        if isinstance(sub, Composite) and len(sub.shape) == batch_ndim + 1 and "mask" in sub:
            out[key] = sub.shape[-1]
    return out


GroupMap = str | Mapping[str, Sequence[str]] | None


def group_agents(
    agents: Sequence[str], space_of: Callable[[str], Hashable], group_map: GroupMap, owner: str
) -> dict[str, list[str]]:
    """Group name -> agent names, every group's agents sharing one space description.

    Args:
        agents: the env's agent names, in order.
        space_of: agent name -> a hashable description of its observation and action
            spaces (agents of one group must share it: they share one tensor).
        group_map: ``None`` (all agents in ``"agents"``), ``"prefix"`` (one group per name
            prefix before the last ``"_"``: ``"adversary_0"`` -> ``"adversary"``) or a dict
            group -> agent names listing every agent once.
        owner: the class named in errors.

    Examples:
        >>> group_agents(["a_0", "a_1", "b_0"], lambda a: a[0], "prefix", "Env")
        {'a': ['a_0', 'a_1'], 'b': ['b_0']}
    """
    agents = list(agents)
    if group_map is None:
        groups = {DEFAULT_GROUP: agents}
    elif group_map == "prefix":
        groups = {}
        for agent in agents:
            groups.setdefault(agent.rpartition("_")[0] or agent, []).append(agent)
    elif isinstance(group_map, Mapping):
        groups = {str(g): list(names) for g, names in group_map.items()}
        listed = [a for names in groups.values() for a in names]
        if sorted(listed) != sorted(agents):
            raise ValueError(
                f"{owner}: group_map must list every agent exactly once; the env's agents are "
                f"{agents}, received {groups}."
            )
    else:
        raise ValueError(
            f"{owner}: expected group_map None, 'prefix' or a dict group -> agent names, "
            f"received {group_map!r}."
        )
    for group, names in groups.items():
        if len({space_of(a) for a in names}) > 1:
            raise ValueError(
                f"{owner}: the agents of group {group!r} ({names}) have different observation "
                f"or action spaces, so they cannot share one [*B, n_agents, ...] tensor. Fix: "
                f"group_map='prefix' (one group per agent name prefix) or a dict group -> "
                f"agent names whose spaces match."
            )
    return groups
