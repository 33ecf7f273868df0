"""Samplers: which stored steps a replay buffer returns."""

from recurrl.data.samplers.base import Sampler
from recurrl.data.samplers.prioritized_slice import PrioritizedSliceSampler
from recurrl.data.samplers.prioritized_tape import PrioritizedTapeSampler
from recurrl.data.samplers.random import RandomSampler
from recurrl.data.samplers.slice import SliceSampler
from recurrl.data.samplers.slice_without_replacement import SliceSamplerWithoutReplacement
from recurrl.data.samplers.tape import TapeSampler

__all__ = [
    "PrioritizedSliceSampler",
    "PrioritizedTapeSampler",
    "RandomSampler",
    "Sampler",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "TapeSampler",
]
