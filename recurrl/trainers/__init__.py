"""Training recipes and the ``recurrl`` command line: config dataclasses, loop, logging."""

from recurrl.trainers.config import EnvConfig, ModelConfig, PPOConfig, RunConfig, TrainConfig
from recurrl.trainers.evaluate import evaluate, load_config
from recurrl.trainers.ppo import PPOTrainer, train

__all__ = [
    "EnvConfig",
    "ModelConfig",
    "PPOConfig",
    "PPOTrainer",
    "RunConfig",
    "TrainConfig",
    "evaluate",
    "load_config",
    "train",
]
