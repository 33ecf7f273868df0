"""Env transforms: the Transform base, TransformedEnv, Compose, InitTracker, TensorDictPrimer."""

from recurrl.envs.transforms.init_tracker import InitTracker
from recurrl.envs.transforms.primer import TensorDictPrimer
from recurrl.envs.transforms.transform import Compose, Transform, TransformedEnv, find_transform

__all__ = [
    "Compose",
    "InitTracker",
    "TensorDictPrimer",
    "Transform",
    "TransformedEnv",
    "find_transform",
]
