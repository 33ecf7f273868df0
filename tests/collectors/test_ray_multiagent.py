"""RayCollector steps a multi-agent env unchanged: agent groups, per-agent state and is_init."""

from __future__ import annotations

import functools
import sys

import pytest
import torch

from recurrl.testing import MultiAgentRecallEnv
from tests.collectors import _multiagent_policy
from tests.collectors._multiagent_policy import STATE, make_policy, replay

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test classes reach actors
ray.cloudpickle.register_pickle_by_value(_multiagent_policy)

from recurrl.collectors import RayCollector  # noqa: E402

make_env = functools.partial(
    MultiAgentRecallEnv, batch_size=(2,), n_agents=3, lengths=(4, 3, 2), reenter=(2, 3)
)


@pytest.mark.slow
def test_ray_collector_steps_the_multiagent_env(ray_session):
    gru, policy = make_policy(3, make_env().obs_dim)
    with RayCollector(
        make_env, policy, frames_per_batch=20, total_frames=40, num_collectors=2
    ) as collector:
        batches = list(collector)
    assert [b.batch_size for b in batches] == [torch.Size([4, 5])] * 2
    data = torch.cat(batches, dim=1)  # [4 env rows, 10 steps]
    assert data["agents"].batch_size == (4, 10, 3)
    assert data["collector", "traj_ids"].shape == (4, 10)
    init = data["agents", "is_init"].squeeze(-1)
    assert init[:, :, 2].tolist() == [[True, False, False, True, False] * 2] * 4
    # per-agent state: carried, restarted at each agent's own is_init, replayed exactly
    h, next_h = data[STATE], data[("next", *STATE)]
    for t in range(1, 10):
        starts = init[:, t].reshape(4, 3, 1, 1)
        expected = torch.where(starts, torch.zeros_like(next_h[:, t - 1]), next_h[:, t - 1])
        torch.testing.assert_close(h[:, t], expected)
    features, replayed = replay(gru, data[:, 1:])
    torch.testing.assert_close(features, data["agents", "features"][:, 1:], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(replayed, next_h[:, 1:], atol=1e-5, rtol=1e-4)
