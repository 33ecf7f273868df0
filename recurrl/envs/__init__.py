"""Environments on TensorDicts: specs, EnvBase, step_mdp, GymEnv and transforms."""

from recurrl.envs.common import EnvBase
from recurrl.envs.gym import GymEnv
from recurrl.envs.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    OneHot,
    TensorSpec,
    Unbounded,
)
from recurrl.envs.transforms import (
    Compose,
    InitTracker,
    TensorDictPrimer,
    Transform,
    TransformedEnv,
    find_transform,
)
from recurrl.envs.utils import step_mdp

__all__ = [
    "Binary",
    "Bounded",
    "Categorical",
    "Compose",
    "Composite",
    "EnvBase",
    "GymEnv",
    "InitTracker",
    "MultiCategorical",
    "OneHot",
    "TensorDictPrimer",
    "TensorSpec",
    "Transform",
    "TransformedEnv",
    "Unbounded",
    "find_transform",
    "step_mdp",
]
