"""Training recipes and the ``recurrl`` command line: config dataclasses, loop, logging."""

from recurrl.trainers.config import (
    DQNConfig,
    EnvConfig,
    ModelConfig,
    PPOConfig,
    RunConfig,
    TrainConfig,
)
from recurrl.trainers.dqn import DQNTrainer
from recurrl.trainers.evaluate import evaluate, load_config
from recurrl.trainers.loop import Trainer
from recurrl.trainers.ppo import PPOTrainer, train

__all__ = [
    "DQNConfig",
    "DQNTrainer",
    "EnvConfig",
    "ModelConfig",
    "PPOConfig",
    "PPOTrainer",
    "RunConfig",
    "TrainConfig",
    "Trainer",
    "evaluate",
    "load_config",
    "train",
]
