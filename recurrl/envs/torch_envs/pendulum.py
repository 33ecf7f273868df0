"""PendulumEnv: gymnasium's Pendulum-v1, N envs stepped together in tensor ops."""

from __future__ import annotations

import math

import torch

from recurrl.envs.specs import Bounded, Composite
from recurrl.envs.torch_envs._base import TorchEnv, constants, uniform

__all__ = ["PendulumEnv"]

# gymnasium.envs.classic_control.pendulum.PendulumEnv's constants (g=10.0, its default)
MAX_SPEED = 8.0
MAX_TORQUE = 2.0
DT = 0.05
G = 10.0
M = 1.0
L = 1.0
RESET_THETA = math.pi  # initial theta uniform in [-pi, pi), theta_dot in [-1, 1)
RESET_THETA_DOT = 1.0


class PendulumEnv(TorchEnv):
    """gymnasium's Pendulum-v1 for N envs at once, on CPU or CUDA.

    The dynamics, constants (``g = 10``), initial states, reward ``-(angle_normalize(th)**2
    + 0.1 * thdot**2 + 0.001 * u**2)`` (``u`` the torque clipped to ``[-2, 2]``) and the
    200-step time limit (``max_episode_steps``) are gymnasium's; episodes never terminate.
    The state ``(theta, theta_dot)`` is computed in float64, as gymnasium does; the torque
    terms in float32, as numpy computes them from gymnasium's float32 action. Observations
    and rewards are float32 and match gymnasium's to float32 rounding
    (``tests/envs/torch_envs/test_pendulum.py``).
    Partial resets, seeding and finished envs follow :class:`~recurrl.envs.GymVecEnv` (see
    :mod:`recurrl.envs.torch_envs`).

    - observation ``"observation"``: ``[N, 3]`` float32 ``(cos theta, sin theta,
      theta_dot)``, bounds ``[-1, -1, -8]`` to ``[1, 1, 8]``;
    - action ``"action"``: ``Bounded(-2, 2)`` ``[N, 1]`` float32 torque.

    Args:
        num_envs: number of envs ``N``.
        device: device of the state and of every tensor written (default cpu).
        seed: seed of the env's generator (initial states); ``None``: a random seed.
        max_episode_steps: time limit (default 200).
        policy: see :class:`~recurrl.envs.EnvBase`.

    Attributes:
        state: ``[N, 2]`` float64 ``(theta, theta_dot)`` (replaced, never written in place,
            by ``reset`` and ``step``; tests set it to gymnasium's).

    Examples:
        >>> env = PendulumEnv(2, seed=0)
        >>> env.action_spec
        Bounded(shape=(2, 1), dtype=torch.float32, device=cpu, low.min()=-2.0, high.max()=2.0)
        >>> data = env.rollout(200)
        >>> data["next", "truncated"][:, -1].squeeze(-1).tolist()
        [True, True]
        >>> bool((data["next", "reward"] <= 0).all())
        True
    """

    default_max_episode_steps = 200
    state_names = ("state",)

    def __init__(
        self,
        num_envs: int,
        *,
        device: torch.device | str | None = None,
        seed: int | None = None,
        max_episode_steps: int | None = None,
    ) -> None:
        super().__init__(num_envs, device=device, seed=seed, max_episode_steps=max_episode_steps)
        high = torch.tensor([1.0, 1.0, MAX_SPEED], dtype=torch.float32)
        self.observation_spec = Composite(
            observation=Bounded(-high, high, shape=(num_envs, 3)), shape=(num_envs,)
        )
        self.action_spec = Bounded(-MAX_TORQUE, MAX_TORQUE, shape=(num_envs, 1))
        self._reset_high = torch.tensor(
            [RESET_THETA, RESET_THETA_DOT], dtype=torch.float64, device=self.device
        )
        self.state = torch.zeros(num_envs, 2, dtype=torch.float64, device=self.device)
        self._k = constants(
            self.device,
            pi=math.pi,
            two_pi=2 * math.pi,
            speed_cost=0.1,
            torque_cost=0.001,
            gravity_gain=3 * G / (2 * L),
            torque_gain=3.0 / (M * L**2),
            dt=DT,
        )

    def _observation(self) -> torch.Tensor:
        theta, theta_dot = self.state.unbind(-1)
        return torch.stack((torch.cos(theta), torch.sin(theta), theta_dot), -1).to(torch.float32)

    def _reset_envs(self, rows: torch.Tensor | None) -> torch.Tensor:
        high = self._reset_high
        fresh = uniform(self.generator, -high, high, (self._count(rows), 2), self.device)
        self._put(state=self._refill(self.state, rows, fresh))
        return self._observation()

    def _advance(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k = self._k
        theta, theta_dot = self.state.unbind(-1)
        u = action.to(torch.float32).reshape(self.num_envs).clamp(-MAX_TORQUE, MAX_TORQUE)
        angle = torch.remainder(theta + k.pi, k.two_pi) - k.pi
        # numpy computes the terms of gymnasium's float32 torque in float32: 0.001 * u**2
        # and 3.0 * u (a float64 0-dim tensor times a float32 tensor is a float32 op)
        costs = angle * angle + k.speed_cost * (theta_dot * theta_dot)
        costs = costs + (k.torque_cost * (u * u)).double()
        accel = k.gravity_gain * torch.sin(theta) + (k.torque_gain * u).double()
        theta_dot = (theta_dot + accel * k.dt).clamp(-MAX_SPEED, MAX_SPEED)
        theta = theta + theta_dot * k.dt
        self._put(state=torch.stack((theta, theta_dot), -1))
        reward = (-costs).to(torch.float32).unsqueeze(-1)
        terminated = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        return self._observation(), reward, terminated
