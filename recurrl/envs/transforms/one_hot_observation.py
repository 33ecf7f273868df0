"""OneHotObservation: a discrete observation (index or indices) as a float one-hot vector."""

from __future__ import annotations

import torch
from tensordict import NestedKey

from recurrl.envs.specs import Bounded, Categorical, MultiCategorical, TensorSpec
from recurrl.envs.transforms.observation import ObservationTransform

__all__ = ["OneHotObservation"]


class OneHotObservation(ObservationTransform):
    """Write a discrete observation as a float one-hot vector that networks can read.

    Gymnasium ``Discrete`` observations (a card's suit, a grid cell) become
    :class:`Categorical` indices ``[*B]``; an embedding-free MLP or RNN needs them as
    vectors. ``Categorical(n)`` becomes ``[*B, n]``; ``MultiCategorical(nvec)`` (last dim =
    ``K`` entries) becomes the ``K`` one-hot vectors concatenated, ``[*B, sum(nvec)]``.
    The spec becomes :class:`Bounded` in ``[0, 1]``.

    Args:
        in_key: the discrete observation.
        out_key: where to write the one-hot vector; ``None`` replaces ``in_key``.
        dtype: floating dtype of the output.

    Examples:
        >>> from recurrl.envs import GymEnv
        >>> from recurrl.envs.transforms import TransformedEnv
        >>> env = TransformedEnv(GymEnv("FrozenLake-v1", seed=0), OneHotObservation())
        >>> env.observation_spec["observation"].shape
        torch.Size([16])
        >>> env.reset()["observation"][:3]
        tensor([1., 0., 0.])
    """

    def __init__(
        self,
        in_key: NestedKey = "observation",
        out_key: NestedKey | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if not dtype.is_floating_point:
            raise ValueError(f"OneHotObservation: expected a floating dtype, received {dtype}.")
        super().__init__(in_key, out_key)
        self.dtype = dtype
        self.register_buffer("offsets", None)  # MultiCategorical: start of each entry
        self.size = 0

    def _apply_transform(self, observation: torch.Tensor) -> torch.Tensor:
        if self.size == 0:
            self._require_parent("encoding (the sizes come from the observation spec)")
            raise ValueError(
                "OneHotObservation: the sizes are unknown: the observation spec of the env "
                "was not read yet. Fix: read env.observation_spec (or env.reset()) first."
            )
        index = observation.long()
        if self.offsets is not None:  # MultiCategorical [*B, K] -> [*B, sum(nvec)]
            index = index + self.offsets.to(index.device)
        else:
            index = index.unsqueeze(-1)
        shape, device = (*index.shape[:-1], self.size), observation.device
        return torch.zeros(shape, dtype=self.dtype, device=device).scatter_(-1, index, 1.0)

    def _transform_spec(self, spec: TensorSpec) -> Bounded:
        if isinstance(spec, Categorical):
            self.size, self.offsets, batch = int(spec.n), None, spec.shape
        elif isinstance(spec, MultiCategorical):
            nvec = spec.nvec.expand(spec.shape).reshape(-1, spec.shape[-1])
            if not (nvec == nvec[0]).all():
                raise ValueError(
                    f"OneHotObservation: {self.in_key!r} has different counts per env; "
                    f"expected the same nvec for every batch entry."
                )
            self.size = int(nvec[0].sum())
            self.offsets = (torch.cumsum(nvec[0], 0) - nvec[0]).to(spec.device)
            batch = spec.shape[:-1]
        else:
            raise TypeError(
                f"OneHotObservation: cannot one-hot encode {self.in_key!r} with a "
                f"{type(spec).__name__} spec; supported: Categorical, MultiCategorical."
            )
        shape = (*batch, self.size)
        return Bounded(0.0, 1.0, shape=shape, device=spec.device, dtype=self.dtype)

    def extra_repr(self) -> str:
        return f"in_key={self.in_key!r}, out_key={self.out_key!r}, dtype={self.dtype}"
