"""Environments on TensorDicts: specs, EnvBase, step_mdp, GymEnv(s), transforms, checks."""

from recurrl.envs.batched import SerialEnv
from recurrl.envs.checks import check_env_specs
from recurrl.envs.common import EnvBase
from recurrl.envs.env_creator import EnvCreator
from recurrl.envs.gym import GymEnv
from recurrl.envs.gym_vector import GymVecEnv
from recurrl.envs.parallel import ParallelEnv
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
    MaskObservation,
    ObservationTransform,
    OneHotObservation,
    PreviousAction,
    PreviousReward,
    RewardSum,
    StepCounter,
    TensorDictPrimer,
    Transform,
    TransformedEnv,
    find_transform,
    get_env_transforms_from_module,
    get_primers_from_module,
)
from recurrl.envs.utils import step_mdp

__all__ = [
    "Binary",
    "Bounded",
    "Categorical",
    "Compose",
    "Composite",
    "EnvBase",
    "EnvCreator",
    "GymEnv",
    "GymVecEnv",
    "InitTracker",
    "MaskObservation",
    "MultiCategorical",
    "ObservationTransform",
    "OneHot",
    "OneHotObservation",
    "ParallelEnv",
    "PreviousAction",
    "PreviousReward",
    "RewardSum",
    "SerialEnv",
    "StepCounter",
    "TensorDictPrimer",
    "TensorSpec",
    "Transform",
    "TransformedEnv",
    "Unbounded",
    "check_env_specs",
    "find_transform",
    "get_env_transforms_from_module",
    "get_primers_from_module",
    "step_mdp",
]
