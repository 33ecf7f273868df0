"""Env transforms: the Transform base, TransformedEnv, Compose and one transform per file."""

from recurrl.envs.transforms.flicker_observation import FlickerObservation
from recurrl.envs.transforms.from_module import (
    get_env_transforms_from_module,
    get_primers_from_module,
)
from recurrl.envs.transforms.gray_scale import GrayScale
from recurrl.envs.transforms.init_tracker import InitTracker
from recurrl.envs.transforms.mask_observation import MaskObservation
from recurrl.envs.transforms.observation import ObservationTransform
from recurrl.envs.transforms.observation_norm import ObservationNorm
from recurrl.envs.transforms.one_hot_observation import OneHotObservation
from recurrl.envs.transforms.previous_action import PreviousAction
from recurrl.envs.transforms.previous_reward import PreviousReward
from recurrl.envs.transforms.primer import TensorDictPrimer
from recurrl.envs.transforms.resize import Resize
from recurrl.envs.transforms.reward_scaling import RewardScaling
from recurrl.envs.transforms.reward_sum import RewardSum
from recurrl.envs.transforms.step_counter import StepCounter
from recurrl.envs.transforms.team_reward import TeamReward
from recurrl.envs.transforms.to_tensor_image import ToTensorImage
from recurrl.envs.transforms.transform import Compose, Transform, TransformedEnv, find_transform

__all__ = [
    "Compose",
    "FlickerObservation",
    "GrayScale",
    "InitTracker",
    "MaskObservation",
    "ObservationNorm",
    "ObservationTransform",
    "OneHotObservation",
    "PreviousAction",
    "PreviousReward",
    "Resize",
    "RewardScaling",
    "RewardSum",
    "StepCounter",
    "TeamReward",
    "TensorDictPrimer",
    "ToTensorImage",
    "Transform",
    "TransformedEnv",
    "find_transform",
    "get_env_transforms_from_module",
    "get_primers_from_module",
]
