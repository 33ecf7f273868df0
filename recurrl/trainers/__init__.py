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
from recurrl.trainers.export import ExportError, export_policy
from recurrl.trainers.loop import Trainer
from recurrl.trainers.ppo import PPOTrainer, train

__all__ = [
    "DQNConfig",
    "DQNTrainer",
    "EnvConfig",
    "ExportError",
    "ModelConfig",
    "PPOConfig",
    "PPOTrainer",
    "RunConfig",
    "TrainConfig",
    "Trainer",
    "evaluate",
    "export_policy",
    "load_config",
    "train",
]
