"""The multi-agent env with known answers the tests use (it lives in :mod:`recurrl.envs`, where
``recurrl train --env MultiAgentRecall-v0`` also finds it)."""

from recurrl.envs.multiagent_recall import MultiAgentRecallEnv

__all__ = ["MultiAgentRecallEnv"]
