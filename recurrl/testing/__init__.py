"""Test helpers shipped with recurrl: small envs whose behaviour is known exactly."""

from recurrl.testing.envs import CountingEnv, RecallEnv
from recurrl.testing.multiagent_envs import MultiAgentRecallEnv

__all__ = ["CountingEnv", "MultiAgentRecallEnv", "RecallEnv"]
