"""Typed configuration of a training run: one dataclass per concern, one docstring per field.

The command line (:mod:`recurrl.trainers.cli`) is generated from these dataclasses (a field's
docstring is its ``--help`` text) and the resolved :class:`TrainConfig` is saved with every
run as ``config.json``. Every ``__post_init__`` validates its fields and says what to change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from recurrl.functional.recurrent import recurrent_backend_names
from recurrl.modules.registry import FEED_FORWARD, MEMORY_REGISTRY, memory_names
from recurrl.trainers._config_checks import (
    check_entries,
    check_frames,
    field_docs,
    finite,
    positive,
)
from recurrl.trainers.dqn_config import DQNConfig
from recurrl.trainers.env_config import ENGINES, MASKED_ENVS, EnvConfig

__all__ = [
    "ENGINES",
    "MASKED_ENVS",
    "RESUMABLE",
    "DQNConfig",
    "EnvConfig",
    "ModelConfig",
    "PPOConfig",
    "RunConfig",
    "TrainConfig",
    "field_docs",
    "resume_conflicts",
]

def _memory_choices() -> tuple[str, ...]:
    """``ModelConfig.memory``'s values: the registered memories, then the feed-forward trunk."""
    return (*memory_names(), FEED_FORWARD)


def _image_encoder_choices() -> tuple[str, ...]:
    """``ModelConfig.image_encoder``'s values: the names of the image encoders' registry."""
    from recurrl.trainers.encoders import IMAGE_ENCODERS

    return tuple(IMAGE_ENCODERS)


@dataclass
class ModelConfig:
    """Actor and critic: a trunk (recurrent or feed-forward) and small MLP heads."""

    memory: str = field(default="lstm", metadata={"choices": _memory_choices})
    """Trunk: a registered memory (lstm, gru, mingru, lru: mingru and lru are linear-recurrent
    cells trained with a parallel scan; register_memory() adds one), or none (a feed-forward
    MLP baseline without memory)."""
    hidden_size: int = 64
    """Features of the recurrent state (and width of the MLP layers)."""
    num_layers: int = 1
    """Stacked recurrent layers (hidden layers of the MLP trunk with memory=none)."""
    shared_trunk: bool = False
    """Actor and critic share one trunk (else each has its own)."""
    action_std: Literal["parameter", "state"] = "parameter"
    """Continuous (Box) actions, PPO only: the policy is a Gaussian squashed by tanh into the
    action bounds; its standard deviation is one learned parameter per action entry
    (parameter) or an output of the actor's head for every state (state)."""
    image_encoder: str = field(default="cnn", metadata={"choices": _image_encoder_choices})
    """Encoder of image observations (uint8 HxWxC, e.g. MiniGrid's view): cnn (three 3x3
    convolutions and a linear layer), flat (the entries as numbers through one linear
    layer; about 1/100 of the CNN's cost per frame) or onehot (every entry as a category,
    one learned vector per entry and value, summed; a few times flat's cost). flat and onehot are
    for small symbolic grids such as MiniGrid's, whose entries are object, colour and state
    indices; onehot keeps different objects apart."""
    recurrent_backend: str = field(default="auto", metadata={"choices": recurrent_backend_names})
    """How the recurrent trunk runs a sequence with resets in training: auto (the fastest
    backend that runs the input, picked per batch; the rule is resolve_backend's in
    recurrl.functional.recurrent), pad (split at resets, torch's fused kernel), scan (time
    loop), cpp (scan's loop in C++ on CPU, compiled on first use; `recurrl build-ext` compiles
    ahead of time), assoc (parallel scan, linear cells only), triton (GPU kernel) or any
    registered backend. All give the same numbers up to float rounding (the default recipes
    are measured under several, see benchmarks/learning/README.md), so a resumed run may
    change it."""

    def __post_init__(self) -> None:
        finite(self)
        if self.memory not in _memory_choices():
            raise ValueError(
                f"ModelConfig: memory must be one of {_memory_choices()}, received "
                f"{self.memory!r}. Fix: --memory lstm; a memory of your own: register_memory() "
                f"it in a module named by $RECURRL_PLUGINS."
            )
        positive("ModelConfig", hidden_size=self.hidden_size, num_layers=self.num_layers)
        if self.action_std not in ("parameter", "state"):
            raise ValueError(
                f"ModelConfig: action_std must be 'parameter' or 'state', received "
                f"{self.action_std!r}. Fix: --action-std parameter."
            )
        if self.image_encoder not in _image_encoder_choices():
            raise ValueError(
                f"ModelConfig: image_encoder must be one of {_image_encoder_choices()}, "
                f"received {self.image_encoder!r}. Fix: --image-encoder cnn (or onehot / flat "
                f"for a small symbolic grid such as MiniGrid's)."
            )
        if self.recurrent_backend not in recurrent_backend_names():
            raise ValueError(
                f"ModelConfig: recurrent_backend must be one of {recurrent_backend_names()}, "
                f"received {self.recurrent_backend!r}. Fix: --recurrent-backend auto; a backend "
                f"of your own: register it in a module named by $RECURRL_PLUGINS."
            )
        if self.memory != FEED_FORWARD:
            reason = MEMORY_REGISTRY[self.memory].backend_refusal(self.recurrent_backend)
            if reason is not None:
                runs = [
                    m.name for m in MEMORY_REGISTRY.values()
                    if m.backend_refusal(self.recurrent_backend) is None
                ]  # fmt: skip
                other = f", or --memory {' / '.join(runs)}" if runs else ""
                raise ValueError(
                    f"ModelConfig: memory={self.memory!r} with {reason} Fix: "
                    f"--recurrent-backend auto{other}."
                )


