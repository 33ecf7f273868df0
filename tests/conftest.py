"""Fixtures shared by every test: a fixed seed and one intra-op thread."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: intra-op threads only add synchronisation (and, on a shared 2-core
    machine, make every one of the scan's many small kernels wait for a busy core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
