"""A fake pixel observation for transform tests: no renderer, deterministic, any batch."""

import torch

from recurrl.envs import Bounded, Transform

HEIGHT, WIDTH = 6, 8


class FakePixels(Transform):
    """Writes ``"pixels"``, a uint8 ``[*B, 6, 8, 3]`` image computed from the observation
    (``[*B, F]``), on reset and step: different steps give different images."""

    def __init__(self) -> None:
        super().__init__(in_keys=["observation"], out_keys=["pixels"])

    @staticmethod
    def image(observation: torch.Tensor) -> torch.Tensor:
        base = (observation.abs().sum(-1) * 37).long()
        pattern = torch.arange(HEIGHT * WIDTH * 3, device=observation.device)
        pattern = pattern.reshape(HEIGHT, WIDTH, 3)
        return ((base[..., None, None, None] + 5 * pattern) % 256).to(torch.uint8)

    def _reset(self, tensordict, tensordict_reset):
        tensordict_reset.set("pixels", self.image(tensordict_reset["observation"]))
        return tensordict_reset

    def _step(self, tensordict, next_tensordict):
        next_tensordict.set("pixels", self.image(next_tensordict["observation"]))
        return next_tensordict

    def transform_observation_spec(self, observation_spec):
        obs = observation_spec["observation"]
        shape = (*obs.shape[:-1], HEIGHT, WIDTH, 3)
        observation_spec["pixels"] = Bounded(
            0, 255, shape=shape, dtype=torch.uint8, device=obs.device
        )
        return observation_spec
