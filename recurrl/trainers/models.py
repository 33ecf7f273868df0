"""Envs and actor/critic networks of the recipes, built from the config dataclasses."""

from __future__ import annotations

import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn
from torch.distributions import Categorical

from recurrl.envs import (
    Compose,
    GymEnv,
    InitTracker,
    MaskObservation,
    OneHotObservation,
    RewardSum,
    StepCounter,
    TransformedEnv,
    specs,
)
from recurrl.modules import MLP, GRUModule, LSTMModule
from recurrl.trainers.config import EnvConfig, ModelConfig
from recurrl.trainers.errors import UsageError

__all__ = ["ActorCritic", "CategoricalSampler", "make_env"]

OBS_KEY = "observation"


def make_env(cfg: EnvConfig, *, num_envs: int | None = None, seed: int | None = None):
    """``GymEnv(num_envs=N)`` with the built-in mask (if any), ``InitTracker``, ``StepCounter``
    and ``RewardSum`` (``("next", "episode_reward")`` is the running return).

    A discrete observation (gymnasium ``Discrete`` / ``MultiDiscrete``, e.g. the cards of
    popgym's RepeatPrevious) is one-hot encoded first (:class:`OneHotObservation`), so the
    networks always read a flat float vector. The recurrent policies' primers are appended
    by the collector.
    """
    kwargs = {} if cfg.max_episode_steps is None else {"max_episode_steps": cfg.max_episode_steps}
    n = cfg.num_envs if num_envs is None else num_envs
    base = GymEnv(cfg.gym_id(), num_envs=n, seed=seed, **kwargs)
    obs = base.observation_spec.get(OBS_KEY, None)
    mask = cfg.mask()
    transforms = [MaskObservation(mask)] if mask is not None else []
    discrete = isinstance(obs, specs.Categorical) and obs.ndim == 1
    if discrete or (isinstance(obs, specs.MultiCategorical) and obs.ndim == 2):
        transforms.append(OneHotObservation())
    elif obs is None or obs.ndim != 2 or not obs.dtype.is_floating_point:
        base.close()
        raise UsageError(  # the env the user chose: reported as one line, not a traceback
            f"recurrl train: expected a flat float vector observation ([num_envs, F]) or a "
            f"discrete one, {cfg.env!r} gives {obs}. Fix: flatten it with a gymnasium wrapper "
            f"and register the wrapped env under a new id."
        )
    transforms += [InitTracker(), StepCounter(), RewardSum()]
    return TransformedEnv(base, Compose(*transforms))


class CategoricalSampler(nn.Module):
    """``logits -> (action, sample_log_prob)``: a sample (or the mode) of ``Categorical``."""

    def __init__(self, deterministic: bool = False) -> None:
        super().__init__()
        self.deterministic = deterministic

    def forward(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dist = Categorical(logits=logits)
        action = dist.mode if self.deterministic else dist.sample()
        return action, dist.log_prob(action)


def _trunk(cfg: ModelConfig, obs_dim: int, name: str, obs_key: str = OBS_KEY) -> nn.Module:
    """A trunk reading ``obs_key`` (default ``"observation"``) and writing
    ``f"{name}_features"``.

    Recurrent trunks keep their state under ``f"{name}_h"`` (and ``f"{name}_c"``), so the
    actor's and the critic's own trunks never share state keys.
    """
    out = f"{name}_features"
    if cfg.memory == "lstm":
        h, c = f"{name}_h", f"{name}_c"
        return LSTMModule(
            obs_dim, cfg.hidden_size, num_layers=cfg.num_layers,
            recurrent_backend=cfg.recurrent_backend,
            in_keys=[obs_key, h, c], out_keys=[out, ("next", h), ("next", c)],
        )  # fmt: skip
    if cfg.memory == "gru":
        h = f"{name}_h"
        return GRUModule(
            obs_dim, cfg.hidden_size, num_layers=cfg.num_layers,
            recurrent_backend=cfg.recurrent_backend,
            in_keys=[obs_key, h], out_keys=[out, ("next", h)],
        )  # fmt: skip
    mlp = MLP(
        obs_dim, cfg.hidden_size, num_cells=cfg.hidden_size, depth=cfg.num_layers,
        activate_last_layer=True,
    )  # fmt: skip
    return Mod(mlp, in_keys=[obs_key], out_keys=[out])


class ObsScale(nn.Module):
    """``x -> scale * x`` (no parameters)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class ActorCritic(nn.Module):
    """Actor (trunk + logits head) and critic (trunk + value head) of a discrete policy.

    Args:
        obs_scale: with a value other than 1, both trunks read ``"scaled_observation"`` =
            ``obs_scale * "observation"``.

    Attributes:
        actor: writes ``"logits"`` ``[*B, n_actions]``.
        critic: writes ``"state_value"`` ``[*B, 1]``.

    :meth:`policy` is what the collector runs: the actor, the critic's own recurrent trunk
    (so its hidden state is stored in the batch for the loss to restart from), and a
    :class:`CategoricalSampler` writing ``"action"`` and ``"sample_log_prob"``.
    """

    def __init__(
        self, cfg: ModelConfig, obs_dim: int, n_actions: int, *, obs_scale: float = 1.0
    ) -> None:
        super().__init__()
        width = cfg.hidden_size
        key = OBS_KEY if obs_scale == 1.0 else "scaled_observation"
        pre = [] if key == OBS_KEY else [Mod(ObsScale(obs_scale), [OBS_KEY], [key])]
        actor_trunk = _trunk(cfg, obs_dim, "actor", key)
        critic_trunk = actor_trunk if cfg.shared_trunk else _trunk(cfg, obs_dim, "critic", key)
        a_feat, c_feat = actor_trunk.out_keys[0], critic_trunk.out_keys[0]
        self.actor = Seq(
            *pre, actor_trunk, Mod(MLP(width, n_actions, num_cells=width), [a_feat], ["logits"])
        )
        self.critic = Seq(
            *pre, critic_trunk, Mod(MLP(width, 1, num_cells=width), [c_feat], ["state_value"])
        )
        self._critic_trunk_at = len(pre)  # index of the critic's trunk in self.critic
        self._carry_critic = cfg.memory != "none" and not cfg.shared_trunk

    def policy(self, deterministic: bool = False) -> Seq:
        """The acting module; ``deterministic`` takes the most likely action."""
        sampler = Mod(CategoricalSampler(deterministic), ["logits"], ["action", "sample_log_prob"])
        if self._carry_critic and not deterministic:
            return Seq(self.actor, self.critic[self._critic_trunk_at], sampler)
        return Seq(self.actor, sampler)
