"""Collector: run a policy in an env, carry the root TensorDict (hidden state included)
from step to step and from batch to batch, and yield fixed-size batches."""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from recurrl.collectors._background import BackgroundThread
from recurrl.collectors._policy_plan import plan_policy
from recurrl.collectors._stack import stack_plain
from recurrl.envs import EnvBase
from recurrl.envs._torchrl import refuse_torchrl_env
from recurrl.envs.transforms.from_module import (
    MissingPolicyTransformsError,
    register_policy_transforms,
)
from recurrl.envs.utils import count_true
from recurrl.modules import set_recurrent_mode

__all__ = ["Collector", "MissingPolicyTransformsError", "SyncDataCollector"]

TRAJ_KEY = ("collector", "traj_ids")
# Steps are stacked by chunks of this many as they come: a whole batch of per-step
# TensorDicts kept alive until its end made Python's cyclic garbage collector walk them
# (and, every few batches, the whole heap); chunks keep the live objects few. A batch of up
# to this many steps per env (the recipes' 50) is one chunk, stacked once: joining chunks
# copies every frame a second time, which with many envs cost as much as the stacking.
_CHUNK_STEPS = 64
Policy = Callable[[TensorDictBase], TensorDictBase | None]


class Collector:
    """Iterate over batches of ``frames_per_batch`` frames of ``policy`` acting in ``env``.

    Every step holds the root keys (observation, ``is_init``, recurrent state keys, action,
    policy outputs), the env's outcome under ``"next"`` and ``("collector", "traj_ids")``
    (int64 ``[*B]``): a globally unique id per trajectory, a new one exactly where a
    trajectory starts (``is_init`` True), kept across batches.

    Between steps the next root is built like ``env.rollout(break_when_any_done=False)``
    does: ``("next", k)`` is promoted to ``k`` for the env's observation / state / done keys
    (so the recurrent state rides along), and finished envs are reset through
    ``env.reset(td)`` with a ``"_reset"`` mask. The root is also carried from one batch to
    the next: trajectories continue across batches (unless ``reset_at_each_iter=True``).

    The policy runs in sequential mode (``set_recurrent_mode(False)``) under
    ``torch.no_grad()``, once per step.

    **Writing into a replay buffer.** With ``replay_buffer=rb`` the collector extends
    ``rb`` with every batch itself (the whole ``[*B, T]`` batch, exactly what iterating
    would have yielded: recurrent state keys, ``is_init`` and trajectory ids included), and
    iterating yields ``None`` once per batch. :meth:`start` does the same in a background
    thread until :meth:`async_shutdown` (or ``total_frames``), while the caller samples
    from ``rb``: recurrl's replay buffers lock ``extend`` and ``sample`` against each other.

    Args:
        env: an env (``batch_size`` ``[]`` or ``[N]``, e.g. a batched
            ``GymVecEnv(name, num_envs=N)``), or a callable taking no argument that builds one.
        policy: TensorDict -> TensorDict writing ``"action"`` (may return ``None`` after
            writing in place). ``None`` takes random actions (``action_spec.rand()``, torch's
            global RNG).

    Keyword Args:
        policy_factory: instead of ``policy``: a callable taking no argument that returns
            the policy, called once here, where the policy is needed (e.g. in each remote
            collector of a :class:`~recurrl.collectors.RayCollector` through its
            ``collector_kwargs``, so that each builds its own). Giving both raises
            ``TypeError``. :meth:`update_policy_weights_` without weights is then a no-op
            (the collector owns the policy it built).
        frames_per_batch: frames per yielded batch. Batches have batch size ``[T]`` for a
            single env and ``[N, T]`` for ``N`` envs, with ``T = frames_per_batch / N``
            (``frames_per_batch`` must be a multiple of ``N``).
        total_frames: stop after this many frames; ``-1`` (default) never stops. Rounded up
            to whole batches: ``ceil(total_frames / frames_per_batch)`` batches are yielded.
        device: device the policy runs on. The policy is used as is when its parameters are
            already there, else a copy is moved there (refresh it with
            :meth:`update_policy_weights_`). Root TensorDicts are moved between the env's
            device and this one around every policy call. ``None``: the policy as given.
        storing_device: device of the yielded batches (default: the env's device).
        auto_register_policy_transforms: when the policy holds recurrent modules and the env
            lacks an ``InitTracker`` or a primer for some state key, append exactly what is
            missing (a ``TransformedEnv`` is extended in place; another env is wrapped).
            With ``False`` the same situation raises :class:`MissingPolicyTransformsError`
            at construction (a ``ValueError`` and a ``KeyError``, naming the missing
            ``is_init`` / state keys).
        reset_at_each_iter: reset every env at the start of every batch.
        split_trajs: not supported (``True`` raises); use ``("collector", "traj_ids")``.
        init_random_frames: take random actions instead of the policy for the batches that
            start before this many frames were collected (whole batches). A recurrent
            module does not run on those steps: its state keys keep the primer's zeros.
        traj_id_offset: the first trajectory id handed out (default 0).
        traj_id_stride: the step between the trajectory ids handed out (default 1): the
            ``k``-th new trajectory gets ``traj_id_offset + traj_id_stride * k``. Collectors
            given the same stride ``S`` and distinct offsets ``0 <= s < S`` (as
            :class:`~recurrl.collectors.RayCollector` does) never share an id.
        replay_buffer: an object with ``extend(td)`` (e.g. a
            :class:`~recurrl.data.TensorDictReplayBuffer`) that the collector extends with
            every batch; iterating then yields ``None`` per batch, and :meth:`start` is
            allowed. :meth:`rollout` still returns the batch without writing it.
        extend_buffer: only ``True`` (the default, the reference's too): the buffer is
            extended with whole batches, row by row, so envs never interleave in it.
            ``False`` (the reference's deprecated per-step ``add``) raises ``ValueError``.

    Attributes:
        env: the env actually stepped (possibly a ``TransformedEnv`` wrapping the given one).
        policy: the policy actually called (the given one, or its copy on ``device``).

    Examples:
        >>> from tensordict.nn import TensorDictModule as Mod, TensorDictSequential as Seq
        >>> from torch import nn
        >>> from recurrl.modules import LSTMModule
        >>> from recurrl.testing import CountingEnv
        >>> lstm = LSTMModule(3, 8, in_keys=["observation", "rs_h", "rs_c"],
        ...                   out_keys=["features", ("next", "rs_h"), ("next", "rs_c")])
        >>> policy = Seq(lstm, Mod(nn.Linear(8, 2), in_keys=["features"], out_keys=["logits"]),
        ...              Mod(lambda x: x.argmax(-1), in_keys=["logits"], out_keys=["action"]))
        >>> collector = Collector(CountingEnv(batch_size=(2,), max_steps=3), policy,
        ...                       frames_per_batch=8, total_frames=16)
        >>> batches = list(collector)
        >>> [data.batch_size for data in batches]
        [torch.Size([2, 4]), torch.Size([2, 4])]
        >>> data = batches[1]  # steps 4..7: episodes of 3 steps start at step 6
        >>> data["is_init"].squeeze(-1)
        tensor([[False, False,  True, False],
                [False, False,  True, False]])
        >>> data["collector", "traj_ids"]
        tensor([[2, 2, 4, 4],
                [3, 3, 5, 5]])
        >>> collector.shutdown()
    """

    def __init__(
        self,
        env: EnvBase | Callable[[], EnvBase],
        policy: Policy | None = None,
        *,
        policy_factory: Callable[[], Policy] | None = None,
        frames_per_batch: int,
        total_frames: int = -1,
        device: torch.device | str | None = None,
        storing_device: torch.device | str | None = None,
        auto_register_policy_transforms: bool = True,
        reset_at_each_iter: bool = False,
        split_trajs: bool = False,
        init_random_frames: int | None = None,
        traj_id_offset: int = 0,
        traj_id_stride: int = 1,
        replay_buffer: Any = None,
        extend_buffer: bool = True,
    ) -> None:
        _check_traj_id_layout(traj_id_offset, traj_id_stride)
        _check_replay_buffer(replay_buffer, extend_buffer)
        if not isinstance(env, EnvBase):
            refuse_torchrl_env(env, "Collector")  # an nn.Module, callable: not a factory
            if not callable(env):
                raise TypeError(
                    f"Collector: expected an EnvBase or a callable returning one, received "
                    f"{type(env).__name__}. Fix: wrap gymnasium envs with recurrl.envs.GymEnv."
                )
            env = env()
            refuse_torchrl_env(env, "Collector (the env factory's result)")
            if not isinstance(env, EnvBase):
                raise TypeError(
                    f"Collector: the env factory returned {type(env).__name__}, expected an "
                    f"EnvBase."
                )
        if split_trajs:
            raise ValueError(
                "Collector: split_trajs=True is not supported. Batches keep the env layout "
                "[*B, T]; split them yourself with ('collector', 'traj_ids') (a new id at "
                "every is_init), or sample trajectory slices with a slice sampler."
            )
        batch = env.batch_size
        n_envs = batch.numel()
        if len(batch) > 1:
            raise ValueError(
                f"Collector: expected an env with batch_size [] or [N], received {list(batch)}."
            )
        if not isinstance(frames_per_batch, int) or frames_per_batch < 1:
            raise ValueError(
                f"Collector: expected frames_per_batch a positive int, received "
                f"{frames_per_batch!r}."
            )
        if frames_per_batch % n_envs:
            raise ValueError(
                f"Collector: frames_per_batch={frames_per_batch} is not a multiple of the "
                f"number of envs {n_envs} (env batch_size {list(batch)}); every env steps "
                f"the same number of times per batch. Fix: frames_per_batch="
                f"{max(1, frames_per_batch // n_envs) * n_envs}."
            )
        if total_frames != -1 and total_frames < 1:
            raise ValueError(
                f"Collector: expected total_frames >= 1 or -1 (endless), received {total_frames}."
            )
        own_policy = policy_factory is not None
        if own_policy:
            policy = _policy_from_factory(policy, policy_factory)
        self.env = register_policy_transforms(env, policy, auto=auto_register_policy_transforms)
        self.frames_per_batch = frames_per_batch
        self.total_frames = total_frames
        self.reset_at_each_iter = reset_at_each_iter
        self.init_random_frames = init_random_frames or 0
        self.device = None if device is None else torch.device(device)
        self.storing_device = torch.device(
            storing_device if storing_device is not None else self.env.device
        )
        self.policy = self._policy_on_device(policy, own=own_policy)
        self._given_policy = self.policy if own_policy else policy
        self._steps = frames_per_batch // n_envs
        self._time_dim = len(batch)
        self.frames = 0
        self._next_traj_id = 0  # how many ids were handed out (k)
        self.traj_id_offset = traj_id_offset
        self.traj_id_stride = traj_id_stride
        self._traj_ids: torch.Tensor | None = None
        self._root: TensorDictBase | None = None
        self._closed = False
        self.replay_buffer = replay_buffer
        self.extend_buffer = True
        # background collection (start / async_shutdown)
        self._background = BackgroundThread(type(self).__name__)
        # held around every policy call and every weight update: an update lands between
        # two steps of the background thread, never inside one
        self._policy_lock = threading.Lock()

    # --- policy --------------------------------------------------------------------------
    def _policy_on_device(self, policy: Policy | None, own: bool = False) -> Policy | None:
        """``policy`` on ``self.device``: moved there when the collector built it
        (``own``), else a copy when some of its tensors are elsewhere."""
        if self.device is None or not isinstance(policy, nn.Module):
            return policy
        if own:
            return policy.to(self.device)
        tensors = [*policy.parameters(), *policy.buffers()]
        if all(t.device == self.device for t in tensors):
            return policy
        return copy.deepcopy(policy).to(self.device)

    def update_policy_weights_(self, weights: TensorDictBase | dict | None = None) -> None:
        """Copy parameters into the collector's policy (in place, before the next step).

        Args:
            weights: a ``state_dict()`` or a TensorDict of parameters
                (``TensorDict.from_module(policy)``). ``None``: the given policy's own
                parameters, which is a no-op when the collector calls that policy itself
                (it shares them) and refreshes the copy made for another ``device``.

        While :meth:`start`'s thread runs, the copy happens between two of its steps.
        """
        self._raise_thread_error()
        with self._policy_lock:
            self._update_policy_weights(weights)

    def _update_policy_weights(self, weights: TensorDictBase | dict | None) -> None:
        if not isinstance(self.policy, nn.Module):
            if weights is not None:
                raise TypeError(
                    "Collector.update_policy_weights_: the policy is not an nn.Module, so "
                    "it has no weights to update."
                )
            return
        if weights is None:
            if self.policy is self._given_policy:
                return  # shares the parameters already
            weights = self._given_policy.state_dict()
        if isinstance(weights, TensorDictBase):
            target = TensorDict.from_module(self.policy)
            if target.keys(True, True) == weights.keys(True, True) and all(
                target.get(k) is weights.get(k) for k in target.keys(True, True)
            ):
                return
            with torch.no_grad():  # parameters are leaves that require grad
                target.update_(weights.to(self.device) if self.device else weights)
            return
        self.policy.load_state_dict(weights)

    # --- iteration -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[TensorDictBase | None]:
        while not self._finished():
            self._check_usable("iterating")
            data = self._rollout()
            if self.replay_buffer is None:
                yield data
            else:  # as the reference: the buffer gets the batch, the loop gets None
                self.replay_buffer.extend(data)
                yield None

    def _finished(self) -> bool:
        return self.total_frames != -1 and self.frames >= self.total_frames

    def __len__(self) -> int:
        if self.total_frames == -1:
            raise TypeError("Collector: an endless collector (total_frames=-1) has no len().")
        return math.ceil(self.total_frames / self.frames_per_batch)

    def _start(self) -> TensorDictBase:
        """Reset every env; every env starts a trajectory."""
        root = self.env.reset()
        self._new_ids(torch.ones(self.env.batch_size, dtype=torch.bool, device=root.device))
        return root

    def _new_ids(self, starts: torch.Tensor, count: int | None = None) -> None:
        """Give a new trajectory id to every env flagged in ``starts`` (``[*B]`` bool);
        ``count``, when known, is ``int(starts.sum())`` (saves a host read)."""
        if count is None:
            count = count_true(starts)
        ids = torch.arange(self._next_traj_id, self._next_traj_id + count, device=starts.device)
        if self.traj_id_stride != 1 or self.traj_id_offset:
            ids = ids * self.traj_id_stride + self.traj_id_offset
        if count == starts.numel():
            # every env starts: the ids in order, what the scatter below gives
            self._traj_ids = ids.reshape(starts.shape)
        else:
            if self._traj_ids is None:
                self._traj_ids = torch.full(
                    self.env.batch_size, -1, dtype=torch.int64, device=starts.device
                )
            self._traj_ids = self._traj_ids.masked_scatter(starts, ids)
        self._next_traj_id += count

    def _act(self, root: TensorDictBase, random: bool, policy: Policy | None) -> TensorDictBase:
        if random or policy is None:
            return self.env.rand_action(root)
        moved = self.device is not None and self.device != self.env.device
        td = root.to(self.device) if moved else root
        out = policy(td)
        if out is None:
            out = td
        elif not isinstance(out, TensorDictBase):
            raise TypeError(
                f"Collector: the policy must return a TensorDict (or None after writing in "
                f"place), received {type(out).__name__}."
            )
        return out.to(self.env.device) if moved else out

    def rollout(self) -> TensorDictBase:
        """Collect one batch (what iterating yields) and update the frame counter.

        The batch is returned, never written into ``replay_buffer`` (iterate, or
        :meth:`start`, for that).
        """
        self._check_usable("rollout()")
        return self._rollout()

    def _rollout(self) -> TensorDictBase:
        env = self.env
        if self._root is None or self.reset_at_each_iter:
            self._root = self._start()
        random = self.frames < self.init_random_frames
        # Step, next root and partial reset with their key bookkeeping planned once per
        # specs version (the same hooks as env.step / step_mdp / reset; see StepPlan).
        plan = env._step_plan()
        root = self._root
        steps: list[TensorDictBase] = []
        ids: list[torch.Tensor] = []
        chunks: list[TensorDictBase] = []
        # The usual policy composition called without tensordict's generic machinery (same
        # result; see _policy_plan), re-planned every batch in case the policy was edited.
        policy = plan_policy(self.policy) or self.policy
        lock = self._policy_lock
        # One context for the whole batch, not one per step (it costs a few us each time).
        with torch.no_grad(), set_recurrent_mode(False):
            for _ in range(self._steps):
                with lock:
                    acted = self._act(root, random, policy)
                td = plan.step(acted)
                steps.append(td)
                ids.append(self._traj_ids)
                done = plan.done(td)
                root = plan.next_root(td)
                # As env.rollout does: reset the finished envs; they get new ids. One host
                # read of how many serves the question, the reset and the ids.
                count = count_true(done)
                if count:
                    root = plan.reset(root, done, count)
                    self._new_ids(done, count)
                if len(steps) == _CHUNK_STEPS:
                    chunks.append(self._stack(steps, ids))
                    steps, ids = [], []
        if steps:
            chunks.append(self._stack(steps, ids))
        self._root = root
        self.frames += self.frames_per_batch
        out = chunks[0] if len(chunks) == 1 else self._join(chunks)
        return out.to(self.storing_device) if out.device != self.storing_device else out

    def _stack(self, steps: list[TensorDictBase], ids: list[torch.Tensor]) -> TensorDictBase:
        out = stack_plain(steps, self._time_dim)
        if out is not None:
            out.set(TRAJ_KEY, torch.stack(ids, dim=self._time_dim))
            return out
        try:
            out = torch.stack(steps, dim=self._time_dim)
        except RuntimeError as err:
            raise RuntimeError(
                "Collector: the steps of a batch hold different keys and cannot be stacked; "
                "a policy must write the same keys at every step."
            ) from err
        out.set(TRAJ_KEY, torch.stack(ids, dim=self._time_dim))
        return out

    def _join(self, chunks: list[TensorDictBase]) -> TensorDictBase:
        try:
            return torch.cat(chunks, dim=self._time_dim)
        except (RuntimeError, KeyError) as err:
            raise RuntimeError(
                "Collector: the steps of a batch hold different keys and cannot be stacked; "
                "a policy must write the same keys at every step."
            ) from err

    # --- seeding, state, shutdown --------------------------------------------------------
    def set_seed(self, seed: int | None) -> int | None:
        """Seed the env (applies from its next reset for gymnasium envs); returns ``seed``.

        Random actions use torch's global RNG: seed it with ``torch.manual_seed``.
        """
        self._refuse_while_running("set_seed()")
        return self.env.set_seed(seed)

    def state_dict(self) -> dict[str, Any]:
        """What a new collector needs to continue exactly where this one stands.

        Holds the frame counter, the trajectory-id counter (``next_traj_id``: how many ids
        were handed out, with ``traj_id_offset`` / ``traj_id_stride``) and the current ids,
        the carried root TensorDict (hidden states included), the env's ``state_dict()`` (its
        ``nn.Module`` buffers, e.g. of transforms) and the policy's ``state_dict()``.

        Limits: env state kept outside ``nn.Module`` buffers (a gymnasium simulator, a
        subprocess) cannot be saved; see :meth:`load_state_dict`. Torch's global RNG (random
        actions) is not saved.
        """
        self._refuse_while_running("state_dict()")
        policy = self.policy
        return {
            "frames": self.frames,
            "next_traj_id": self._next_traj_id,
            "traj_id_offset": self.traj_id_offset,
            "traj_id_stride": self.traj_id_stride,
            "traj_ids": None if self._traj_ids is None else self._traj_ids.clone(),
            "root": None if self._root is None else self._root.clone(),
            "env": self.env.state_dict(),
            "policy": policy.state_dict() if isinstance(policy, nn.Module) else None,
        }

    def load_state_dict(self, state_dict: dict[str, Any], *, env_restored: bool = False) -> None:
        """Continue from :meth:`state_dict` of another collector (same env and policy kinds).

        The carried root is restored only together with the env's state: a non-empty env
        ``state_dict`` (restored here), or ``env_restored=True`` when the caller has put the
        env back itself (e.g. ``GymEnv.load_simulator_state``). Otherwise the env cannot be put
        back where it was: the next batch starts with a reset, and trajectory ids go on
        from the saved counter (they stay globally unique). The id layout
        (``traj_id_offset`` / ``traj_id_stride``) is restored too; state dicts without it
        load as 0 / 1.
        """
        self._refuse_while_running("load_state_dict()")
        offset = int(state_dict.get("traj_id_offset", 0))
        stride = int(state_dict.get("traj_id_stride", 1))
        _check_traj_id_layout(offset, stride)
        self.frames = int(state_dict["frames"])
        self._next_traj_id = int(state_dict["next_traj_id"])
        self.traj_id_offset, self.traj_id_stride = offset, stride
        if state_dict.get("policy") is not None and isinstance(self.policy, nn.Module):
            self.policy.load_state_dict(state_dict["policy"])
        env_state = state_dict.get("env") or {}
        if (env_state or env_restored) and state_dict.get("root") is not None:
            if env_state:
                self.env.load_state_dict(env_state)
            self._root = state_dict["root"].clone()
            self._traj_ids = state_dict["traj_ids"].clone()
        else:
            self._root = None
            self._traj_ids = None

    def shutdown(self) -> None:
        """Close the env (and its worker processes, if any). Idempotent.

        With a subprocess env (``GymEnv(..., vectorization="async")``) it returns in bounded
        time even when a worker died or hangs: the workers are asked to close, then
        terminated, then killed (see :class:`~recurrl.envs.gym_vector.GymVecEnv`).
        A background thread (:meth:`start`) is stopped first (after its current batch), and
        an error it raised that was not reported yet is raised after the env is closed.
        """
        self._stop_thread(None)
        if not self._closed:
            self._closed = True
            self._root = None
            self.env.close()
        self._raise_thread_error()

    # --- background collection ------------------------------------------------------------
    def start(self) -> None:
        """Collect in a background thread, extending ``replay_buffer`` with every batch.

        The thread runs batch after batch (as iterating does) until :meth:`async_shutdown`
        or ``total_frames``; meanwhile the caller samples from the buffer (its ``extend``
        and ``sample`` take the buffer's lock; ``rb.write_count`` counts what was written)
        and trains. A no-op while the thread already runs. A thread still running when the
        program exits is stopped after its batch by an exit hook (which waits up to 30 s).

        **Weights.** The thread calls :attr:`policy`: the policy you passed (unless
        ``device=`` made a copy on another device), so parameters your optimizer updates in
        place are used from the thread's next step on, with nothing to call. Such in-place
        updates are not synchronized with the thread: a step taken while
        ``optimizer.step()`` writes may read some old and some new parameters (as in
        Hogwild-style training). :meth:`update_policy_weights_` is synchronized: it lands
        between two steps. The recurrent mode is per thread, so the learner may run the same
        policy in recurrent mode while the thread steps it in sequential mode.

        **Errors.** An exception raised in the thread (by the env, the policy or the
        buffer) ends the thread and is raised again, once, in the caller: by
        :meth:`async_shutdown` / :meth:`shutdown`, or before that by the next of
        :meth:`is_running`, :meth:`update_policy_weights_`, :meth:`start`,
        :meth:`rollout`, iteration, :meth:`state_dict`, :meth:`load_state_dict` or
        :meth:`set_seed`, whichever comes first (with a note saying it came from the
        thread). The collector cannot go on after it; shut it down.

        While the thread runs, :meth:`rollout`, iteration, :meth:`state_dict`,
        :meth:`load_state_dict` and :meth:`set_seed` are refused (they would use the env
        from two threads); ``async_shutdown(close_env=False)`` stops the thread and keeps
        the collector usable.

        Raises:
            RuntimeError: no ``replay_buffer`` was given, or the collector was shut down.

        Examples:
            >>> import time
            >>> from recurrl.data import LazyTensorStorage, ReplayBuffer
            >>> from recurrl.testing import CountingEnv
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(100))
            >>> collector = Collector(CountingEnv(batch_size=(2,), max_steps=3),
            ...                       frames_per_batch=8, total_frames=24, replay_buffer=rb)
            >>> collector.start()
            >>> while collector.is_running():  # here: until total_frames (3 batches)
            ...     time.sleep(0.01)
            >>> collector.async_shutdown()  # would stop it after its current batch
            >>> rb.write_count, collector.frames
            (24, 24)
        """
        self._check_usable("start()", running_ok=True)
        if self.replay_buffer is None:
            raise RuntimeError(
                "Collector.start: background collection writes into a replay buffer, and "
                "this collector has none. Fix: Collector(env, policy, frames_per_batch=..., "
                "replay_buffer=rb), then sample from rb while the thread collects."
            )
        self._background.start(self._background_step, self._finished)

    def _background_step(self) -> None:
        """One batch of the background thread, into the buffer."""
        self.replay_buffer.extend(self._rollout())

    def is_running(self) -> bool:
        """Whether :meth:`start`'s thread is collecting (``False`` once it finished
        ``total_frames`` or was stopped). Raises the thread's error if it failed (once)."""
        self._raise_thread_error()
        return self._background.is_alive()

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop :meth:`start`'s thread after its current batch, then shut down.

        Idempotent, and safe without :meth:`start` (then it is :meth:`shutdown`).

        Args:
            timeout: seconds to wait for the thread to finish its batch (``None``: as long
                as it takes). If it has not finished by then, ``TimeoutError`` is raised and
                the env is left open (the thread still steps it); call again to finish.
            close_env: ``True``: :meth:`shutdown` (close the env). ``False``: only stop
                the thread; the collector stays usable (iterate, or :meth:`start` again),
                and trajectories go on where the thread left them.

        Raises:
            Exception: the one the thread raised, if it failed and that was not reported
                yet (after the env is closed).
        """
        self._stop_thread(timeout)
        if close_env:
            self.shutdown()
        else:
            self._raise_thread_error()

    def _stop_thread(self, timeout: float | None) -> None:
        self._background.stop(timeout)

    def _raise_thread_error(self) -> None:
        """Raise the background thread's exception, the first time it is asked."""
        self._background.raise_error()

    @property
    def _thread(self) -> threading.Thread | None:
        """:meth:`start`'s thread (``None`` before it and after it was stopped)."""
        return self._background.thread

    @property
    def _thread_error(self) -> BaseException | None:
        return self._background.error

    def _refuse_while_running(self, what: str) -> None:
        self._raise_thread_error()
        if self._background.is_alive():
            raise RuntimeError(
                f"Collector: {what} while the background thread (start()) collects: it "
                f"would use the env from two threads. Fix: collector.async_shutdown("
                f"close_env=False) first (it stops the thread after its batch and keeps the "
                f"collector usable); sample the collected data from the replay buffer."
            )

    def _check_usable(self, what: str, running_ok: bool = False) -> None:
        if not running_ok:
            self._refuse_while_running(what)
        else:
            self._raise_thread_error()
        if self._thread_error is not None:
            raise RuntimeError(
                f"Collector: {what} after the background thread failed "
                f"({self._thread_error!r}, raised earlier): its batch stopped midway. Fix: "
                f"shut this collector down and build a new one."
            )
        if self._closed:
            raise RuntimeError(f"Collector: {what} after shutdown(); build a new one.")

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(env={type(self.env).__name__}(batch_size="
            f"{list(self.env.batch_size)}), frames_per_batch={self.frames_per_batch}, "
            f"total_frames={self.total_frames}, frames={self.frames})"
        )


#: The reference's older name of :class:`Collector` (the same class, not a subclass).
SyncDataCollector = Collector


def _policy_from_factory(policy: object, policy_factory: object) -> Policy:
    """The policy ``policy_factory()`` returns, checked (``policy`` must not be given)."""
    if policy is not None:
        raise TypeError(
            "Collector: policy and policy_factory are mutually exclusive, received both. Fix: "
            "pass policy_factory alone (each collector builds its policy) or policy alone."
        )
    if not callable(policy_factory):
        raise TypeError(
            f"Collector: expected policy_factory a callable taking no argument and returning "
            f"the policy, received {type(policy_factory).__name__}."
        )
    built = policy_factory()
    if not callable(built):
        raise TypeError(
            f"Collector: policy_factory() returned {type(built).__name__}, expected a policy "
            f"(a callable TensorDict -> TensorDict). For random actions pass neither policy "
            f"nor policy_factory."
        )
    return built


def _check_replay_buffer(replay_buffer: object, extend_buffer: object) -> None:
    if replay_buffer is not None and not callable(getattr(replay_buffer, "extend", None)):
        raise TypeError(
            f"Collector: expected replay_buffer an object with extend(td) (e.g. "
            f"recurrl.data.TensorDictReplayBuffer), received {type(replay_buffer).__name__}."
        )
    if extend_buffer is not True:
        raise ValueError(
            f"Collector: extend_buffer={extend_buffer!r} is not supported: the buffer is "
            f"always extended with whole batches, row by row, so that the steps of different "
            f"envs never interleave in it (the reference's per-step extend_buffer=False is "
            f"deprecated there). Fix: drop extend_buffer."
        )


def _check_traj_id_layout(offset: object, stride: object) -> None:
    """Trajectory ids ``offset + stride * k``: ``stride >= 1`` and ``0 <= offset < stride``
    (any ``offset >= 0`` with ``stride == 1``), so collectors with distinct offsets never clash."""
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(
            f"Collector: expected traj_id_stride an int >= 1, received {stride!r}. Fix: the "
            f"number of collectors sharing the id space (1 for a single collector)."
        )
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"Collector: expected traj_id_offset an int >= 0, received {offset!r}.")
    if stride > 1 and offset >= stride:
        raise ValueError(
            f"Collector: expected 0 <= traj_id_offset < traj_id_stride, received "
            f"traj_id_offset={offset}, traj_id_stride={stride}: with offset >= stride the "
            f"ids offset + stride * k would collide with those of the collector at offset "
            f"{offset % stride}. Fix: traj_id_offset={offset % stride}, or a larger stride."
        )
