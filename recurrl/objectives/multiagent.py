"""MAPPO and IPPO: :class:`ClipPPOLoss` and :class:`GAE` on the keys of an agent group.

Multi-agent PPO is single-agent PPO whose every per-step term lives under the agent group
(``[*B, T, n_agents]``): each agent's reward, ``done``/``terminated``, value, advantage and
log-probability, and ``(group, "mask")`` which drops the steps of agents that are not acting
from every loss term and from advantage normalization. The two algorithms differ only in
the critic:

* **MAPPO** (Yu et al. 2022, arXiv:2103.01955): a centralized critic, over the global
  ``"state"`` or over all agents' observations (:class:`~recurrl.modules.MultiAgentMLP`
  with ``centralized=True``), optionally recurrent;
* **IPPO** (de Witt et al. 2020, arXiv:2011.09533): each agent's critic sees only its own
  observation.

The actor is the same in both: any TensorDict module writing ``(group, "logits")``
(``[*B, n_agents, A]``) or ``(group, "loc")``/``(group, "scale")``, typically a recurrent
module with ``n_agents`` followed by a :class:`~recurrl.modules.MultiAgentMLP` head.
:func:`multiagent_ppo_loss` sets the keys (it is ``loss.set_keys(**multiagent_keys(group))``
on both); :func:`multiagent_critic` builds either critic.
"""

from __future__ import annotations

from typing import Any

from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from tensordict.utils import NestedKey
from torch import nn

from recurrl.modules import GRUModule, MultiAgentMLP
from recurrl.modules.mlp import MLP
from recurrl.objectives.ppo import ClipPPOLoss
from recurrl.objectives.value import GAE

__all__ = ["multiagent_critic", "multiagent_keys", "multiagent_ppo_loss"]

_ALGORITHMS = ("mappo", "ippo")


def multiagent_keys(group: str = "agents") -> dict[str, NestedKey]:
    """The ``set_keys`` arguments that put :class:`ClipPPOLoss` and :class:`GAE` on the
    per-agent entries of ``group`` (the names the reference library's MAPPO example uses).

    Examples:
        >>> multiagent_keys()["advantage"], multiagent_keys()["mask"]
        (('agents', 'advantage'), ('agents', 'mask'))
    """
    return {
        "advantage": (group, "advantage"),
        "value_target": (group, "value_target"),
        "value": (group, "state_value"),
        "action": (group, "action"),
        "sample_log_prob": (group, "sample_log_prob"),
        "logits": (group, "logits"),
        "loc": (group, "loc"),
        "scale": (group, "scale"),
        "mask": (group, "mask"),
        "reward": (group, "reward"),
        "done": (group, "done"),
        "terminated": (group, "terminated"),
        "is_init": (group, "is_init"),
    }


def multiagent_ppo_loss(
    actor_network: TensorDictModuleBase,
    critic_network: TensorDictModuleBase,
    *,
    group: str = "agents",
    gamma: float = 0.99,
    lmbda: float = 0.95,
    average_gae: bool = False,
    **loss_kwargs: Any,
) -> tuple[ClipPPOLoss, GAE]:
    """A :class:`ClipPPOLoss` and its :class:`GAE`, both on the keys of ``group``.

    MAPPO or IPPO is the choice of ``critic_network`` (:func:`multiagent_critic`). GAE runs
    per agent: rewards, ``done`` and ``terminated`` ``[*B, T, n_agents, 1]`` (time is dim
    ``-3``), each agent bootstrapping at its own truncation and not at its termination; a
    critic writing one value per env row (``[*B, T, 1]``) gives it to every agent. Steps
    where ``(group, "mask")`` is False (the agent does not act) and the collector's padded
    steps are left out of every loss term and of the advantage normalization.

    Args:
        actor_network: writes ``(group, "logits")`` (or ``loc``/``scale``) ``[*B, n, A]``.
        critic_network: writes ``(group, "state_value")`` ``[*B, n, 1]``
            (:func:`multiagent_critic`).

    Keyword Args:
        group: the agent group. Default: ``"agents"``.
        gamma: discount. Default: 0.99.
        lmbda: GAE lambda. Default: 0.95.
        average_gae: normalize the advantages in :class:`GAE` (over acting agents' steps).
        **loss_kwargs: :class:`ClipPPOLoss` keywords (``clip_epsilon``,
            ``normalize_advantage``, ...).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule as Mod
        >>> from recurrl.modules import MultiAgentMLP
        >>> n = 2
        >>> actor = Mod(MultiAgentMLP(3, 4, n), [("agents", "observation")],
        ...             [("agents", "logits")])
        >>> critic = multiagent_critic(n, "mappo", observation_size=3)
        >>> loss, gae = multiagent_ppo_loss(actor, critic)
        >>> flags = torch.zeros(5, 6, n, 1, dtype=torch.bool)
        >>> agents = {"observation": torch.randn(5, 6, n, 3), "is_init": flags,
        ...           "mask": ~flags, "action": torch.randint(0, 4, (5, 6, n)),
        ...           "sample_log_prob": torch.full((5, 6, n), -1.4)}
        >>> nxt = {"agents": {"observation": torch.randn(5, 6, n, 3),
        ...        "reward": torch.randn(5, 6, n, 1), "done": flags, "terminated": flags}}
        >>> td = TensorDict({"agents": agents, "next": nxt}, [5, 6])
        >>> gae(td)["agents", "advantage"].shape
        torch.Size([5, 6, 2, 1])
        >>> out = loss(td)
        >>> (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
    """
    keys = multiagent_keys(group)
    loss = ClipPPOLoss(actor_network, critic_network, **loss_kwargs)
    value_only = ("reward", "done", "terminated", "is_init")
    loss.set_keys(**{k: v for k, v in keys.items() if k not in value_only})
    gae = GAE(gamma, lmbda, critic_network, average_gae=average_gae)
    actor_only = ("action", "sample_log_prob", "logits", "loc", "scale")
    gae.set_keys(**{k: v for k, v in keys.items() if k not in actor_only})
    return loss, gae


