"""Collectors: run a policy in an env, carry its hidden state, yield batches of steps."""

from recurrl.collectors.collector import Collector

__all__ = ["Collector"]
