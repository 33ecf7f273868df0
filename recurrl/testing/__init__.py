"""Test helpers shipped with recurrl: small envs whose behaviour is known exactly."""

from recurrl.testing.envs import CountingEnv, RecallEnv

__all__ = ["CountingEnv", "RecallEnv"]
