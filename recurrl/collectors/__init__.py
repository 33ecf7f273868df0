"""Collectors: run a policy in an env, carry its hidden state, yield batches of steps.

:class:`RayCollector` and :class:`RemoteCollectorError` (Ray actors running collectors)
are imported on first use, so that ``import recurrl.collectors`` (and ``from
recurrl.collectors import *``) does not import Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recurrl.collectors.collector import Collector, MissingPolicyTransformsError

if TYPE_CHECKING:
    from recurrl.collectors.ray import RayCollector as RayCollector
    from recurrl.collectors.ray import RemoteCollectorError as RemoteCollectorError

# RayCollector / RemoteCollectorError are left out of __all__: a star import would
# import Ray.
__all__ = ["Collector", "MissingPolicyTransformsError"]

_LAZY = ("RayCollector", "RemoteCollectorError")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        try:
            from recurrl.collectors import ray as _ray_collector
        except ImportError as err:
            raise ImportError(
                f'recurrl.collectors.{name} needs Ray ({err}). Fix: pip install "recurrl[ray]".'
            ) from err
        return getattr(_ray_collector, name)
    raise AttributeError(f"module 'recurrl.collectors' has no attribute {name!r}")
