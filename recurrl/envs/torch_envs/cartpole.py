"""CartPoleEnv: gymnasium's CartPole-v1, N envs stepped together in tensor ops."""

from __future__ import annotations

import math

import torch

from recurrl.envs.specs import Bounded, Categorical, Composite
from recurrl.envs.torch_envs._base import TorchEnv, constants, uniform

__all__ = ["CartPoleEnv"]

# gymnasium.envs.classic_control.cartpole.CartPoleEnv's constants
GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_POLE + MASS_CART
LENGTH = 0.5  # half the pole's length
POLE_MASS_LENGTH = MASS_POLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02  # seconds between state updates
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
RESET_BOUND = 0.05


class CartPoleEnv(TorchEnv):
    """gymnasium's CartPole-v1 for N envs at once, on CPU or CUDA.

    The dynamics, constants, termination thresholds (``|x| > 2.4``, ``|theta| > 12°``),
    initial states (each entry uniform in ``[-0.05, 0.05)``) and rewards (1.0 at every step,
    the terminating one included) are gymnasium's ``CartPoleEnv`` (euler integrator);
    episodes are truncated after ``max_episode_steps`` (500, CartPole-v1's time limit).
    The state is computed in float64 with gymnasium's operations in gymnasium's order, and
    observed in float32: it is gymnasium's state bit for bit where torch's and numpy's
    ``cos`` / ``sin`` agree, within float64 rounding elsewhere
    (``tests/envs/torch_envs/test_cartpole.py``).
    Partial resets, seeding and finished envs follow :class:`~recurrl.envs.GymVecEnv` (see
    :mod:`recurrl.envs.torch_envs`).

    - observation ``"observation"``: ``[N, 4]`` float32 ``(x, x_dot, theta, theta_dot)``,
      spec bounds those of gymnasium's observation space;
    - action ``"action"``: ``Categorical(2)`` ``[N]``: 1 pushes the cart right, any other
      value left.

    Args:
        num_envs: number of envs ``N``.
        device: device of the state and of every tensor written (default cpu).
        seed: seed of the env's generator (initial states); ``None``: a random seed.
        max_episode_steps: time limit (default 500).
        policy: see :class:`~recurrl.envs.EnvBase` (a recurrent policy brings its
            ``InitTracker`` and primer).

    Attributes:
        state: ``[N, 4]`` float64, the simulator state (replaced, never written in place,
            by ``reset`` and ``step``; tests set it to gymnasium's).

    Examples:
        >>> env = CartPoleEnv(3, seed=0)
        >>> td = env.reset()
        >>> td["observation"].shape, bool(td["observation"].abs().max() <= 0.05)
        (torch.Size([3, 4]), True)
        >>> data = env.rollout(100, break_when_any_done=False)
        >>> data["next", "reward"].shape, bool(data["next", "done"].any())
        (torch.Size([3, 100, 1]), True)
    """

    default_max_episode_steps = 500
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
        high = torch.tensor(
            [X_THRESHOLD * 2, math.inf, THETA_THRESHOLD * 2, math.inf], dtype=torch.float32
        )
        self.observation_spec = Composite(
            observation=Bounded(-high, high, shape=(num_envs, 4)), shape=(num_envs,)
        )
        self.action_spec = Categorical(2, shape=(num_envs,))
        self.state = torch.zeros(num_envs, 4, dtype=torch.float64, device=self.device)
        self._k = constants(
            self.device,
            gravity=GRAVITY,
            mass_pole=MASS_POLE,
            total_mass=TOTAL_MASS,
            length=LENGTH,
            pole_mass_length=POLE_MASS_LENGTH,
            four_thirds=4.0 / 3.0,
            tau=TAU,
            push=FORCE_MAG,
            pull=-FORCE_MAG,
        )
        # |x| > 2.4 or |theta| > 12 degrees (gymnasium's four comparisons); velocities free
        f64 = {"dtype": torch.float64, "device": self.device}
        self._limits = torch.tensor([X_THRESHOLD, math.inf, THETA_THRESHOLD, math.inf], **f64)

    def _reset_envs(self, rows: torch.Tensor | None) -> torch.Tensor:
        shape = (self._count(rows), 4)
        fresh = uniform(self.generator, -RESET_BOUND, RESET_BOUND, shape, self.device)
        state = self._refill(self.state, rows, fresh)
        self._put(state=state)
        return state.to(torch.float32)

    def _advance(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k = self._k
        _, x_dot, theta, theta_dot = self.state.unbind(-1)
        force = torch.where(action == 1, k.push, k.pull)
        cos, sin = torch.cos(theta), torch.sin(theta)
        # gymnasium's operations in gymnasium's order: the same float64 rounding
        temp = (force + k.pole_mass_length * (theta_dot * theta_dot) * sin) / k.total_mass
        theta_acc = (k.gravity * sin - cos * temp) / (
            k.length * (k.four_thirds - k.mass_pole * (cos * cos) / k.total_mass)
        )
        x_acc = temp - k.pole_mass_length * theta_acc * cos / k.total_mass
        # euler: positions move with the old velocities
        state = self.state + k.tau * torch.stack((x_dot, x_acc, theta_dot, theta_acc), dim=-1)
        self._put(state=state)
        terminated = (state.abs() > self._limits).any(-1)
        reward = torch.ones(self.num_envs, 1, device=self.device)
        return state.to(torch.float32), reward, terminated
