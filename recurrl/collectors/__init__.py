"""Collectors: run a policy in an env, carry its hidden state, yield batches of steps.

:class:`RayCollector`, :class:`RemoteCollectorError` (Ray actors running collectors) and the
reference's multi-process collectors :class:`MultiSyncCollector` /
:class:`MultiAsyncCollector` (older names ``MultiSyncDataCollector`` /
``MultiaSyncDataCollector``), which run on Ray, are imported on first use, so that
``import recurrl.collectors`` (and ``from recurrl.collectors import *``) does not import Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from recurrl.collectors.collector import (
    Collector,
    MissingPolicyTransformsError,
    SyncDataCollector,
)
from recurrl.collectors.utils import split_trajectories

if TYPE_CHECKING:
    from recurrl.collectors.multi import MultiAsyncCollector as MultiAsyncCollector
    from recurrl.collectors.multi import MultiaSyncDataCollector as MultiaSyncDataCollector
    from recurrl.collectors.multi import MultiSyncCollector as MultiSyncCollector
    from recurrl.collectors.multi import MultiSyncDataCollector as MultiSyncDataCollector
    from recurrl.collectors.ray import RayCollector as RayCollector
    from recurrl.collectors.ray import RemoteCollectorError as RemoteCollectorError

# The Ray-backed names are left out of __all__: a star import would import Ray.
__all__ = ["Collector", "MissingPolicyTransformsError", "SyncDataCollector", "split_trajectories"]

#: lazily imported name -> its module (each imports Ray)
_LAZY = {
    "RayCollector": "ray",
    "RemoteCollectorError": "ray",
    "MultiSyncCollector": "multi",
    "MultiAsyncCollector": "multi",
    "MultiSyncDataCollector": "multi",
    "MultiaSyncDataCollector": "multi",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        try:
            module = importlib.import_module(f"recurrl.collectors.{_LAZY[name]}")
        except ImportError as err:
            raise ImportError(
                f'recurrl.collectors.{name} needs Ray ({err}). Fix: pip install "recurrl[ray]".'
            ) from err
        return getattr(module, name)
    raise AttributeError(f"module 'recurrl.collectors' has no attribute {name!r}")
