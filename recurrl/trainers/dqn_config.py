"""The recurrent DQN section of a training run's configuration (``recurrl train --algo dqn``).

Part of :class:`~recurrl.trainers.config.TrainConfig` (importable from there too); the
command line's DQN options and their ``--help`` texts are generated from its fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from recurrl.trainers._config_checks import check_frames, finite, positive

__all__ = ["DQNConfig"]

#: ``DQNConfig.burn_in`` when it is None and the sampler is ``"slice"``
DEFAULT_BURN_IN = 10
#: ``priority_uniform_mix`` of a prioritized run when none is given: half of each draw's
#: probability uniform. Measured paired on CartPole-masked (benchmarks/learning/README.md):
#: the GRU loses seeds at alpha 0.6 alone (13/30 against 19/30 for its alpha-0 control) and
#: keeps them with the mix (23/30); the LSTM is within noise either way (8/10 and 9/10
#: against 7/10; 25/30 against uniform's 27/30 with --replay-seed).
DEFAULT_PRIORITY_UNIFORM_MIX = 0.5


@dataclass
class DQNConfig:
    """Recurrent DQN (R2D2-style): replayed slices with burn-in, double DQN, target network.

    Each batch: epsilon-greedy collection of frames_per_batch frames into the replay buffer,
    then updates_per_batch updates (5-step double-DQN targets, rewards scaled by 0.1,
    observations standardized with the warm-up statistics) on num_tapes tapes of tape_frames
    steps, whole stored episodes laid end to end from their exact zero start state
    (sampler=tape, what sampler=auto picks), or on num_slices slices of up to
    burn_in + train_len steps from the stored states (sampler=slice, R2D2's replay, which
    auto picks when a slice-only option is set: burn_in > 0, burn_in_stop_gradient or
    slice_start). With prioritized, episodes (tape) or slices are drawn by priority. On
    CartPole-masked, 100k frames give a greedy return >= 450 with the LSTM and the GRU; see
    ``benchmarks/learning/README.md`` for the figures per seed and what was tried.

    Examples:
        >>> DQNConfig().sampler, DQNConfig().burn_in
        ('tape', 0)
        >>> cfg = DQNConfig(burn_in_stop_gradient=True)
        >>> cfg.sampler, cfg.burn_in
        ('slice', 10)
        >>> DQNConfig(prioritized=True).sampler  # episodes drawn by priority
        'tape'
    """

    frames: int = 100_000
    """Total env frames to train for: a multiple of frames_per_batch when that is given,
    else rounded up to a whole number of batches."""
    frames_per_batch: int | None = None
    """Frames collected per batch (num_envs rows of frames_per_batch / num_envs steps). None:
    num_envs x steps_per_env (400 with the default 8 envs)."""
    steps_per_env: int = 50
    """Steps every env takes per batch when frames_per_batch is None."""
    buffer_size: int = 50_000
    """Replay buffer capacity in frames."""
    learning_starts: int = 2_000
    """Frames collected before the first update."""
    updates_per_batch: int = 8
    """Gradient steps after each collected batch."""
    num_slices: int = 64
    """Slices per update (sequences of up to burn_in + train_len steps; a slice may start at
    any stored step with more than burn_in steps left in its episode)."""
    burn_in: int | None = None
    """Steps at the start of every slice that only warm the stored hidden state up (no loss).
    Unset (None): 10 with sampler=slice, 0 with sampler=tape (which takes no burn-in)."""
    train_len: int = 20
    """Steps of every slice that enter the loss (after the burn-in)."""
    lr: float = 1e-3
    """Adam learning rate."""
    anneal_lr: bool = False
    """Decay the learning rate linearly to 0 over `frames` (off in the measured recipe)."""
    obs_norm: bool = True
    """Standardize each observation entry with the mean and std of the learning_starts
    warm-up frames (nearly random policy), frozen afterwards and saved with the model."""
    obs_scale: float = 1.0
    """Multiply the (normalized) observations by this before the Q-network."""
    gamma: float = 0.99
    """Discount factor."""
    n_steps: int = 5
    """Multi-step TD target: rewards of this many steps, then the target network's value
    (fewer steps where a slice or episode ends first)."""
    reward_scale: float = 0.1
    """Multiply rewards by this in the loss (smaller Q-values; logged returns are
    unscaled)."""
    double_dqn: bool = True
    """Double DQN: the online network picks the next action, the target network values it."""
    loss_function: Literal["smooth_l1", "l2", "l1"] = "smooth_l1"
    """TD error penalty: smooth_l1 (Huber), l2 or l1."""
    target_update: Literal["soft", "hard"] = "soft"
    """Target network sync: soft (Polyak, tau per update) or hard (copy every
    hard_update_interval updates)."""
    # 0.02 since 2026-11-27 (the target follows over about 50 updates): measured on
    # CartPole-masked against 0.01 and 0.005, which learn slower and lose seeds within the
    # 100k-frame budget (benchmarks/learning/README.md).
    tau: float = 0.02
    """Polyak weight of the online network with target_update=soft (0.01 before 2026-11-27:
    ``--tau 0.01`` reproduces earlier runs)."""
    hard_update_interval: int = 250
    """Updates between target copies with target_update=hard."""
    eps_start: float = 1.0
    """Epsilon of epsilon-greedy exploration at the start."""
    eps_end: float = 0.05
    """Epsilon after eps_frames frames (kept until the end)."""
    eps_frames: int = 20_000
    """Frames over which epsilon decays linearly from eps_start to eps_end."""
    epsilon_schedule: Literal["decay", "apex"] = "decay"
    """decay: every actor acts with one epsilon, decayed from eps_start to eps_end; apex: a
    constant epsilon per actor, apex_epsilon ** (1 + apex_alpha * i / (N - 1)) for actor i
    of N (Ape-X, R2D2). The actors are the Ray workers with --collector ray (all envs of a
    worker share its epsilon), the envs of the vector env with the local collector."""
    apex_epsilon: float = 0.4
    """With epsilon_schedule=apex: the epsilon of actor 0 (the most exploring one)."""
    apex_alpha: float = 7.0
    """With epsilon_schedule=apex: the exponent spread; the last actor acts with
    apex_epsilon ** (1 + apex_alpha)."""
    max_grad_norm: float = 10.0
    """Clip the global gradient norm to this value (0 disables)."""
    prioritized: bool = False
    """Prioritized replay: the replayed sequences (whole episodes with sampler=tape, slices
    with sampler=slice as in R2D2) drawn by priority, losses weighted by importance weights,
    priorities set from each sequence's TD errors after every update (off: uniform draws,
    the measured recipe)."""
    priority_alpha: float = 0.6
    """With prioritized: priority exponent, P(sequence) ~ priority^alpha (0: uniform; 0.6 as
    prioritized replay and Ape-X, R2D2 used 0.9)."""
    priority_beta: float = 0.4
    """With prioritized: importance-weight exponent at the start, annealed linearly to 1
    over `frames` (prioritized replay's 0.4 -> 1)."""
    priority_eta: float = 0.9
    """With prioritized: a sequence's priority is eta * max + (1 - eta) * mean of the |TD
    errors| of its steps in the loss (R2D2's 0.9; burn-in steps do not count)."""
    priority_weight_norm: Literal["global", "batch"] = "global"
    """With prioritized: what the importance weights are divided by so that they are <= 1:
    global, the weight of the least likely stored sequence (prioritized replay's
    max_i w_i); batch, the largest weight in the sample. One stored sequence of near-zero
    priority makes every global weight near 0 (the updates shrink with it); batch keeps the
    sample's largest at 1."""
    priority_uniform_mix: float | None = None
    """With prioritized: the share of each draw's probability spread evenly over the stored
    sequences, P = (1 - u) priority^alpha / sum + u / N (0: by priority alone; 1: uniform
    draws). It bounds how strongly draws favour new (never replayed, highest-priority)
    sequences and how small an importance weight gets. None: 0.5 with prioritized (the
    setting measured to keep uniform replay's result for both the LSTM and the GRU, where
    the GRU loses seeds with 0), 0 without."""
    burn_in_stop_gradient: bool = False
    """R2D2's stop-gradient: no gradient flows back into the burn-in steps through the hidden
    state (one more forward pass per update; off: they get gradients from later steps)."""
    value_rescale: bool = False
    """R2D2's value rescaling: Q-values regress h(return), targets h(rewards + gamma^n
    h^-1(Q')) with h(x) = sign(x)(sqrt(|x| + 1) - 1) + 0.001 x."""
    sampler: Literal["auto", "slice", "tape"] = "auto"
    """Replay batches: tape (num_tapes tapes of tape_frames steps: whole stored episodes laid
    end to end, each from its exact zero initial state, so no burn-in), slice (num_slices
    slices of burn_in + train_len steps from the stored states, burned in; R2D2's replay) or
    auto: slice when a slice-only option is set (burn_in > 0, burn_in_stop_gradient,
    slice_start other than any), tape otherwise (the measured recipe). With tape the slice
    options (num_slices, train_len, slice_start) are not used and burn-in and
    burn_in_stop_gradient are refused (prioritized draws whole episodes by priority,
    PrioritizedTapeSampler, and takes no tape_weight); an episode longer than tape_frames
    is cut (its later steps are never replayed: the run warns once, raise tape_frames or use
    slice)."""
    tape_frames: int = 960
    """With sampler=tape: steps per tape (about 2x CartPole's 500-step episode cap; with
    num_tapes=2 the 1920 steps of the slice default, 64 slices x 30 steps, per update). An
    episode that does not fit is cut there (marked truncated, bootstrapped); steps of an
    episode longer than a tape past its first tape_frames are never trained on."""
    num_tapes: int = 2
    """With sampler=tape: tapes per update (one row each, recurrent mode along it)."""
    tape_weight: Literal["uniform", "length"] = "uniform"
    """With sampler=tape: draw stored episodes uniformly (every complete episode alike) or
    by length (every stored step alike); with prioritized, by priority (uniform only)."""
    slice_start: Literal["any", "trajectory", "stride"] = "any"
    """Where a replayed slice may start in a stored trajectory piece: any step, its first
    step only, or every (burn_in + train_len) // 2 steps (R2D2's half-overlapping
    sequences); see SliceSampler(start=)."""
    replay_seed: int | None = None
    """Seed of the replay sampler's own random generator (default: none, the sampler draws
    from torch's global stream, as the network init and the exploration do, so two runs of
    one seed whose replay differs, uniform or prioritized draws or another sampler, also
    differ in their exploration noise). With it the sampler leaves that stream alone: such
    runs share their init and exploration noise and differ only through their draws (a
    paired comparison). Saved in checkpoints with the sampler's state."""

    def __post_init__(self) -> None:
        if self.sampler == "auto":
            self.sampler = "slice" if self._slice_options() else "tape"
        if self.burn_in is None:
            self.burn_in = 0 if self.sampler == "tape" else DEFAULT_BURN_IN
        if self.priority_uniform_mix is None:
            self.priority_uniform_mix = DEFAULT_PRIORITY_UNIFORM_MIX if self.prioritized else 0.0
        finite(self)
        positive(
            "DQNConfig", frames=self.frames, steps_per_env=self.steps_per_env,
            buffer_size=self.buffer_size, updates_per_batch=self.updates_per_batch,
            num_slices=self.num_slices, train_len=self.train_len, eps_frames=self.eps_frames,
            hard_update_interval=self.hard_update_interval, n_steps=self.n_steps,
            tape_frames=self.tape_frames, num_tapes=self.num_tapes,
        )  # fmt: skip
        if self.frames_per_batch is not None:
            positive("DQNConfig", frames_per_batch=self.frames_per_batch)
            check_frames("DQNConfig", self.frames, self.frames_per_batch)
        if self.burn_in < 0 or self.learning_starts < 0:
            raise ValueError(
                f"DQNConfig: burn_in and learning_starts must be >= 0, received "
                f"burn_in={self.burn_in}, learning_starts={self.learning_starts}."
            )
        for name in ("gamma", "eps_start", "eps_end", "priority_beta", "priority_eta"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(
                    f"DQNConfig: {name} must be in [0, 1], received {getattr(self, name)}."
                )
        if self.obs_scale <= 0 or self.reward_scale <= 0:
            raise ValueError(
                f"DQNConfig: obs_scale and reward_scale must be > 0 (1 leaves the values "
                f"unchanged), received obs_scale={self.obs_scale}, "
                f"reward_scale={self.reward_scale}."
            )
        if self.lr <= 0 or not 0.0 < self.tau <= 1.0 or self.max_grad_norm < 0:
            raise ValueError(
                f"DQNConfig: lr must be > 0, tau in (0, 1] and max_grad_norm >= 0, received "
                f"lr={self.lr}, tau={self.tau}, max_grad_norm={self.max_grad_norm}."
            )
        if self.loss_function not in ("smooth_l1", "l2", "l1"):
            raise ValueError(
                f"DQNConfig: loss_function must be smooth_l1, l2 or l1, received "
                f"{self.loss_function!r}."
            )
        if self.target_update not in ("soft", "hard"):
            raise ValueError(
                f"DQNConfig: target_update must be soft or hard, received {self.target_update!r}."
            )
        self._check_replay()

    def _check_replay(self) -> None:
        seed = self.replay_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(
                f"DQNConfig: replay_seed must be an int >= 0 (or None: the global stream), "
                f"received {seed!r}. Fix: --replay-seed 0."
            )
        if self.priority_weight_norm not in ("global", "batch"):
            raise ValueError(
                f"DQNConfig: priority_weight_norm must be global or batch, received "
                f"{self.priority_weight_norm!r}. Fix: --priority-weight-norm batch."
            )
        mix = self.priority_uniform_mix
        if isinstance(mix, bool) or not isinstance(mix, (int, float)) or not 0 <= mix <= 1:
            raise ValueError(
                f"DQNConfig: priority_uniform_mix must be in [0, 1] (the share of uniform "
                f"draws), received {mix!r}. Fix: --priority-uniform-mix 0.5."
            )
        if mix > 0 and not self.prioritized:
            raise ValueError(
                f"DQNConfig: priority_uniform_mix={mix} mixes uniform into prioritized draws, "
                "but prioritized is off (draws are uniform already). Fix: add --prioritized, "
                "or drop --priority-uniform-mix."
            )
        if self.priority_alpha < 0:
            raise ValueError(
                f"DQNConfig: priority_alpha must be >= 0 (0: uniform), received "
                f"{self.priority_alpha}. Fix: --priority-alpha 0.6."
            )
        if self.epsilon_schedule not in ("decay", "apex"):
            raise ValueError(
                f"DQNConfig: epsilon_schedule must be decay or apex, received "
                f"{self.epsilon_schedule!r}. Fix: --epsilon-schedule apex for per-actor epsilons."
            )
        if not 0.0 < self.apex_epsilon <= 1.0 or self.apex_alpha < 0:
            raise ValueError(
                f"DQNConfig: apex_epsilon must be in (0, 1] and apex_alpha >= 0, received "
                f"apex_epsilon={self.apex_epsilon}, apex_alpha={self.apex_alpha}. Fix: "
                f"--apex-epsilon 0.4 --apex-alpha 7 (Ape-X's values)."
            )
        if self.slice_start not in ("any", "trajectory", "stride"):
            raise ValueError(
                f"DQNConfig: slice_start must be any, trajectory or stride, received "
                f"{self.slice_start!r}."
            )
        self._check_tape()

    def _check_tape(self) -> None:
        """``sampler``: a known one; with tape, none of the slice-only options set."""
        if self.sampler not in ("slice", "tape"):
            raise ValueError(
                f"DQNConfig: sampler must be auto, slice or tape, received {self.sampler!r}. "
                "Fix: --sampler tape for whole episodes end to end, --sampler slice for "
                "R2D2's slices, or drop --sampler."
            )
        if self.tape_weight not in ("uniform", "length"):
            raise ValueError(
                f"DQNConfig: tape_weight must be uniform or length, received "
                f"{self.tape_weight!r}. Fix: --tape-weight uniform."
            )
        if self.sampler != "tape":
            return
        if self.prioritized and self.tape_weight != "uniform":
            raise ValueError(
                f"DQNConfig: prioritized tapes draw episodes by priority, received "
                f"tape_weight={self.tape_weight!r} as well. Fix: drop --tape-weight, or drop "
                "--prioritized."
            )
        # options that only mean something for slices: refused rather than ignored
        given = self._slice_options()
        if given:
            received = ", ".join(f"{flag} {value}" if value is not True else flag
                                 for flag, value in given.items())  # fmt: skip
            raise ValueError(
                f"DQNConfig: sampler=tape expects no burn-in and whole episodes (tapes start "
                f"every episode from its exact zero state and hold no slices), received "
                f"{received}. Fix: drop {' and '.join(given)}, or --sampler slice."
            )

    def _slice_options(self) -> dict[str, Any]:
        """The slice-only options set, as ``{flag: value}`` (``True`` for a switch)."""
        given = {
            "--burn-in": self.burn_in if self.burn_in else None,
            "--burn-in-stop-gradient": True if self.burn_in_stop_gradient else None,
            "--slice-start": self.slice_start if self.slice_start != "any" else None,
        }  # fmt: skip
        return {flag: value for flag, value in given.items() if value is not None}

    @property
    def slice_len(self) -> int:
        """Steps per replayed slice: ``burn_in + train_len``."""
        assert self.burn_in is not None  # resolved in __post_init__
        return self.burn_in + self.train_len

    @property
    def batch_steps(self) -> int:
        """Steps per replayed batch: ``num_slices * slice_len``, or with ``sampler="tape"``
        ``num_tapes * tape_frames``."""
        if self.sampler == "tape":
            return self.num_tapes * self.tape_frames
        return self.num_slices * self.slice_len
