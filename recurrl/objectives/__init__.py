"""Losses and value estimators; every forward runs in recurrent mode."""

from recurrl.objectives.common import LossModule
from recurrl.objectives.dqn import DQNLoss
from recurrl.objectives.multiagent import (
    multiagent_critic,
    multiagent_keys,
    multiagent_ppo_loss,
)
from recurrl.objectives.ppo import ClipPPOLoss
from recurrl.objectives.utils import HardUpdate, SoftUpdate, TargetNetUpdater
from recurrl.objectives.value import GAE, TDLambdaEstimator, ValueEstimatorBase

__all__ = [
    "GAE",
    "ClipPPOLoss",
    "DQNLoss",
    "HardUpdate",
    "LossModule",
    "SoftUpdate",
    "TDLambdaEstimator",
    "TargetNetUpdater",
    "ValueEstimatorBase",
    "multiagent_critic",
    "multiagent_keys",
    "multiagent_ppo_loss",
]
