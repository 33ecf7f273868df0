"""FlickerObservation: hide the whole observation on random steps (a partially observed env)."""

from __future__ import annotations

import torch
from tensordict import NestedKey

from recurrl.envs.specs import Bounded, TensorSpec
from recurrl.envs.transforms.observation import ObservationTransform

__all__ = ["FlickerObservation"]


class FlickerObservation(ObservationTransform):
    """Replace the observation by zeros with probability ``p``, drawn anew at every step for
    every env row (and every agent): a "flickering" env, the partially observed task of
    Hausknecht & Stone's recurrent Q-learning (2015), where a policy must carry what it saw
    across the steps it sees nothing.

    The draw covers every dim of ``in_key`` except its last ``feature_dims`` (the features):
    ``[*B, F]`` hides whole rows, ``[*B, n_agents, F]`` each agent's view on its own. The
    outputs of ``reset`` flicker too. The spec does not change (zero must lie inside it: a
    ``Bounded`` observation whose bounds exclude 0 is refused). The draws come from the
    transform's own generator, seeded by ``seed``, so a run is repeatable; they are not in a
    checkpoint (a resumed run draws anew).

    Args:
        p: probability of hiding an observation, ``0 <= p < 1``.
        in_key: the observation. Default ``"observation"``.
        out_key: where to write the result; ``None`` replaces ``in_key``.

    Keyword Args:
        feature_dims: trailing dims of ``in_key`` that one draw hides together. Default 1.
        seed: seed of the generator; ``None`` draws one from torch's global generator.

    Examples:
        >>> from recurrl.envs.transforms import TransformedEnv
        >>> from recurrl.testing import CountingEnv
        >>> env = TransformedEnv(CountingEnv(batch_size=(4,)), FlickerObservation(0.5, seed=0))
        >>> td = env.rollout(3)
        >>> td["next", "observation"].shape
        torch.Size([4, 3, 3])
        >>> bool(((td["next", "observation"] == 0).all(-1)).any())
        True
    """

    def __init__(
        self,
        p: float,
        in_key: NestedKey = "observation",
        out_key: NestedKey | None = None,
        *,
        feature_dims: int = 1,
        seed: int | None = None,
    ) -> None:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) < 1.0:
            raise ValueError(
                f"FlickerObservation: expected p, the probability of hiding an observation, "
                f"in [0, 1), received {p!r}. Fix: e.g. p=0.5 (p=1 would hide every step)."
            )
        if isinstance(feature_dims, bool) or not isinstance(feature_dims, int) or feature_dims < 0:
            raise ValueError(
                f"FlickerObservation: expected feature_dims an int >= 0 (trailing dims hidden "
                f"together), received {feature_dims!r}."
            )
        super().__init__(in_key, out_key)
        self.p = float(p)
        self.feature_dims = feature_dims
        self.seed = int(torch.randint(0, 2**62, ()).item()) if seed is None else int(seed)
        self._generator: torch.Generator | None = None

    def _draw(self, shape: torch.Size, device: torch.device) -> torch.Tensor:
        gen = self._generator
        if gen is None or gen.device != device:
            gen = torch.Generator(device=device)
            gen.manual_seed(self.seed)
            self._generator = gen
        return torch.rand(shape, generator=gen, device=device)

    def _apply_transform(self, observation: torch.Tensor) -> torch.Tensor:
        batch_dims = observation.ndim - self.feature_dims
        if batch_dims < 0:
            raise ValueError(
                f"FlickerObservation: {self.in_key!r} has {observation.ndim} dims, fewer than "
                f"feature_dims={self.feature_dims}. Fix: feature_dims <= {observation.ndim}."
            )
        shape = observation.shape[:batch_dims]
        shown = self._draw(shape, observation.device) >= self.p
        shown = shown.view(*shape, *([1] * self.feature_dims))
        return torch.where(shown, observation, torch.zeros((), dtype=observation.dtype,
                                                           device=observation.device))  # fmt: skip

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        if spec.ndim < self.feature_dims:
            raise ValueError(
                f"FlickerObservation: {self.in_key!r} of shape {tuple(spec.shape)} has fewer "
                f"dims than feature_dims={self.feature_dims}."
            )
        if isinstance(spec, Bounded) and bool(((spec.low > 0) | (spec.high < 0)).any()):
            raise ValueError(
                f"FlickerObservation: a hidden observation is zeros, but {self.in_key!r}'s "
                f"bounds exclude 0 (low {spec.low.min().item()}, high {spec.high.max().item()}). "
                f"Fix: shift the observation so that 0 is inside its bounds first."
            )
        return spec.clone()

    def extra_repr(self) -> str:
        return (
            f"p={self.p}, in_key={self.in_key!r}, out_key={self.out_key!r}, "
            f"feature_dims={self.feature_dims}, seed={self.seed}"
        )
