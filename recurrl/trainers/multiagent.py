"""Multi-agent PPO in ``recurrl train``: MAPPO and IPPO on PettingZoo and VMAS tasks.

``recurrl train --env mpe2:simple_spread_v3`` (or ``--env vmas:balance``, any id of
:data:`~recurrl.envs.multiagent.MULTIAGENT_MODULES`) trains the agents of the env's group
``"agents"`` with PPO on their own rewards, dones and masks
(:func:`~recurrl.objectives.multiagent_ppo_loss`):

* the **actor** is shared by the agents (parameter sharing): the memory of ``--memory``
  built with ``n_agents`` (each agent its own hidden state ``[*B, n_agents, L, H]``, reset
  at its own ``("agents", "is_init")``), or an MLP with ``--memory none``, then a
  categorical head per agent;
* the **critic** is ``--multiagent mappo`` (default): centralized, over the env's global
  ``"state"`` when it has one (PettingZoo's ``state()``, VMAS's concatenated observations),
  else over all agents' observations; or ``--multiagent ippo``: each agent's value from its
  own observation. With a memory the critic has one too (a GRU), carried while collecting.

The env gets :class:`~recurrl.envs.InitTracker` (env-level and per-agent ``is_init``),
:class:`~recurrl.envs.TeamReward` (the mean of the agents' rewards as the env-level reward)
and :class:`~recurrl.envs.RewardSum`: the returns ``recurrl train`` logs and ``recurrl
eval`` reports are the team's (the mean over agents of their returns). Actions are
discrete (a categorical per agent; VMAS and MPE tasks are built with
``continuous_actions=False`` unless ``--continuous-actions``) or bounded vectors (a
tanh-squashed Gaussian per agent, rescaled to the bounds:
:func:`~recurrl.trainers.models.squashed_gaussian`).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.envs import (
    Compose,
    FlickerObservation,
    InitTracker,
    MaskObservation,
    RewardSum,
    TeamReward,
    TransformedEnv,
    specs,
)
from recurrl.envs.multiagent import is_multiagent_env_id, make_multiagent_env
from recurrl.modules import MEMORY_REGISTRY, MLP
from recurrl.modules.registry import FEED_FORWARD
from recurrl.objectives import multiagent_critic
from recurrl.trainers.config import EnvConfig, ModelConfig, TrainConfig
from recurrl.trainers.errors import UsageError
from recurrl.trainers.models import (
    BoundedActions,
    CategoricalSampler,
    TanhNormalSampler,
    gaussian_head,
)

__all__ = [
    "GROUP",
    "MULTIAGENT_TASKS",
    "MultiAgentActorCritic",
    "is_multiagent",
    "make_multiagent_train_env",
    "multiagent_actor_critic",
]

#: the agent group ``recurrl train`` trains
GROUP = "agents"


def _recall(num_envs: int, seed: int | None, device: torch.device | str | None) -> Any:
    from recurrl.envs.multiagent_recall import MultiAgentRecallEnv

    env = MultiAgentRecallEnv(
        batch_size=[num_envs], n_agents=3, num_cues=4, lengths=(8, 6, 4),
        device="cpu" if device is None else device,
    )  # fmt: skip
    if seed is not None:
        env.set_seed(seed)
    return env


#: recurrl's own multi-agent tasks (batched torch envs), by id: builders ``(num_envs, seed,
#: device) -> env``. ``MultiAgentRecall-v0``: 3 agents each see one of 4 cues at their own
#: first step and are scored for naming it 8, 6 and 4 steps later
#: (:class:`~recurrl.testing.MultiAgentRecallEnv`): a memory scores a team return of 1.0,
#: no memory 0.25 in expectation.
MULTIAGENT_TASKS: dict[str, Any] = {"MultiAgentRecall-v0": _recall}


def is_multiagent(cfg: EnvConfig) -> bool:
    """Whether ``cfg.env`` names a multi-agent task (``vmas:...``, ``mpe2:...``, an id of
    :data:`MULTIAGENT_TASKS`).

    Examples:
        >>> is_multiagent(EnvConfig()), is_multiagent(EnvConfig(env="vmas:balance"))
        (False, True)
    """
    return cfg.env in MULTIAGENT_TASKS or is_multiagent_env_id(cfg.env)


#: added to a run's env seed to seed its FlickerObservation (any constant: the draws need
#: only be repeatable and not the env's own stream)
_FLICKER_SEED_OFFSET = 7919


def make_multiagent_train_env(
    cfg: EnvConfig,
    num_envs: int,
    *,
    seed: int | None = None,
    device: torch.device | str | None = None,
) -> TransformedEnv:
    """``num_envs`` env rows of the multi-agent task ``cfg.env`` (an id of
    :data:`MULTIAGENT_TASKS`, or of :func:`~recurrl.envs.multiagent.make_multiagent_env`) with
    ``InitTracker``,
    ``TeamReward`` and ``RewardSum`` (``("next", "episode_reward")``: the team's return).

    Raises:
        UsageError: the task's agents are not one group ``"agents"``, or their actions are
            neither discrete nor bounded float vectors.

    Examples:
        >>> env = make_multiagent_train_env(EnvConfig(env="vmas:balance"), 2, seed=0)
        >>> td = env.reset()
        >>> td["agents", "observation"].shape[:2], td["agents", "is_init"].shape
        (torch.Size([2, 3]), torch.Size([2, 3, 1]))
    """
    kwargs: dict[str, Any] = {}
    if cfg.continuous_actions or cfg.env.startswith("vmas:"):  # VMAS's own default: True
        kwargs["continuous_actions"] = cfg.continuous_actions
    if cfg.env in MULTIAGENT_TASKS:  # (EnvConfig refuses max_episode_steps for them)
        base = MULTIAGENT_TASKS[cfg.env](num_envs, seed, device)
    else:
        try:
            base = make_multiagent_env(
                cfg.env, num_envs, device=device, seed=seed,
                max_episode_steps=cfg.max_episode_steps, **kwargs,
            )  # fmt: skip
        except (ImportError, ValueError) as err:
            raise UsageError(f"recurrl train --env {cfg.env}: {err}") from err
    groups = [
        key for key, spec in base.full_action_spec.items() if isinstance(spec, specs.Composite)
    ]
    if groups != [GROUP]:
        raise UsageError(
            f"recurrl train --env {cfg.env}: expected the agents in one group {GROUP!r} (agents "
            f"with the same observation and action specs), found the groups {groups}. Fix: "
            f"train a task whose agents are alike, or build the env with "
            f"recurrl.envs.make_multiagent_env and a loss per group (docs/guides/multiagent.md)."
        )
    action = base.full_action_spec[GROUP, "action"]
    continuous = isinstance(action, specs.Bounded) and action.dtype.is_floating_point
    if not (isinstance(action, specs.Categorical) or continuous):
        raise UsageError(
            f"recurrl train --env {cfg.env}: the agents' actions must be discrete (Categorical) "
            f"or bounded vectors (Bounded float), received {type(action).__name__} "
            f"({action.dtype}). Fix: a task with such actions."
        )
    transforms = [InitTracker(), TeamReward(GROUP), RewardSum()]
    keep = cfg.kept_entries()
    if keep is not None:
        size = base.full_observation_spec[GROUP, "observation"].shape[-1]
        if max(keep) >= size:
            raise UsageError(
                f"recurrl train --env {cfg.env} --observation-keep {cfg.observation_keep}: "
                f"each agent's observation has {size} entries (0-{size - 1}); entry "
                f"{max(keep)} does not exist. Fix: indices below {size}."
            )
        transforms.insert(0, MaskObservation(keep, in_key=(GROUP, "observation")))
    if cfg.observation_flicker:  # its own stream, apart from the env's (seeded with `seed`)
        flicker_seed = None if seed is None else seed + _FLICKER_SEED_OFFSET
        flicker = FlickerObservation(
            cfg.observation_flicker, in_key=(GROUP, "observation"), seed=flicker_seed
        )
        transforms.insert(1 if keep is not None else 0, flicker)
    return TransformedEnv(base, Compose(*transforms))


class MultiAgentActorCritic(BoundedActions, nn.Module):
    """A shared actor and a MAPPO or IPPO critic for the agents of one group.

    Args:
        cfg: the model section (``memory``, ``hidden_size``, ``num_layers``,
            ``recurrent_backend``).
        n_agents: agents in the group.
        obs_dim: features of one agent's observation ``(group, "observation")``
            ``[*B, n_agents, F]``.
        n_actions: discrete actions of one agent, or the entries ``A`` of its action
            vector (with ``action_bounds``).

    Keyword Args:
        critic: ``"mappo"`` (centralized) or ``"ippo"`` (per agent). Default ``"mappo"``.
        state_size: features of the env's global ``"state"`` ``[*B, S]`` (a MAPPO critic then
            reads it), or ``None`` (a MAPPO critic reads all agents' observations).
        group: the agent group. Default ``"agents"``.
        action_bounds: ``(low, high)``, each ``[A]`` and finite (the same for every agent),
            for continuous actions: the actor then writes a Gaussian's ``(group, "loc")`` and
            ``(group, "scale")`` ``[*B, n_agents, A]`` (the std one learned parameter per entry,
            or per state with ``cfg.action_std="state"``) and the policy samples the
            tanh-squashed, rescaled action (:func:`~recurrl.trainers.models.squashed_gaussian`).
            ``None``: discrete actions.

    Attributes:
        actor: writes ``(group, "logits")`` ``[*B, n_agents, n_actions]`` (or ``loc`` and
            ``scale``).
        critic: writes ``(group, "state_value")`` ``[*B, n_agents, 1]``.
        continuous: whether the actions are continuous (``action_bounds`` given).
        obs_norm: always ``None`` (the single-agent recipe's observation normalization is
            not offered here).

    Examples:
        >>> from tensordict import TensorDict
        >>> model = MultiAgentActorCritic(ModelConfig(memory="gru", hidden_size=8), 3, 5, 4)
        >>> agents = TensorDict({"observation": torch.randn(2, 3, 5),
        ...                      "is_init": torch.ones(2, 3, 1, dtype=torch.bool)}, [2, 3])
        >>> td = model.policy()(TensorDict({"agents": agents, "is_init": agents["is_init"][:, 0]},
        ...                                [2]))
        >>> td["agents", "action"].shape, td["agents", "sample_log_prob"].shape
        (torch.Size([2, 3]), torch.Size([2, 3]))
    """

    def __init__(
        self,
        cfg: ModelConfig,
        n_agents: int,
        obs_dim: int,
        n_actions: int,
        *,
        critic: str = "mappo",
        state_size: int | None = None,
        group: str = GROUP,
        action_bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.group = group
        self.obs_norm = None
        self._set_action_bounds(action_bounds, n_actions)
        self.action_nvec = None
        width = cfg.hidden_size
        obs, features = (group, "observation"), (group, "actor_features")
        if cfg.memory == FEED_FORWARD:
            mlp = MLP(obs_dim, width, num_cells=width, depth=cfg.num_layers,
                      activate_last_layer=True)  # fmt: skip
            trunk: nn.Module = Mod(mlp, [obs], [features])
        else:
            module = MEMORY_REGISTRY[cfg.memory].module
            try:
                trunk = module(
                    obs_dim, width, num_layers=cfg.num_layers,
                    recurrent_backend=cfg.recurrent_backend, in_key=obs, out_key=features,
                    n_agents=n_agents,
                )  # fmt: skip
            except TypeError as err:
                raise UsageError(
                    f"recurrl train: the memory {cfg.memory!r} ({module.__name__}) has no agent "
                    f"dimension (n_agents=...): {err}. Fix: --memory lstm, gru, mingru or lru "
                    f"with a multi-agent env, or --memory none."
                ) from err
        if self.continuous:
            gaussian = gaussian_head(width, n_actions, cfg.action_std)
            head = Mod(gaussian, [features], [(group, "loc"), (group, "scale")])
        else:
            head = Mod(MLP(width, n_actions, num_cells=width), [features], [(group, "logits")])
        self.actor = Seq(trunk, head)
        self.recurrent = cfg.memory != FEED_FORWARD
        self.critic = multiagent_critic(
            n_agents, critic, observation_size=obs_dim,
            state_size=state_size if critic == "mappo" else None, recurrent=self.recurrent,
            hidden_size=width, group=group,
        )  # fmt: skip

    def policy(self, deterministic: bool = False) -> Seq:
        """The acting module: the actor, the critic's memory (when it has one and the policy
        samples, so its state is stored with the batch for the loss), and a sampler writing
        ``(group, "action")`` ``[*B, n_agents]`` (continuous: ``[*B, n_agents, A]``) and
        ``(group, "sample_log_prob")`` ``[*B, n_agents]`` (``deterministic``: the most likely
        action; continuous: the squashed, rescaled mean)."""
        g = self.group
        outs = [(g, "action"), (g, "sample_log_prob")]
        if self.continuous:
            tanh = TanhNormalSampler(self.action_low, self.action_high, deterministic)
            sampler = Mod(tanh, [(g, "loc"), (g, "scale")], outs)
        else:
            sampler = Mod(CategoricalSampler(deterministic), [(g, "logits")], outs)
        if self.recurrent and not deterministic:
            return Seq(self.actor, self.critic[0], sampler)
        return Seq(self.actor, sampler)


def multiagent_actor_critic(cfg: TrainConfig, env) -> MultiAgentActorCritic:
    """The :class:`MultiAgentActorCritic` of ``cfg`` for ``env`` (from
    :func:`make_multiagent_train_env`): its agents, observation and action sizes, and the
    global state's size when the env has one."""
    observation = env.observation_spec[GROUP, "observation"]
    n_agents, obs_dim = observation.shape[-2], observation.shape[-1]
    if observation.ndim - len(env.batch_size) != 2:
        raise UsageError(
            f"recurrl train --env {cfg.env.env}: the agents' observations must be vectors "
            f"([*B, n_agents, F]), received shape {list(observation.shape)}."
        )
    state = env.observation_spec.get("state", None)
    state_size = None if state is None else int(state.shape[-1])
    action = env.full_action_spec[GROUP, "action"]
    bounds = None
    if isinstance(action, specs.Categorical):
        n_actions = int(action.n)
    else:  # bounded vectors ([*B, n_agents, A]): one (low, high) for every agent and row
        n_actions = int(action.shape[-1])
        low, high = (b.reshape(-1, n_actions) for b in (action.low, action.high))
        if not ((low == low[0]).all() and (high == high[0]).all()):
            raise UsageError(
                f"recurrl train --env {cfg.env.env}: the agents' action bounds differ between "
                f"agents (low {low.unique(dim=0).tolist()}, high {high.unique(dim=0).tolist()}); "
                f"the shared actor needs one. Fix: a task whose agents are alike."
            )
        bounds = (low[0], high[0])
    return MultiAgentActorCritic(
        cfg.model, int(n_agents), int(obs_dim), n_actions, critic=cfg.ppo.multiagent,
        state_size=state_size, action_bounds=bounds,
    )  # fmt: skip
