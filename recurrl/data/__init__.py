"""Replay: storages, writers, samplers (random and trajectory slices) and replay buffers.

``RayReplayBuffer`` (a replay buffer in a Ray actor; needs ``pip install "recurrl[ray]"``) is
imported on first use, so importing this package never imports Ray.
"""

from recurrl.data.replay_buffers import ReplayBuffer, TensorDictReplayBuffer
from recurrl.data.samplers import (
    PrioritizedSliceSampler,
    PrioritizedTapeSampler,
    RandomSampler,
    Sampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TapeSampler,
)
from recurrl.data.storages import LazyMemmapStorage, LazyTensorStorage, Storage
from recurrl.data.utils import find_start_stop_traj
from recurrl.data.writers import RoundRobinWriter, Writer

# RayReplayBuffer is exported lazily (module __getattr__, not in __all__): importing
# recurrl.data, or `from recurrl.data import *`, never imports Ray.
__all__ = [
    "LazyMemmapStorage",
    "LazyTensorStorage",
    "PrioritizedSliceSampler",
    "PrioritizedTapeSampler",
    "RandomSampler",
    "ReplayBuffer",
    "RoundRobinWriter",
    "Sampler",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "Storage",
    "TapeSampler",
    "TensorDictReplayBuffer",
    "Writer",
    "find_start_stop_traj",
]


def __getattr__(name: str):
    if name == "RayReplayBuffer":
        from recurrl.data import ray_buffer

        if ray_buffer.ray is None:
            raise ImportError(ray_buffer.MISSING_RAY)
        return ray_buffer.RayReplayBuffer
    raise AttributeError(f"module 'recurrl.data' has no attribute {name!r}")
