"""Collector on multi-agent envs: [N, T] batches with agent sub-TensorDicts, per-agent state
carried and reset at each agent's own is_init, replay from slice starts."""

from __future__ import annotations

import pytest
import torch

from recurrl.collectors import Collector
from recurrl.envs import InitTracker, TensorDictPrimer, TransformedEnv, find_transform
from recurrl.envs.transforms.from_module import get_env_transforms_from_module
from recurrl.testing import CountingEnv, MultiAgentRecallEnv
from tests.collectors._multiagent_policy import STATE, make_policy, replay

N_AGENTS, LENGTHS, REENTER = 3, [[4, 3, 2], [3, 3, 2]], (2, 3)


def _env() -> MultiAgentRecallEnv:
    env = MultiAgentRecallEnv(batch_size=(2,), n_agents=N_AGENTS, lengths=LENGTHS, reenter=REENTER)
    env.set_seed(0)
    return env


def _collect(frames: int = 40, per_batch: int = 20):
    gru, policy = make_policy(N_AGENTS, _env().obs_dim)
    env = _env()
    collector = Collector(env, policy, frames_per_batch=per_batch, total_frames=frames)
    batches = list(collector)
    collector.shutdown()
    return gru, env, collector, torch.cat(batches, dim=1)


def test_batches_hold_agent_groups_and_per_row_traj_ids():
    _, _, collector, data = _collect()
    assert data.batch_size == (2, 20)
    assert data["agents"].batch_size == (2, 20, N_AGENTS)
    assert data["agents", "rs_h"].shape == (2, 20, N_AGENTS, 1, 8)
    assert data["next", "agents", "reward"].shape == (2, 20, N_AGENTS, 1)
    ids = data["collector", "traj_ids"]
    assert ids.shape == (2, 20)
    env_init = data["is_init"].squeeze(-1)
    assert ((ids[:, 1:] != ids[:, :-1]) == env_init[:, 1:]).all()
    # the wiring found the per-agent is_init and the nested state key
    env = collector.env
    assert find_transform(env, InitTracker) is not None
    assert ("agents", "is_init") in env.observation_spec.keys(True, True)
    assert len(find_transform(env, TensorDictPrimer)) == 1


def test_masked_agents_are_never_stepped():
    _, env, _, data = _collect()
    mask = data["agents", "mask"].squeeze(-1)
    assert env.actions_taken.tolist() == mask.sum(1).tolist()
    assert (data["next", "agents", "reward"].squeeze(-1)[~mask] == 0).all()


def test_state_carried_per_agent_and_reset_at_each_agents_own_is_init():
    _, _, _, data = _collect()
    h, next_h = data[STATE], data[("next", *STATE)]
    init = data["agents", "is_init"].squeeze(-1)  # [N, T, n]
    # row 0 re-enters agent 2 at step 3 of each 5-step episode; nobody else restarts there
    assert init[0, :10, 2].tolist() == [True, False, False, True, False] * 2
    assert (
        init[0, :10, :2].tolist()
        == [[True, True]] + [[False, False]] * 4 + [[True, True]] + [[False, False]] * 4
    )
    for t in range(1, data.shape[1]):
        carried = next_h[:, t - 1]
        starts = init[:, t].reshape(2, N_AGENTS, 1, 1)
        expected = torch.where(starts, torch.zeros_like(carried), carried)
        torch.testing.assert_close(h[:, t], expected)
    # at the re-entry step: the re-entering agent's stored state is zeros, the others'
    # unchanged, and the previous step's ("next", ...) stays the module's output
    t = 3
    assert (h[0, t, 2] == 0).all() and (h[0, t, :2] != 0).any()
    torch.testing.assert_close(h[0, t, :2], next_h[0, t - 1, :2])
    assert (next_h[0, t - 1, 2] != 0).any()


def test_state_carried_across_batches():
    _, policy = make_policy(N_AGENTS, _env().obs_dim)
    collector = Collector(_env(), policy, frames_per_batch=14, total_frames=28)
    first, second = list(collector)
    collector.shutdown()
    torch.testing.assert_close(second[STATE][:, 0], first[("next", *STATE)][:, -1])
    assert not second["agents", "is_init"][:, 0].all()


@pytest.mark.parametrize("start", [0, 1, 3, 6, 11])
def test_replay_from_slice_starts_reproduces_the_collected_states(start):
    gru, _, _, data = _collect()
    piece = data[:, start : start + 8]
    features, next_h = replay(gru, piece)
    torch.testing.assert_close(features, piece["agents", "features"], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(next_h, piece[("next", *STATE)], atol=1e-5, rtol=1e-4)


def test_memory_policy_wiring_rejects_a_group_the_env_lacks():
    _, policy = make_policy(N_AGENTS, 4)
    with pytest.raises(ValueError, match="agent group 'agents'"):
        Collector(CountingEnv(batch_size=(2,), obs_dim=4), policy, frames_per_batch=4)


def test_env_transforms_from_a_module_reading_the_agent_is_init():
    gru, _ = make_policy(N_AGENTS, 6)
    transforms = get_env_transforms_from_module(gru)
    env = TransformedEnv(_env(), transforms)
    td = env.reset()
    assert td[STATE].shape == (2, N_AGENTS, 1, 8) and td["agents", "is_init"].all()


def _pettingzoo_env():
    pytest.importorskip("mpe2", reason="pip install 'recurrl[multiagent]'")
    from recurrl.envs import PettingZooEnv

    return PettingZooEnv("mpe2:simple_spread_v3", num_envs=2, seed=0, max_cycles=4, N=3)


def _vmas_env():
    pytest.importorskip("vmas", reason="pip install 'recurrl[vmas]'")
    from recurrl.envs import VmasEnv

    return VmasEnv("balance", num_envs=2, continuous_actions=False, max_steps=4, seed=0)


@pytest.mark.parametrize("make_env", [_pettingzoo_env, _vmas_env], ids=["pettingzoo", "vmas"])
def test_collector_carries_per_agent_state_on_library_envs(make_env):
    env = make_env()
    n, features = env.observation_spec["agents", "observation"].shape[-2:]
    gru, policy = make_policy(n, features)
    collector = Collector(env, policy, frames_per_batch=12, total_frames=24)
    data = torch.cat(list(collector), dim=1)
    collector.shutdown()
    assert data["agents"].batch_size == (2, 12, n)
    init = data["is_init"].squeeze(-1)
    assert init[:, [0, 4, 8]].all() and init.sum() == 6  # episodes of 4 steps
    assert (data["agents", "is_init"].squeeze(-1) == init[..., None]).all()
    features_replayed, next_h = replay(gru, data[:, 2:])
    torch.testing.assert_close(features_replayed, data["agents", "features"][:, 2:])
    torch.testing.assert_close(next_h, data[("next", *STATE)][:, 2:])