def multiagent_critic(
    n_agents: int,
    algorithm: str,
    *,
    observation_size: int | None = None,
    state_size: int | None = None,
    recurrent: bool = False,
    hidden_size: int = 64,
    share_params: bool = True,
    group: str = "agents",
    observation_key: str = "observation",
    state_key: NestedKey = "state",
) -> TensorDictModuleBase:
    """A critic writing ``(group, "state_value")`` ``[*B, n_agents, 1]``.

    * ``"mappo"`` with ``state_size``: an MLP over the global ``state_key`` ``[*B, S]``
      with one value head per agent; ``recurrent=True`` puts a :class:`GRUModule` over the
      state first (env-level, state key ``"critic_state"``, reset at the env's ``is_init``).
    * ``"mappo"`` without it: a :class:`MultiAgentMLP` with ``centralized=True`` over all
      agents' observations; ``recurrent=True`` gives each agent a GRU memory of its own
      observations first (``(group, "critic_state")``) and centralizes their outputs.
    * ``"ippo"``: each agent's value reads only its own observation (through its own GRU
      memory with ``recurrent=True``).

    A recurrent critic's memory (``critic[0]``) must run while collecting, so that its
    state is carried and stored with the data as the actor's is: collect with
    ``TensorDictSequential(actor, critic[0])`` (the collector then adds its primer too).

    Args:
        n_agents: agents in the group.
        algorithm: ``"mappo"`` or ``"ippo"``.

    Keyword Args:
        observation_size: features of one agent's observation (required unless a MAPPO
            critic reads the state).
        state_size: features of the global state (MAPPO over the state).
        recurrent: a GRU memory before the value head. Default: False.
        hidden_size: width of the hidden layers and of the memory. Default: 64.
        share_params: one set of weights for every agent's memory and head. Default: True.
        group: the agent group. Default: ``"agents"``.
        observation_key: the observation's name in the group. Default: ``"observation"``.
        state_key: the global state's key. Default: ``"state"``.

    Examples:
        >>> critic = multiagent_critic(3, "mappo", state_size=10, recurrent=True)
        >>> critic.in_keys
        ['state', 'critic_state', 'is_init']
        >>> multiagent_critic(3, "ippo", observation_size=4).out_keys
        [('agents', 'state_value')]
    """
    if algorithm not in _ALGORITHMS:
        raise ValueError(
            f"multiagent_critic: algorithm must be one of {_ALGORITHMS}, received {algorithm!r}."
        )
    value = (group, "state_value")
    if algorithm == "mappo" and state_size is not None:
        head = nn.Sequential(
            MLP(hidden_size if recurrent else state_size, n_agents, num_cells=[hidden_size]),
            nn.Unflatten(-1, (n_agents, 1)),
        )
        if not recurrent:
            return TensorDictModule(head, [state_key], [value])
        memory = GRUModule(state_size, hidden_size, in_keys=[state_key, "critic_state"],
                           out_key="critic_features")  # fmt: skip
        return TensorDictSequential(memory, TensorDictModule(head, ["critic_features"], [value]))
    if observation_size is None:
        alternative = ", or state_size (a MAPPO critic over the state)" * (algorithm == "mappo")
        raise ValueError(
            f"multiagent_critic({algorithm!r}): observation_size is required (the features of "
            f"one agent's observation){alternative}."
        )
    obs = (group, observation_key)
    centralized = algorithm == "mappo"
    if not recurrent:
        mlp = MultiAgentMLP(
            observation_size, 1, n_agents, centralized=centralized, share_params=share_params,
            num_cells=[hidden_size, hidden_size],
        )  # fmt: skip
        return TensorDictModule(mlp, [obs], [value])
    features = (group, "critic_features")
    memory = GRUModule(observation_size, hidden_size, in_keys=[obs, (group, "critic_state")],
                       out_key=features, n_agents=n_agents, share_params=share_params)  # fmt: skip
    head = MultiAgentMLP(hidden_size, 1, n_agents, centralized=centralized,
                         share_params=share_params, num_cells=[hidden_size])  # fmt: skip
    return TensorDictSequential(memory, TensorDictModule(head, [features], [value]))
