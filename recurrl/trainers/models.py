"""Envs and actor/critic networks of the recipes, built from the config dataclasses."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.envs import (
    Compose,
    GymVecEnv,
    InitTracker,
    MaskObservation,
    OneHotObservation,
    RewardSum,
    StepCounter,
    TransformedEnv,
    specs,
)
from recurrl.modules import MEMORY_REGISTRY, MLP, memory_names
from recurrl.modules.registry import FEED_FORWARD as _FEED_FORWARD
from recurrl.trainers.config import DEFAULT_NUM_ENVS, EnvConfig, ModelConfig, TrainConfig
from recurrl.trainers.distributions import (  # noqa: F401 (re-exported)
    LOG_STD_MAX,
    LOG_STD_MIN,
    TANH_EPS,
    BoundedActions,
    CategoricalSampler,
    FactorizedCategorical,
    FactorizedCategoricalSampler,
    GaussianParams,
    ScaledTanhNormal,
    TanhNormalSampler,
    check_action_bounds,
    gaussian_head,
    squashed_gaussian,
)
from recurrl.trainers.encoders import (
    ObsInputs,
    add_image_encoder,
    inputs_vector_env,
    needs_network_inputs,
    observation_inputs,
)
from recurrl.trainers.errors import UsageError

__all__ = [
    "ActorCritic",
    "BoundedActions",
    "CategoricalSampler",
    "EpsilonGreedy",
    "FactorizedCategorical",
    "FactorizedCategoricalSampler",
    "GaussianParams",
    "ObservationNorm",
    "QNetwork",
    "ScaledTanhNormal",
    "TanhNormalSampler",
    "actor_critic",
    "check_action_bounds",
    "gaussian_head",
    "make_env",
    "squashed_gaussian",
]

OBS_KEY = "observation"
#: ``ModelConfig.memory`` of the feed-forward trunk (an MLP, no state)
FEED_FORWARD = _FEED_FORWARD


def make_env(
    cfg: EnvConfig,
    *,
    num_envs: int | None = None,
    seed: int | None = None,
    device: torch.device | str | None = None,
):
    """``N`` envs of ``cfg.env`` with the built-in mask (if any), ``InitTracker``,
    ``StepCounter`` and ``RewardSum`` (``("next", "episode_reward")`` is the running return).

    The envs are what :meth:`EnvConfig.resolved_engine` names: recurrl's batched torch
    implementation of the task (``"torch"``, on ``device``, default cpu), or on the CPU
    (``device`` ignored) a gymnasium ``GymVecEnv(num_envs=N)`` (``"gymnasium"``; with
    ``vectorization="vector_entry_point"`` for ``"gymnasium-vector"``) or an
    :class:`~recurrl.envs.EnvPoolEnv` (``"envpool"``).

    A discrete observation (gymnasium ``Discrete`` / ``MultiDiscrete``, e.g. the cards of
    popgym's RepeatPrevious) is one-hot encoded first (:class:`OneHotObservation`), so the
    networks always read a flat float vector. Any other observation (a ``Dict``, a
    ``Tuple``, an image, a ``Box`` of rank > 1) goes through
    :class:`~recurrl.trainers.encoders.NetworkInputs`:
    ``"observation"`` ``[N, F]`` (the vectors, concatenated) and ``"pixels"`` uint8
    ``[N, H, W, C]`` (the images), text entries dropped with a warning. The recurrent
    policies' primers are appended by the collector.
    """
    kwargs = {} if cfg.max_episode_steps is None else {"max_episode_steps": cfg.max_episode_steps}
    n = cfg.num_envs if num_envs is None else num_envs
    if n is None:  # an EnvConfig outside a TrainConfig, which resolves it per algorithm
        n = DEFAULT_NUM_ENVS["ppo"]
    if cfg.is_multiagent():  # the team's reward and return; docs/guides/multiagent.md
        from recurrl.trainers.multiagent import make_multiagent_train_env

        return make_multiagent_train_env(cfg, n, seed=seed, device=device)
    gym_id = cfg.gym_id()
    if cfg.resolved_engine() == "torch":
        from recurrl.envs.torch_envs import make_torch_env

        base = make_torch_env(
            cfg.env, n, device=device, seed=seed, max_episode_steps=cfg.max_episode_steps
        )
        return _with_transforms(base, cfg)
    if cfg.mask() is None and needs_network_inputs(_observation_space(gym_id, kwargs)):
        try:
            vector_env = inputs_vector_env(gym_id, n, kwargs)
        except ValueError as err:  # nothing the networks can read: the user's env choice
            raise UsageError(f"recurrl train: {err}") from err
        base = GymVecEnv(vector_env, seed=seed)
        return TransformedEnv(base, Compose(InitTracker(), StepCounter(), RewardSum()))
    engine = cfg.resolved_engine()
    if engine == "envpool":
        from recurrl.envs import EnvPoolEnv

        return _with_transforms(EnvPoolEnv(gym_id, num_envs=n, seed=seed, **kwargs), cfg)
    vectorization = "vector_entry_point" if engine == "gymnasium-vector" else "sync"
    base = GymVecEnv(gym_id, num_envs=n, seed=seed, vectorization=vectorization, **kwargs)
    return _with_transforms(base, cfg)


def _with_transforms(base, cfg: EnvConfig):
    """``base`` with the mask, the one-hot encoding of a discrete observation, and the
    trackers every recipe reads; refuses an observation the networks cannot read."""
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


def _observation_space(gym_id: str, make_kwargs: dict):
    """The observation space of one env of ``gym_id`` (made, read, closed)."""
    import gymnasium

    env = gymnasium.make(gym_id, **make_kwargs)
    try:
        return env.observation_space
    finally:
        env.close()


def _trunk(cfg: ModelConfig, obs_dim: int, name: str, obs_key: str = OBS_KEY) -> nn.Module:
    """A trunk reading ``obs_key`` (default ``"observation"``) and writing
    ``f"{name}_features"``.

    Recurrent trunks (the module :data:`~recurrl.modules.registry.MEMORY_REGISTRY` maps
    ``cfg.memory`` to) keep their
    state under ``f"{name}_h"`` (and ``f"{name}_c"`` for the LSTM, ``f"{name}_y"`` for the
    LRU), so the actor's and the critic's own trunks never share state keys.
    """
    out = f"{name}_features"
    if cfg.memory == FEED_FORWARD:
        mlp = MLP(
            obs_dim, cfg.hidden_size, num_cells=cfg.hidden_size, depth=cfg.num_layers,
            activate_last_layer=True,
        )  # fmt: skip
        return Mod(mlp, in_keys=[obs_key], out_keys=[out])
    if cfg.memory not in MEMORY_REGISTRY:
        choices = ", ".join(repr(m) for m in (*memory_names(), FEED_FORWARD))
        raise ValueError(
            f"ModelConfig.memory must be one of {choices}, received {cfg.memory!r}. Fix: "
            f"--memory lstm (or another of those names), or register_memory() your module."
        )
    entry = MEMORY_REGISTRY[cfg.memory]
    module, suffixes = entry.module, entry.state_suffixes
    states = [f"{name}_{suffix}" for suffix in suffixes]
    return module(
        obs_dim, cfg.hidden_size, num_layers=cfg.num_layers,
        recurrent_backend=cfg.recurrent_backend,
        in_keys=[obs_key, *states], out_keys=[out, *(("next", key) for key in states)],
    )  # fmt: skip


class ObsScale(nn.Module):
    """``x -> scale * x`` (no parameters)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class ObservationNorm(nn.Module):
    """``(x - loc) / scale * extra_scale`` per observation entry; ``loc``/``scale`` are
    buffers (saved with the model), identity until :meth:`fit` sets them.

    Examples:
        >>> norm = ObservationNorm(2)
        >>> norm.fit(torch.tensor([[0.0, 10.0], [2.0, 30.0], [4.0, 50.0]]))  # std 2, 20
        >>> norm(torch.tensor([[2.0, 30.0], [4.0, 50.0]]))
        tensor([[0., 0.],
                [1., 1.]])
    """

    def __init__(self, size: int, extra_scale: float = 1.0) -> None:
        super().__init__()
        self.register_buffer("loc", torch.zeros(size))
        self.register_buffer("scale", torch.ones(size))
        self.extra_scale = extra_scale

    @torch.no_grad()
    def fit(self, observations: torch.Tensor, eps: float = 1e-6) -> None:
        """Set ``loc``/``scale`` to the mean/std of ``observations`` ``[n, size]``."""
        flat = observations.reshape(-1, self.loc.numel()).to(self.loc.dtype)
        self.loc.copy_(flat.mean(0))
        self.scale.copy_(flat.std(0).clamp_min(eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.loc) / self.scale * self.extra_scale


class ActorCritic(BoundedActions, nn.Module):
    """Actor (trunk + policy head) and critic (trunk + value head).

    Args:
        obs_dim: ``F``, the features of ``"observation"`` ``[*B, F]``; or an
            :class:`~recurrl.trainers.encoders.ObsInputs` (from
            :func:`~recurrl.trainers.encoders.observation_inputs`): with an image, an
            encoder (``cfg.image_encoder``: a CNN, or one linear layer with ``"flat"``)
            shared by the actor and the critic reads ``"pixels"`` uint8 ``[*B, H, W, C]``
            and both trunks read ``"encoded_observation"`` ``[*B, F + hidden_size]`` (the
            vector, then the image features).
        n_actions: discrete actions, or the size ``A`` of a continuous action, or (with
            ``action_nvec``) ``sum(action_nvec)``, the logits of all the sub-actions.
        obs_scale: with a value other than 1, both trunks read ``"scaled_observation"`` =
            ``obs_scale * "observation"`` (the vector only: the CNN scales pixels to [0, 1]).
        obs_norm: standardize the vector first: both trunks read ``"scaled_observation"`` =
            ``obs_scale * (observation - loc) / scale`` (:attr:`obs_norm`, the identity until
            :meth:`ObservationNorm.fit` sets ``loc`` / ``scale``, saved in the state dict).
        action_bounds: ``(low, high)``, each ``[A]`` and finite, for a continuous action
            (a gymnasium ``Box``): the policy is then a tanh-squashed Gaussian rescaled to
            ``[low, high]`` (:class:`ScaledTanhNormal`), its scale one learned parameter
            per entry or, with ``cfg.action_std="state"``, an output of the head. ``None``:
            a categorical policy over ``n_actions``.
        action_nvec: the category counts ``[K]`` of a ``MultiDiscrete`` action (a gymnasium
            ``MultiDiscrete([8, 8])``: ``(8, 8)``): the policy is then a
            :class:`FactorizedCategorical`, the head writing ``sum(action_nvec)`` logits and
            the action an int ``[*B, K]``. Not with ``action_bounds``.

    Attributes:
        obs_norm: the :class:`ObservationNorm`, or ``None`` without ``obs_norm`` (or
            without a vector observation).
        continuous: the action is a ``Box`` (``action_bounds`` given).
        action_nvec: the ``MultiDiscrete`` counts as a tuple, or ``None``.
        actor: writes ``"logits"`` ``[*B, n_actions]``, or ``"loc"`` and ``"scale"``
            ``[*B, A]`` (the Gaussian's, before the tanh).
        critic: writes ``"state_value"`` ``[*B, 1]``.

    :meth:`policy` is what the collector runs: the actor, the critic's own recurrent trunk
    (so its hidden state is stored in the batch for the loss to restart from), and a
    :class:`CategoricalSampler` (or :class:`TanhNormalSampler`, or
    :class:`FactorizedCategoricalSampler`) writing ``"action"`` (``[*B]`` int, ``[*B, A]``
    float in the bounds, or ``[*B, K]`` int) and ``"sample_log_prob"`` ``[*B]``.

    Examples:
        >>> from tensordict import TensorDict
        >>> model = ActorCritic(ModelConfig(memory="none", hidden_size=8), 3, 1,
        ...                     action_bounds=(torch.tensor([-2.0]), torch.tensor([2.0])))
        >>> td = model.policy()(TensorDict(observation=torch.randn(4, 3), batch_size=[4]))
        >>> td["action"].shape, td["sample_log_prob"].shape, bool(td["action"].abs().max() < 2)
        (torch.Size([4, 1]), torch.Size([4]), True)
    """

    def __init__(
        self,
        cfg: ModelConfig,
        obs_dim: int | ObsInputs,
        n_actions: int,
        *,
        obs_scale: float = 1.0,
        obs_norm: bool = False,
        action_bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
        action_nvec: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self._set_action_bounds(action_bounds, n_actions)
        self.action_nvec = None if action_nvec is None else tuple(int(n) for n in action_nvec)
        if self.action_nvec is not None:
            nvec = self.action_nvec
            if action_bounds is not None or not nvec or min(nvec) < 1 or sum(nvec) != n_actions:
                raise ValueError(
                    f"ActorCritic: action_nvec must be non-empty category counts >= 1 summing "
                    f"to n_actions (the logits the head writes), without action_bounds; "
                    f"received action_nvec={list(nvec)}, n_actions={n_actions}, action_bounds "
                    f"{'given' if action_bounds is not None else 'None'}. Fix: "
                    f"n_actions=sum(action_nvec)."
                )
        width = cfg.hidden_size
        inputs = ObsInputs.of(obs_dim)
        self.obs_norm = ObservationNorm(inputs.vector, obs_scale) if obs_norm else None
        if not inputs.vector:
            self.obs_norm = None
        key = OBS_KEY
        if self.obs_norm is not None or (obs_scale != 1.0 and inputs.vector):
            key = "scaled_observation"
        scaling = self.obs_norm if self.obs_norm is not None else ObsScale(obs_scale)
        pre = [] if key == OBS_KEY else [Mod(scaling, [OBS_KEY], [key])]
        # an image: one encoder (cfg.image_encoder), shared by the actor and the critic,
        # feeds both trunks
        pre, key, in_dim = add_image_encoder(
            pre, inputs, key, "encoded_observation", width, cfg.image_encoder
        )
        actor_trunk = _trunk(cfg, in_dim, "actor", key)
        critic_trunk = actor_trunk if cfg.shared_trunk else _trunk(cfg, in_dim, "critic", key)
        a_feat, c_feat = actor_trunk.out_keys[0], critic_trunk.out_keys[0]
        if self.continuous:
            head = gaussian_head(width, n_actions, cfg.action_std)
            self.actor = Seq(*pre, actor_trunk, Mod(head, [a_feat], ["loc", "scale"]))
        else:
            self.actor = Seq(
                *pre, actor_trunk, Mod(MLP(width, n_actions, num_cells=width), [a_feat], ["logits"])
            )
        self.critic = Seq(
            *pre, critic_trunk, Mod(MLP(width, 1, num_cells=width), [c_feat], ["state_value"])
        )
        self._critic_trunk_at = len(pre)  # index of the critic's trunk in self.critic
        self._carry_critic = cfg.memory != FEED_FORWARD and not cfg.shared_trunk

    def policy(self, deterministic: bool = False) -> Seq:
        """The acting module; ``deterministic`` takes the most likely action (continuous: the
        squashed, rescaled mean; ``MultiDiscrete``: each dimension's argmax)."""
        if self.continuous:
            tanh = TanhNormalSampler(self.action_low, self.action_high, deterministic)
            sampler = Mod(tanh, ["loc", "scale"], ["action", "sample_log_prob"])
        elif self.action_nvec is not None:
            factors = FactorizedCategoricalSampler(self.action_nvec, deterministic)
            sampler = Mod(factors, ["logits"], ["action", "sample_log_prob"])
        else:
            sampler = Mod(
                CategoricalSampler(deterministic), ["logits"], ["action", "sample_log_prob"]
            )
        if self._carry_critic and not deterministic:
            return Seq(self.actor, self.critic[self._critic_trunk_at], sampler)
        return Seq(self.actor, sampler)

    def factorized_distribution(self, logits: torch.Tensor) -> FactorizedCategorical:
        """The ``MultiDiscrete`` policy's :class:`FactorizedCategorical` for the actor's
        ``"logits"`` ``[*B, sum(nvec)]``; ``log_prob`` of an action ``[*B, K]`` is ``[*B]``."""
        if self.action_nvec is None:
            raise ValueError(
                "ActorCritic.factorized_distribution: this model's action is not MultiDiscrete "
                "(built without action_nvec). Fix: build it with action_nvec=(n_1, ..., n_K)."
            )
        return FactorizedCategorical(logits, self.action_nvec)


def actor_critic(cfg: TrainConfig, env) -> ActorCritic:
    """The :class:`ActorCritic` of ``cfg`` for ``env`` (from :func:`make_env`): categorical for
    a discrete action spec, a product of categoricals for a ``MultiCategorical`` one (a
    gymnasium ``MultiDiscrete``), squashed Gaussian in the spec's bounds for a bounded float
    one; for a multi-agent task, :func:`~recurrl.trainers.multiagent.multiagent_actor_critic`."""
    if cfg.env.is_multiagent():
        from recurrl.trainers.multiagent import multiagent_actor_critic

        return multiagent_actor_critic(cfg, env)
    obs_dim = observation_inputs(env)
    spec = env.action_spec
    if isinstance(spec, specs.MultiCategorical):
        if spec.nvec.ndim != 1:
            raise ValueError(
                f"actor_critic: expected a flat MultiDiscrete action (nvec [K]), received "
                f"nvec of shape {list(spec.nvec.shape)}. Fix: flatten the action space with a "
                f"gymnasium wrapper and register the wrapped env under a new id."
            )
        nvec = [int(n) for n in spec.nvec.tolist()]
        return ActorCritic(
            cfg.model, obs_dim, sum(nvec), obs_scale=cfg.ppo.obs_scale,
            obs_norm=cfg.ppo.obs_norm, action_nvec=nvec,
        )  # fmt: skip
    if isinstance(spec, specs.Bounded) and spec.dtype.is_floating_point:
        low, high = spec.low, spec.high
        n_actions = spec.shape[-1]
        return ActorCritic(
            cfg.model, obs_dim, n_actions, obs_scale=cfg.ppo.obs_scale,
            obs_norm=cfg.ppo.obs_norm,
            action_bounds=(low.reshape(-1, n_actions)[0], high.reshape(-1, n_actions)[0]),
        )  # fmt: skip
    return ActorCritic(
        cfg.model, obs_dim, spec.n, obs_scale=cfg.ppo.obs_scale, obs_norm=cfg.ppo.obs_norm
    )


class EpsilonGreedy(nn.Module):
    """``action_value [*B, A] -> action [*B]``: argmax, or a uniform action with probability
    ``epsilon`` (torch's global RNG). Set :attr:`epsilon` between calls to anneal it.

    ``epsilon`` is kept in a buffer, so it is part of the policy's ``state_dict()`` and
    travels with the weights a :class:`~recurrl.collectors.RayCollector` sends to its
    workers. A state dict written before it was a buffer (without the entry) loads and keeps
    the current value.

    Args:
        epsilon: one probability for every row, or a sequence of ``N`` (one per row of a
            batch ``[N, A]``: e.g. one per env of a vector env, Ape-X's per-actor epsilons).
        pinned: the epsilon belongs to this module: it is left out of ``state_dict()`` and
            any value a loaded state dict holds is ignored, so weight updates never change
            it (each Ray worker keeps its own epsilon through every weight sync).

    Examples:
        >>> greedy = EpsilonGreedy(0.0)
        >>> greedy(torch.tensor([[0.1, 0.7], [0.3, -1.0]]))
        tensor([1, 0])
        >>> greedy.epsilon = 0.25
        >>> greedy.state_dict()["eps"]
        tensor(0.2500)
        >>> per_row = EpsilonGreedy([0.0, 1.0], pinned=True)  # row 0 greedy, row 1 uniform
        >>> per_row.epsilons, "eps" in per_row.state_dict()
        ([0.0, 1.0], False)
        >>> per_row.load_state_dict({"eps": torch.tensor(0.5)})  # ignored: pinned
        <All keys matched successfully>
        >>> per_row.epsilons
        [0.0, 1.0]
    """

    def __init__(self, epsilon: float | Sequence[float] = 0.0, *, pinned: bool = False) -> None:
        super().__init__()
        eps = torch.tensor(epsilon, dtype=torch.float32)
        if eps.ndim > 1 or not bool(((eps >= 0) & (eps <= 1)).all()):
            raise ValueError(
                f"EpsilonGreedy: expected epsilon a probability in [0, 1] or a flat sequence "
                f"of them (one per row), received {epsilon!r}."
            )
        self.pinned = pinned
        self.register_buffer("eps", eps, persistent=not pinned)

    @property
    def epsilon(self) -> float:
        """The probability of a uniform action (the mean over the rows for per-row ones)."""
        return float(self.eps.mean())

    @epsilon.setter
    def epsilon(self, value: float) -> None:
        self.eps.fill_(float(value))

    @property
    def epsilons(self) -> list[float]:
        """The per-row probabilities (one entry for a single epsilon)."""
        return self.eps.reshape(-1).tolist()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        if self.pinned:
            state_dict.pop(prefix + "eps", None)
        else:
            state_dict.setdefault(prefix + "eps", self.eps.detach().clone())
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, action_value: torch.Tensor) -> torch.Tensor:
        greedy = action_value.argmax(-1)
        if not bool((self.eps > 0.0).any()):
            return greedy
        eps = self.eps
        if eps.ndim:  # one epsilon per row of action_value [N, ..., A]
            rows = greedy.shape[0] if greedy.ndim else 1
            if eps.shape[0] != rows:
                raise ValueError(
                    f"EpsilonGreedy: {eps.shape[0]} per-row epsilons, but the batch has {rows} "
                    f"row(s) (action_value {list(action_value.shape)}). Fix: one epsilon per "
                    f"env, or a single epsilon."
                )
            eps = eps.reshape(-1, *([1] * (greedy.ndim - 1))) if greedy.ndim else eps[0]
        explore = torch.rand(greedy.shape, device=greedy.device) < eps
        uniform = torch.randint(action_value.shape[-1], greedy.shape, device=greedy.device)
        return torch.where(explore, uniform, greedy)


class QNetwork(nn.Module):
    """Observation normalization, a trunk (LSTM/GRU/MLP from :class:`ModelConfig`) and an MLP
    head (one hidden layer, as PPO's critic) writing ``"action_value"`` ``[*B, n_actions]``.

    Args:
        obs_dim: ``F``, the features of ``"observation"`` ``[*B, F]``; or an
            :class:`~recurrl.trainers.encoders.ObsInputs`: with an image, the encoder
            ``cfg.image_encoder`` (a CNN, or one linear layer with ``"flat"``) reads
            ``"pixels"`` uint8 ``[*B, H, W, C]`` and the trunk reads ``"q_encoded"``
            ``[*B, F + hidden_size]`` (the normalized vector, then the image features).
        obs_scale: the trunk reads ``"q_observation"`` = ``obs_scale * norm("observation")``
            (``norm``: :attr:`obs_norm`, the identity until fitted).

    Attributes:
        obs_norm: the :class:`ObservationNorm` (buffers saved in the model's state dict).

    Attributes:
        q: the Q-network (a TensorDict module; recurrent state keys ``"q_h"`` (``"q_c"``)).
    """

    def __init__(
        self, cfg: ModelConfig, obs_dim: int | ObsInputs, n_actions: int, *, obs_scale: float = 1.0
    ) -> None:
        super().__init__()
        inputs = ObsInputs.of(obs_dim)
        width = cfg.hidden_size
        self.obs_norm = ObservationNorm(inputs.vector, obs_scale)
        pre = [Mod(self.obs_norm, ["observation"], ["q_observation"])] if inputs.vector else []
        pre, key, in_dim = add_image_encoder(
            pre, inputs, "q_observation", "q_encoded", width, cfg.image_encoder
        )
        trunk = _trunk(cfg, in_dim, "q", obs_key=key)
        head = MLP(width, n_actions, num_cells=width)  # as PPO's critic head
        self.q = Seq(*pre, trunk, Mod(head, [trunk.out_keys[0]], ["action_value"]))

    def policy(self, epsilon: float | Sequence[float] = 0.0, *, pinned: bool = False) -> Seq:
        """The acting module: the Q-network then :class:`EpsilonGreedy` (``epsilon``,
        ``pinned`` as there) writing ``"action"``."""
        greedy = EpsilonGreedy(epsilon, pinned=pinned)
        return Seq(self.q, Mod(greedy, ["action_value"], ["action"]))
