"""TorchEnv: the plumbing shared by recurrl's batched torch envs (counters, time limit, flags).

Every env of this package holds its state in tensors of batch ``[N]`` on one device and
steps all N envs in a few tensor ops. This base class does what they all share: the step
counter and time limit (``truncated``), the done flags, the refusal to step a finished env
that was not reset (as :class:`~recurrl.envs.GymVecEnv` does), the seeded generator, and
the TensorDicts handed to :class:`~recurrl.envs.EnvBase`. A task implements two hooks on
its own state tensors.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import torch
from tensordict import TensorDict, TensorDictBase

from recurrl.envs.common import EnvBase
from recurrl.envs.utils import count_true, get_reset_mask, tensordict_of_checked

__all__ = ["TorchEnv", "constants", "uniform"]


class TorchEnv(EnvBase):
    """Base of the batched torch envs: N envs of batch ``[N]``, stepped in tensor ops.

    A subclass sets its specs in ``__init__`` (after ``super().__init__``), allocates its
    state tensors, and implements:

    - ``_reset_envs(rows) -> observation``: draw new initial states for the envs
      ``rows`` (``[R]`` int64 indices, ``None``: every env) with :attr:`generator` (``R``
      draws, written with :meth:`_refill`), keep the others, and return the observation
      ``[N, *O]`` of every env (EnvBase keeps the current values of the envs not reset).
    - ``_advance(action) -> (observation, reward, terminated)``: one step of every env;
      ``reward`` ``[N, 1]`` float32, ``terminated`` ``[N]`` bool. :attr:`steps` still
      holds the number of steps taken before this one.

    ``truncated`` is ``steps >= max_episode_steps`` after the step (also where the step
    terminates, as gymnasium's ``TimeLimit`` does); ``done`` is ``terminated |
    truncated``. Stepping an env that is done and was not reset (or was never reset)
    raises ``RuntimeError``, as :class:`~recurrl.envs.GymVecEnv` does: reset it with
    ``td["_reset"] = td["done"]`` and ``env.reset(td)`` (``rollout`` and the collector do).
    On CUDA that check reads one flag tensor on the host at every step.

    Args:
        num_envs: number of envs ``N``.
        device: device of the state and of every tensor written (default cpu).
        seed: seed of :attr:`generator` (``None``: a random seed).
        max_episode_steps: truncate episodes after this many steps (``None``: the task's
            default, :attr:`default_max_episode_steps`).
    """

    #: The time limit when ``max_episode_steps`` is not given (``None``: no limit).
    default_max_episode_steps: ClassVar[int | None] = None
    #: The attributes a task keeps its envs' state in (tensors ``[N, ...]``, or lists of
    #: them), written only through :meth:`_put`; with the base class's own counters and the
    #: generator they are the whole simulator (:meth:`simulator_tensors`).
    state_names: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        num_envs: int,
        *,
        device: torch.device | str | None = None,
        seed: int | None = None,
        max_episode_steps: int | None = None,
    ) -> None:
        name = type(self).__name__
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"{name}: expected num_envs an int >= 1, received {num_envs!r}.")
        if max_episode_steps is None:
            max_episode_steps = self.default_max_episode_steps
        elif (
            isinstance(max_episode_steps, bool)
            or not isinstance(max_episode_steps, int)
            or (max_episode_steps < 1)
        ):
            raise ValueError(
                f"{name}: expected max_episode_steps an int >= 1 (or None for the default, "
                f"{self.default_max_episode_steps}), received {max_episode_steps!r}."
            )
        super().__init__(device=device if device is not None else "cpu", batch_size=(num_envs,))
        self.max_episode_steps = max_episode_steps
        #: The generator of every random draw of the env (initial states, decks).
        self.generator = torch.Generator(device=self.device)
        #: ``[N]`` int64: steps taken since each env's last reset.
        self.steps = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        # [N] bool: done at the last step (or never reset): may not be stepped
        self._needs_reset = torch.ones(num_envs, dtype=torch.bool, device=self.device)
        self._set_seed(seed)

    @property
    def num_envs(self) -> int:
        """Number of envs ``N`` (``batch_size[0]``)."""
        return self.batch_size[0]

    # --- the two hooks of a task ---------------------------------------------------------
    def _reset_envs(self, rows: torch.Tensor | None) -> torch.Tensor:
        """Draw new states for the envs ``rows`` (``None``: all); return every observation."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement _reset_envs(rows), one of the two hooks "
            f"of a TorchEnv task. Fix: define it (see the TorchEnv docstring)."
        )

    def _advance(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of every env: ``(observation, reward [N, 1], terminated [N])``."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement _advance(action), one of the two hooks "
            f"of a TorchEnv task. Fix: define it (see the TorchEnv docstring)."
        )

    # --- EnvBase hooks -------------------------------------------------------------------
    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        # EnvBase never passes an all-False mask, and turns an all-True one into None.
        mask = get_reset_mask(tensordict, self.batch_size)
        # Only the envs reset draw new states: their indices are read on the host (a sync
        # on CUDA, as EnvBase's own count of the mask), and R draws replace N.
        rows = None if mask is None else torch.nonzero(mask).flatten()
        observation = self._reset_envs(rows)
        steps, needs_reset = self.steps, self._needs_reset
        if rows is None:
            steps, needs_reset = torch.zeros_like(steps), torch.zeros_like(needs_reset)
        else:
            steps, needs_reset = steps.index_fill(0, rows, 0), needs_reset.index_fill(0, rows, 0)
        self._put(steps=steps, _needs_reset=needs_reset)
        flags = torch.zeros((3, self.num_envs, 1), dtype=torch.bool, device=self.device)
        terminated, truncated, done = flags.unbind(0)
        entries = {
            "observation": observation,
            "terminated": terminated,
            "truncated": truncated,
            "done": done,
        }
        return tensordict_of_checked(entries, self.batch_size, self.device)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if count_true(self._needs_reset):  # a host read of N flags (a sync on CUDA)
            stale = torch.nonzero(self._needs_reset).flatten().tolist()
            raise RuntimeError(
                f"{type(self).__name__}.step: env(s) {stale} are done (or were never reset) "
                f"and cannot be stepped. Fix: reset them with td['_reset'] = td['done'] and "
                f"env.reset(td) (rollout and the collector do), or call env.reset() first."
            )
        if type(tensordict) is TensorDict:  # get(str) of a plain TensorDict, directly
            action = tensordict._tensordict["action"]
        else:
            action = tensordict.get("action")
        if action.shape != self.action_spec.shape:  # broadcasting would mix the envs
            raise ValueError(
                f"{type(self).__name__}.step: expected an action of shape "
                f"{tuple(self.action_spec.shape)} ({type(self.action_spec).__name__}), "
                f"received {tuple(action.shape)}. Fix: sample it with env.rand_action(td), "
                f"or shape the policy's output like env.action_spec."
            )
        observation, reward, terminated = self._advance(action)
        steps = self.steps + 1
        if self.max_episode_steps is None:
            truncated = torch.zeros_like(terminated)
        else:
            truncated = steps >= self.max_episode_steps
        self._put(steps=steps, _needs_reset=terminated | truncated)
        terminated, truncated = terminated.unsqueeze(-1), truncated.unsqueeze(-1)
        entries = {
            "observation": observation,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "done": terminated | truncated,  # its own tensor: _needs_reset is never shared
        }
        return tensordict_of_checked(entries, self.batch_size, self.device)

    def _count(self, rows: torch.Tensor | None) -> int:
        """Number of envs ``rows`` names (``None``: every env)."""
        return self.num_envs if rows is None else int(rows.numel())

    @staticmethod
    def _refill(
        current: torch.Tensor, rows: torch.Tensor | None, fresh: torch.Tensor
    ) -> torch.Tensor:
        """``current`` with its rows ``rows`` replaced by ``fresh`` (``[R, ...]``), as a new
        tensor (``fresh`` itself when ``rows`` is ``None``)."""
        return fresh if rows is None else current.index_put((rows,), fresh)

    # --- the simulator as tensors (exact checkpoints without pickle) ---------------------
    def _state_entries(self) -> dict[str, torch.Tensor]:
        out = {}
        for name in ("steps", "_needs_reset", *self.state_names):
            value = getattr(self, name)
            if isinstance(value, list):
                out.update({f"{name}.{i}": v for i, v in enumerate(value)})
            else:
                out[name] = value
        return out

    def simulator_tensors(self) -> dict[str, torch.Tensor]:
        """The whole state of the envs as plain tensors (on the CPU): the task's state
        (:attr:`state_names`), the step counters, the finished flags and the generator.

        Unlike :meth:`GymVecEnv.simulator_state <recurrl.envs.GymVecEnv.simulator_state>`
        (a pickle), this loads with ``torch.load(weights_only=True)``: a checkpoint holding
        it resumes the interrupted episodes exactly without trusting the file.

        Examples:
            >>> from recurrl.envs import CartPoleEnv
            >>> env = CartPoleEnv(2, seed=0)
            >>> root = env.reset()
            >>> saved = env.simulator_tensors()
            >>> push_left = lambda td: td.set("action", torch.zeros(2, dtype=torch.int64))
            >>> a = env.rollout(3, push_left, auto_reset=False, tensordict=root.clone())
            >>> env.load_simulator_tensors(saved)  # back to the reset states
            >>> b = env.rollout(3, push_left, auto_reset=False, tensordict=root.clone())
            >>> torch.equal(a["next", "observation"], b["next", "observation"])
            True
        """
        out = {k: v.detach().to("cpu", copy=True) for k, v in self._state_entries().items()}
        out["generator"] = self.generator.get_state()
        return out

    def load_simulator_tensors(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what :meth:`simulator_tensors` returned (from an env of the same task,
        ``num_envs`` and difficulty); anything else raises ``ValueError`` naming the entry."""
        name = type(self).__name__
        current = self._state_entries()
        expected = {*current, "generator"}
        if set(state) != expected:
            raise ValueError(
                f"{name}.load_simulator_tensors: expected the entries {sorted(expected)}, "
                f"received {sorted(state)}. Fix: load a state saved from a {name} of the same "
                f"task and difficulty."
            )
        for key, now in current.items():
            value = state[key]
            if not isinstance(value, torch.Tensor) or (value.shape, value.dtype) != (
                now.shape,
                now.dtype,
            ):
                got = (
                    f"{tuple(value.shape)} {value.dtype}"
                    if isinstance(value, torch.Tensor)
                    else type(value).__name__
                )
                raise ValueError(
                    f"{name}.load_simulator_tensors: entry {key!r} must be {tuple(now.shape)} "
                    f"{now.dtype} (num_envs={self.num_envs}), received {got}. Fix: load a "
                    f"state saved from an env with the same num_envs."
                )
        loaded: dict[str, Any] = {}
        for key, value in state.items():
            if key == "generator":
                continue
            base, _, index = key.partition(".")
            value = value.to(self.device, copy=True)
            if index:
                loaded.setdefault(base, []).append((int(index), value))
            else:
                loaded[base] = value
        for key, value in loaded.items():
            if isinstance(value, list):
                loaded[key] = [v for _, v in sorted(value, key=lambda item: item[0])]
        self.generator.set_state(state["generator"])
        self._put(**loaded)

    def _put(self, **tensors: torch.Tensor) -> None:
        """Replace state tensors (plain attributes, never buffers). Written to the instance
        dict directly: ``nn.Module.__setattr__`` costs several µs per attribute, as much as
        a tensor op, at every step."""
        self.__dict__.update(tensors)

    def _set_seed(self, seed: int | None) -> None:
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def extra_repr(self) -> str:
        return f"num_envs={self.num_envs}, max_episode_steps={self.max_episode_steps}, " + (
            f"device={self.device}"
        )


def uniform(
    generator: torch.Generator,
    low: float | torch.Tensor,
    high: float | torch.Tensor,
    shape: tuple[int, ...],
    device: torch.device,
) -> torch.Tensor:
    """``shape`` float64 draws uniform in ``[low, high)`` from ``generator``."""
    draw = torch.rand(shape, generator=generator, dtype=torch.float64, device=device)
    return low + (high - low) * draw


def constants(device: torch.device, **values: float) -> SimpleNamespace:
    """The task's constants as 0-dim float64 tensors on ``device``.

    A Python number in a tensor op is wrapped into a new 0-dim tensor at every call (about
    1.5 µs on CPU, a third of a small op); the same values held as tensors give the same
    results (a float32 operand still computes in float32) for ~25% less time per step.

    Examples:
        >>> k = constants(torch.device("cpu"), tau=0.02)
        >>> k.tau * torch.ones(2, dtype=torch.float64)
        tensor([0.0200, 0.0200], dtype=torch.float64)
    """
    return SimpleNamespace(
        **{k: torch.tensor(v, dtype=torch.float64, device=device) for k, v in values.items()}
    )
