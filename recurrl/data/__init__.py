"""Replay: storages, writers, samplers (random and trajectory slices) and replay buffers."""

from recurrl.data.replay_buffers import ReplayBuffer, TensorDictReplayBuffer
from recurrl.data.samplers import (
    RandomSampler,
    Sampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from recurrl.data.storages import LazyMemmapStorage, LazyTensorStorage, Storage
from recurrl.data.writers import RoundRobinWriter, Writer

__all__ = [
    "LazyMemmapStorage",
    "LazyTensorStorage",
    "RandomSampler",
    "ReplayBuffer",
    "RoundRobinWriter",
    "Sampler",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "Storage",
    "TensorDictReplayBuffer",
    "Writer",
]
