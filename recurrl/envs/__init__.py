"""Environments on TensorDicts: specs, EnvBase, step_mdp, GymEnv(s), transforms, checks."""

from recurrl.envs.batched import SerialEnv
from recurrl.envs.checks import check_env_specs
from recurrl.envs.common import EnvBase
from recurrl.envs.env_creator import EnvCreator
from recurrl.envs.envpool import EnvPoolEnv
from recurrl.envs.gym import GymEnv
from recurrl.envs.gym_vector import GymVecEnv, vector_entry_point_ids
from recurrl.envs.multiagent import is_multiagent_env_id, make_multiagent_env
from recurrl.envs.parallel import ParallelEnv
from recurrl.envs.pettingzoo import PettingZooEnv
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
from recurrl.envs.torch_envs import (
    TORCH_ENVS,
    CartPoleEnv,
    CountRecallEnv,
    PendulumEnv,
    RepeatFirstEnv,
    RepeatPreviousEnv,
    has_torch_env,
    make_torch_env,
)
from recurrl.envs.transforms import (
    Compose,
    FlickerObservation,
    GrayScale,
    InitTracker,
    MaskObservation,
    ObservationNorm,
    ObservationTransform,
    OneHotObservation,
    PreviousAction,
    PreviousReward,
    Resize,
    RewardScaling,
    RewardSum,
    StepCounter,
    TeamReward,
    TensorDictPrimer,
    ToTensorImage,
    Transform,
    TransformedEnv,
    find_transform,
    get_env_transforms_from_module,
    get_primers_from_module,
)
from recurrl.envs.utils import step_mdp
from recurrl.envs.vmas import VmasEnv
from recurrl.modules.exploration import ExplorationType, exploration_type, set_exploration_type

__all__ = [
    "TORCH_ENVS",
    "Binary",
    "Bounded",
    "CartPoleEnv",
    "Categorical",
    "Compose",
    "Composite",
    "CountRecallEnv",
    "EnvBase",
    "EnvCreator",
    "EnvPoolEnv",
    "ExplorationType",
    "FlickerObservation",
    "GrayScale",
    "GymEnv",
    "GymVecEnv",
    "InitTracker",
    "MaskObservation",
    "MultiCategorical",
    "ObservationNorm",
    "ObservationTransform",
    "OneHot",
    "OneHotObservation",
    "ParallelEnv",
    "PendulumEnv",
    "PettingZooEnv",
    "PreviousAction",
    "PreviousReward",
    "RepeatFirstEnv",
    "RepeatPreviousEnv",
    "Resize",
    "RewardScaling",
    "RewardSum",
    "SerialEnv",
    "StepCounter",
    "TeamReward",
    "TensorDictPrimer",
    "TensorSpec",
    "ToTensorImage",
    "Transform",
    "TransformedEnv",
    "Unbounded",
    "VmasEnv",
    "check_env_specs",
    "exploration_type",
    "find_transform",
    "get_env_transforms_from_module",
    "get_primers_from_module",
    "has_torch_env",
    "is_multiagent_env_id",
    "make_multiagent_env",
    "make_torch_env",
    "set_exploration_type",
    "step_mdp",
    "vector_entry_point_ids",
]