@dataclass
class PPOConfig:
    """Proximal policy optimization: batch sizes, optimization and loss coefficients.

    The defaults (with 20 envs, ``EnvConfig.num_envs``'s default for PPO, hence 5 minibatches
    of 4 rows) were measured on CartPole-masked over seeds 0-9 with an LSTM and a GRU, each
    under the ``pad`` and the ``scan`` backend: after 50k frames the greedy policy returns >=
    450 on at least 9 of 10 seeds in all four cases (interquartile mean 499.9-500; see
    ``benchmarks/learning/README.md``, which also gives the earlier 8-env figures and
    100k-frame recipes).
    """

    frames: int = 50_000
    """Total env frames to train for: a multiple of frames_per_batch when that is given,
    else rounded up to a whole number of batches."""
    frames_per_batch: int | None = None
    """Frames collected per batch (num_envs rows of frames_per_batch / num_envs steps). None:
    num_envs x steps_per_env, so --num-envs N alone sets the batch (1000 with the default 20
    envs)."""
    steps_per_env: int = 50
    """Steps every env takes per batch when frames_per_batch is None (the recipe's row
    length)."""
    epochs: int = 8
    """Passes over every collected batch."""
    num_minibatches: int | None = None
    """Minibatches per epoch (each a set of whole env rows, or of slices); it must divide the
    rows of a batch (num_envs, or num_envs x slices per row). None: the largest divisor of
    the rows up to 5 (5 minibatches of 4 rows with the default 20 envs, the tuned recipe)."""
    slice_len: int = 0
    """Cut each env row into slices of this many steps before minibatching (the recurrent
    state stored at a slice's first step restarts it); 0 keeps whole rows."""
    lr: float = 5e-3
    """Adam learning rate."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over `frames`."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_epsilon: float = 0.2
    """PPO ratio clip range (at the start of the run)."""
    clip_epsilon_end: float | None = None
    """PPO ratio clip range at the end: it moves linearly from clip_epsilon to this over
    `frames` (smaller policy steps late in the run); None keeps clip_epsilon throughout."""
    entropy_coef: float = 0.01
    """Weight of the entropy bonus at the start of the run."""
    entropy_coef_end: float | None = 0.0
    """Weight of the entropy bonus at the end: it moves linearly from entropy_coef to this
    over `frames` (a sharper policy late in the run); None keeps entropy_coef throughout."""
    critic_coef: float = 0.5
    """Weight of the value loss."""
    clip_value: float | None = None
    """Clip each value prediction to within this distance of the value stored when the batch
    was collected and take the larger of the clipped and unclipped losses (PPO's value
    clipping, in the scale of the rewards after reward_scale); None trains the critic on the
    plain squared error."""
    obs_norm: bool = False
    """Standardize each observation entry with the mean and std of the first batch's frames
    (collected by the initial policy; that batch fits the normalization and is not trained
    on), frozen afterwards and saved with the model; obs_scale then multiplies the result."""
    obs_scale: float = 10.0
    """Multiply observations by this before the actor and critic trunks (CartPole-masked's
    position and angle are about 0.1: scaled up, the recurrent trunk learns faster)."""
    reward_scale: float = 0.1
    """Multiply rewards by this before GAE (smaller value targets; logged returns are
    unscaled)."""
    normalize_advantage: bool = True
    """Normalize advantages within each minibatch."""
    max_grad_norm: float = 5.0
    """Clip the global gradient norm to this value (0 disables)."""
    multiagent: Literal["mappo", "ippo"] = "mappo"
    """Multi-agent envs (--env mpe2:..., vmas:...; docs/guides/multiagent.md): the critic of the
    agents' PPO: mappo (centralized: reads the env's global state, or all agents'
    observations) or ippo (each agent's value from its own observation). The actor is shared
    by the agents either way."""

    def __post_init__(self) -> None:
        finite(self)
        if self.multiagent not in ("mappo", "ippo"):
            raise ValueError(
                f"PPOConfig: multiagent must be 'mappo' or 'ippo', received {self.multiagent!r}."
                f" Fix: --multiagent mappo."
            )
        positive("PPOConfig", frames=self.frames, steps_per_env=self.steps_per_env,
                 epochs=self.epochs)  # fmt: skip
        if self.frames_per_batch is not None:
            positive("PPOConfig", frames_per_batch=self.frames_per_batch)
            check_frames("PPOConfig", self.frames, self.frames_per_batch)
        if self.num_minibatches is not None:
            positive("PPOConfig", num_minibatches=self.num_minibatches)
        if self.slice_len < 0:
            raise ValueError(f"PPOConfig: slice_len must be >= 0, received {self.slice_len}.")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"PPOConfig: {name} must be in [0, 1].")
        if not self.obs_scale > 0:
            raise ValueError(f"PPOConfig: obs_scale must be > 0, received {self.obs_scale}.")
        for name in ("entropy_coef", "entropy_coef_end"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(
                    f"PPOConfig: {name} must be a number >= 0 (0 disables the entropy "
                    f"bonus), received {value!r}."
                )
        if self.clip_value is not None and not (
            isinstance(self.clip_value, (int, float)) and self.clip_value > 0
        ):
            raise ValueError(
                f"PPOConfig: clip_value must be a number > 0 (None disables value clipping), "
                f"received {self.clip_value!r}."
            )
        if self.clip_epsilon_end is not None and not (
            isinstance(self.clip_epsilon_end, (int, float)) and self.clip_epsilon_end > 0
        ):
            raise ValueError(
                f"PPOConfig: clip_epsilon_end must be a number > 0 (None keeps clip_epsilon), "
                f"received {self.clip_epsilon_end!r}."
            )
        if self.lr <= 0 or self.clip_epsilon <= 0 or self.max_grad_norm < 0:
            raise ValueError(
                "PPOConfig: lr and clip_epsilon must be > 0 and max_grad_norm >= 0, received "
                f"lr={self.lr}, clip_epsilon={self.clip_epsilon}, "
                f"max_grad_norm={self.max_grad_norm}."
            )


@dataclass
class RunConfig:
    """Seeding, device, output directory, checkpoints and logging."""

    seed: int = 0
    """Seed of torch, numpy, python and the envs (same seed, same numbers)."""
    device: str = "cpu"
    """Device of the networks (envs run on the CPU)."""
    run_dir: str | None = None
    """Output directory; default runs/<env>-[dqn-]<memory>-s<seed>-<date-time>."""
    checkpoint_every: int = 10_000
    """Save run_dir/checkpoint.pt every this many frames (and always at the end)."""
    checkpoint_every_s: float | None = None
    """Also save it when this many seconds have passed since the last save (at the next batch
    boundary), e.g. 600 on preemptible nodes; None: by frames only."""
    max_restarts: int = 3
    """With --collector ray: Ray workers that may be replaced per run when they crash or are
    killed (a replacement starts new episodes); one more failure ends the run. A resumed run
    keeps its budget (it shapes the trajectory ids). DQN's Ray replay buffer gets a budget of
    the same size for rebuilding its actor (refilled from the last checkpoint)."""
    max_restarts_per_minute: int | None = 5
    """With --collector ray: a failure that would be the (n+1)-th worker replacement within 60
    s ends the run instead (an env that crashes at once is not restarted in a loop); None: no
    rate limit."""
    placement_timeout_s: float | None = 60.0
    """With --collector ray: seconds to wait for every Ray worker to start before training
    with those that did (a cluster short of CPUs); the others join when Ray places them, and
    a replacement for a dead worker joins the same way instead of holding up collection.
    PPO's batches keep their size meanwhile: the started workers also collect the missing
    ones' shares. None: wait for all (and for every replacement)."""
    resume_on_failure: int = 0
    """Run the training in a child process and, when it dies (killed, or an internal error),
    resume it from its last checkpoint up to this many times (0: no child, no restarts)."""
    num_threads: int = 1
    """torch intra-op threads (0: torch's default); small networks run fastest on one."""
    tensorboard: bool = True
    """Also log to TensorBoard in run_dir (when tensorboard is installed)."""
    plot: bool = True
    """Save run_dir/learning_curve.png at the end (when matplotlib is installed)."""
    eval_episodes: int = 10
    """Greedy episodes evaluated (and printed) when the run reaches its frames; 0 skips the
    evaluation (`recurrl eval` runs it later)."""
    quiet: bool = False
    """Do not print a progress line per batch."""
    ray_address: str | None = None
    """With --collector ray: the Ray cluster to join (auto: the one `ray start --head` runs on
    this machine; ray://host:10001 for a remote head). None: start a local Ray for the run
    and stop it at the end."""
    save_simulator: bool = False
    """Also store the gymnasium simulators in checkpoint.pt (as a pickle), so that `recurrl
    train --resume RUN_DIR --trust-checkpoint` continues the interrupted episodes and
    replays the uninterrupted run exactly; without it a resumed run starts new episodes.
    Resume with --trust-checkpoint only from a checkpoint you wrote or trust: unpickling
    can run code."""

    def __post_init__(self) -> None:
        finite(self)
        positive("RunConfig", checkpoint_every=self.checkpoint_every)
        if self.max_restarts_per_minute is not None:
            positive("RunConfig", max_restarts_per_minute=self.max_restarts_per_minute)
        if self.placement_timeout_s is not None and not self.placement_timeout_s >= 0:
            raise ValueError(
                f"RunConfig: placement_timeout_s must be >= 0 (or None: wait for every worker), "
                f"received {self.placement_timeout_s}."
            )
        if self.checkpoint_every_s is not None and not self.checkpoint_every_s > 0:
            raise ValueError(
                f"RunConfig: checkpoint_every_s must be > 0 (or None: by frames only), received "
                f"{self.checkpoint_every_s}."
            )
        for name in ("num_threads", "eval_episodes", "max_restarts", "resume_on_failure"):
            if getattr(self, name) < 0:
                raise ValueError(f"RunConfig: {name} must be >= 0, received {getattr(self, name)}.")
        import torch

        try:
            torch.device(self.device)
        except RuntimeError as err:
            raise ValueError(
                f"RunConfig: invalid device {self.device!r} ({err}); e.g. cpu, cuda, cuda:1."
            ) from err


ALGOS = ("ppo", "dqn")
#: options added after runs were already written, with the value those runs ran with (a
#: config.json without the entry loads with it; see :meth:`TrainConfig.from_dict`)
SAVED_BEFORE: dict[tuple[str, str], Any] = {
    ("model", "recurrent_backend"): "pad",
    ("env", "engine"): "gymnasium",
    ("dqn", "sampler"): "slice",
    ("dqn", "priority_uniform_mix"): 0.0,
    ("model", "image_encoder"): "cnn",
    ("run", "max_restarts"): 0,
    ("ppo", "multiagent"): "mappo",
    ("run", "placement_timeout_s"): None,
}
#: what ``PPOConfig.obs_scale`` is unless set (a multi-agent run refuses any other value)
_OBS_SCALE_DEFAULT = PPOConfig.obs_scale
#: ``EnvConfig.num_envs`` when it is None: the number each algorithm's recipe was tuned with
DEFAULT_NUM_ENVS = {"ppo": 20, "dqn": 8}
#: ``PPOConfig.num_minibatches`` when it is None: the largest divisor of a batch's rows up to this
DEFAULT_MINIBATCHES = 5


@dataclass
class TrainConfig:
    """Everything a run needs; saved as ``run_dir/config.json``."""

    algo: Literal["ppo", "dqn"] = "ppo"
    """Training algorithm: ppo, or dqn (recurrent DQN on replayed whole episodes, or on
    R2D2's slices with burn-in: DQNConfig.sampler)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    dqn: DQNConfig = field(default_factory=DQNConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        finite(self)
        if self.algo not in ALGOS:
            raise ValueError(f"TrainConfig: unknown algo {self.algo!r}; available: {ALGOS}.")
        if self.env.num_envs is None:
            per = self.env.envs_per_worker
            ray = self.env.collector == "ray"
            self.env.num_envs = (
                self.env.workers * per if ray and per else DEFAULT_NUM_ENVS[self.algo]
            )
            if ray:
                self.env.worker_envs()  # validates the split
        self._resolve_batches()
        n, fpb = self.env.num_envs, getattr(self, self.algo).frames_per_batch
        if fpb % n:
            raise ValueError(
                f"TrainConfig: frames_per_batch={fpb} is not a multiple of num_envs={n} (every "
                f"env steps the same number of times). Fix: --frames-per-batch "
                f"{max(1, fpb // n) * n} or another --num-envs."
            )
        self._resolve_minibatches()
        self._check_collector()
        if self.algo == "ppo":
            self._check_ppo()
        else:
            self._check_dqn()
        self._check_action_space()

    def _check_collector(self) -> None:
        if self.env.collector == "ray":
            if self.run.save_simulator:
                raise ValueError(
                    "TrainConfig: save_simulator is not available with collector=ray (the "
                    "simulators live in the Ray workers). Fix: drop --save-simulator; a resumed "
                    "run then starts new episodes."
                )
        elif self.run.ray_address is not None:
            raise ValueError(
                f"TrainConfig: ray_address={self.run.ray_address!r} needs collector=ray. Fix: "
                f"add --collector ray, or drop --ray-address."
            )

    def _resolve_batches(self) -> None:
        """``frames_per_batch=None``: ``num_envs * steps_per_env``, and ``frames`` rounded up to
        a whole number of such batches; resolved in both sections (a config holds the values it
        would train with, a DQN run's ppo section too)."""
        for section in (self.ppo, self.dqn):
            if section.frames_per_batch is None:
                fpb = self.env.num_envs * section.steps_per_env
                section.frames_per_batch = fpb
                section.frames = -(-section.frames // fpb) * fpb

    def _resolve_minibatches(self) -> None:
        """``ppo.num_minibatches=None``: the largest divisor of a batch's rows up to
        :data:`DEFAULT_MINIBATCHES`, resolved for every algorithm so that a config always
        holds the value it would train with (a DQN run's ppo section too)."""
        if self.ppo.num_minibatches is not None:
            return
        n, p = self.env.num_envs, self.ppo
        steps = max(1, p.frames_per_batch // n)
        rows = n * max(1, steps // p.slice_len) if p.slice_len else n
        top = DEFAULT_MINIBATCHES
        p.num_minibatches = max(d for d in range(1, top + 1) if rows % d == 0)

    def _check_multiagent(self) -> None:
        """A multi-agent task trains with PPO (MAPPO / IPPO); its actions are checked when the
        env is built (discrete, or bounded float vectors). ``--action-std state`` needs
        continuous actions: refused where they are known to be discrete (VMAS and MPE without
        ``--continuous-actions``, recurrl's own tasks)."""
        from recurrl.trainers.multiagent import MULTIAGENT_TASKS

        env = self.env
        discrete = not env.continuous_actions and (
            env.env.startswith(("vmas:", "mpe2:")) or env.env in MULTIAGENT_TASKS
        )
        refused = {
            "algo": (self.algo != "ppo", "--algo ppo (MAPPO or IPPO: --multiagent)"),
            "obs_norm": (self.ppo.obs_norm, "drop --obs-norm"),
            "obs_scale": (
                self.ppo.obs_scale != _OBS_SCALE_DEFAULT,
                "drop --obs-scale (the agents' networks read each observation as the env "
                "gives it; scale it in the env, e.g. a transform, if it needs scaling)",
            ),
            "shared_trunk": (self.model.shared_trunk, "drop --shared-trunk"),
            "action_std": (
                discrete and self.model.action_std != "parameter",
                "--continuous-actions (VMAS, MPE), or drop --action-std (the agents' actions "
                "are discrete)",
            ),
        }
        for name, (bad, fix) in refused.items():
            if bad:
                value = {"algo": self.algo, "action_std": self.model.action_std,
                         "obs_scale": self.ppo.obs_scale}.get(name, True)  # fmt: skip
                raise ValueError(
                    f"TrainConfig: {name}={value!r} is not available with a multi-agent task "
                    f"({self.env.env!r}). Fix: {fix}."
                )

    def _check_ppo(self) -> None:
        n = self.env.num_envs
        steps, slice_len = self.ppo.frames_per_batch // n, self.ppo.slice_len
        if slice_len and steps % slice_len:
            raise ValueError(
                f"TrainConfig: slice_len={slice_len} does not divide the {steps} steps per env "
                f"row (frames_per_batch / num_envs). Fix: --slice-len a divisor of {steps}."
            )
        rows = n * (steps // slice_len) if slice_len else n
        if rows % self.ppo.num_minibatches:
            what = "slices" if slice_len else "env rows"
            raise ValueError(
                f"TrainConfig: the {rows} {what} of a batch do not split into "
                f"num_minibatches={self.ppo.num_minibatches} equal minibatches. Fix: "
                f"--num-minibatches a divisor of {rows}."
            )

    def _check_dqn(self) -> None:
        # A replayed slice never spans two collected rows (SliceSampler segments stop at row
        # ends), so a longer slice could only ever be a whole, shorter row.
        d = self.dqn
        steps = d.frames_per_batch // self.env.num_envs
        if d.sampler == "slice" and d.slice_len > steps:  # tapes join an episode's rows
            raise ValueError(
                f"TrainConfig: burn_in + train_len = {d.slice_len} is longer than the {steps} "
                f"steps per env row (frames_per_batch / num_envs). Fix: --frames-per-batch "
                f"{d.slice_len * self.env.num_envs} or a shorter --burn-in / --train-len."
            )
        if d.buffer_size < d.frames_per_batch:
            raise ValueError(
                f"TrainConfig: buffer_size={d.buffer_size} cannot hold one batch of "
                f"frames_per_batch={d.frames_per_batch}. Fix: --buffer-size "
                f"{d.frames_per_batch} or more."
            )

    def _check_action_space(self) -> None:
        if self.env.is_multiagent():
            self._check_multiagent()
            return
        import gymnasium

        env = gymnasium.make(self.env.gym_id())
        try:
            space = env.action_space
        finally:
            env.close()
        discrete = (gymnasium.spaces.Discrete, gymnasium.spaces.MultiDiscrete)
        if isinstance(space, discrete) and self.model.action_std != "parameter":
            raise ValueError(
                f"TrainConfig: action_std={self.model.action_std!r} applies to continuous "
                f"(Box) actions only; {self.env.env!r} has {space}. Fix: drop --action-std."
            )
        if isinstance(space, gymnasium.spaces.Discrete):
            return
        if isinstance(space, gymnasium.spaces.MultiDiscrete):
            self._check_multi_discrete(space)
            return
        if not isinstance(space, gymnasium.spaces.Box):
            raise ValueError(
                f"TrainConfig: algo {self.algo!r} needs a Discrete action space, or a "
                f"MultiDiscrete or Box one with ppo; {self.env.env!r} has {space}. Fix: pick "
                f"an env with such actions (e.g. CartPole-v1, Pendulum-v1)."
            )
        if self.algo != "ppo":
            raise ValueError(
                f"TrainConfig: algo {self.algo!r} needs a Discrete action space (one Q-value "
                f"per action); {self.env.env!r} has continuous actions {space}. Fix: --algo "
                f"ppo, or pick an env with discrete actions (e.g. CartPole-masked)."
            )
        import numpy as np

        low, high = np.asarray(space.low), np.asarray(space.high)
        if len(space.shape) != 1 or not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ValueError(
                f"TrainConfig: continuous actions must be a flat Box with finite bounds (the "
                f"policy squashes into [low, high]); {self.env.env!r} has {space}. Fix: wrap "
                f"the env (gymnasium.wrappers.RescaleAction for infinite bounds, a reshape for "
                f"a multi-dimensional Box) and register the wrapped env under a new id."
            )

    def _check_multi_discrete(self, space: Any) -> None:
        """PPO's factorized categorical policy needs a flat ``MultiDiscrete``; DQN cannot."""
        if self.algo != "ppo":
            raise ValueError(
                f"TrainConfig: algo {self.algo!r} needs a Discrete action space (one Q-value "
                f"per action); {self.env.env!r} has a MultiDiscrete action (nvec "
                f"{space.nvec.tolist()}: several discrete choices at once). Fix: --algo ppo (a "
                f"product of one categorical per action dimension), or pick an env with a "
                f"Discrete action space (e.g. CartPole-masked)."
            )
        if len(space.shape) != 1:
            raise ValueError(
                f"TrainConfig: MultiDiscrete actions must be flat (nvec of shape [K]; the "
                f"policy is one categorical per entry); {self.env.env!r} has a MultiDiscrete "
                f"of shape {space.shape} (nvec {space.nvec.tolist()}). Fix: flatten the action "
                f"space with a gymnasium wrapper and register the wrapped env under a new id."
            )

    # ------------------------------------------------------------------ (de)serialization
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready nested dict (what ``config.json`` holds)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, saved: bool = False) -> TrainConfig:
        """Rebuild (and validate) a config from :meth:`to_dict`'s output.

        Every entry must be a field of its section with a value of the field's type (JSON
        types: an int is accepted where a float is expected); missing entries take their
        defaults, except, with ``saved`` (a ``config.json`` of a run), the entries of
        :data:`SAVED_BEFORE`: a run written before such an option existed ran with the old
        value, not with today's default.

        Examples:
            >>> TrainConfig.from_dict({"model": {"hidden_size": "64"}})
            Traceback (most recent call last):
            ...
            ValueError: TrainConfig: model.hidden_size must be int, received '64' (str)...
        """
        check_entries(cls, data, "", nested=SECTIONS)
        if saved:
            data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
            for (section, name), value in SAVED_BEFORE.items():
                if isinstance(data.get(section), dict):
                    data[section].setdefault(name, value)
        kwargs: dict[str, Any] = {}
        for name, value in data.items():
            sub = SECTIONS.get(name)
            if sub is not None:
                check_entries(sub, value, f"{name}.")
            kwargs[name] = sub(**value) if sub is not None else value
        return cls(**kwargs)


#: Fields (``"section.name"``) that ``recurrl train --resume`` may change. Everything else
#: shapes the stored state (sizes, algorithm, env, seed) or is part of what the run is
#: (its hyperparameters, which config.json records for the whole run), so it must stay as
#: the run was started. ``frames`` may grow (the schedules stretch to the new length);
#: the rest only changes how the run is executed, watched or saved. ``run.run_dir`` is
#: where the run lies now (a moved directory resumes in its new place).
#: ``model.recurrent_backend`` changes float rounding only (every backend computes the same);
#: ``env.engine`` the envs' random stream only (both engines compute the same dynamics).
RESUMABLE: frozenset[str] = frozenset({
    "ppo.frames", "dqn.frames", "run.run_dir", "run.device", "run.checkpoint_every",
    "run.num_threads", "run.tensorboard", "run.plot", "run.eval_episodes", "run.quiet",
    "run.save_simulator", "run.ray_address", "model.recurrent_backend", "env.engine",
    "run.checkpoint_every_s", "run.max_restarts_per_minute", "run.resume_on_failure",
    "run.placement_timeout_s",
})  # fmt: skip


def resume_conflicts(saved: dict[str, Any], given: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The fields outside :data:`RESUMABLE` where ``given`` differs from ``saved``.

    Both are :meth:`TrainConfig.to_dict` data (``given``: the saved data with the options of
    the command line applied, not yet validated). Returns ``(name, saved value, given
    value)`` per field, ``name`` as ``"algo"`` or ``"section.field"``.

    Examples:
        >>> saved = TrainConfig().to_dict()
        >>> given = TrainConfig(
        ...     model=ModelConfig(hidden_size=32), ppo=PPOConfig(frames=60_000)
        ... ).to_dict()
        >>> resume_conflicts(saved, given)
        [('model.hidden_size', 64, 32)]
    """
    old, new = _flat(saved), _flat(given)
    return [
        (name, old.get(name), new.get(name))
        for name in [*new, *(n for n in old if n not in new)]
        if name not in RESUMABLE and old.get(name) != new.get(name)
    ]


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


#: the nested sections of :class:`TrainConfig` and their classes
SECTIONS: dict[str, type] = {
    "env": EnvConfig,
    "model": ModelConfig,
    "ppo": PPOConfig,
    "dqn": DQNConfig,
    "run": RunConfig,
}
