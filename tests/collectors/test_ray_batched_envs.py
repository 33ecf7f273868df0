"""RayCollector with recurrl's batched torch envs: every remote collector steps one env of
``N`` rows in tensor ops, and its batches are those of a local Collector on the same env,
seed, policy and trajectory-id layout, exactly (ids, ``is_init``, partial resets, hidden
states), after crossing the process boundary."""

from __future__ import annotations

import functools
import sys

import pytest
import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.collectors import Collector
from recurrl.envs import CartPoleEnv
from recurrl.modules import LSTMModule, set_recurrent_mode
from recurrl.testing import CountingEnv

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test classes reach actors

from recurrl.collectors import RayCollector, RemoteCollectorError  # noqa: E402
from recurrl.collectors.ray import SEED_STRIDE  # noqa: E402

H, ENVS, STEPS, WORKERS, SEED = 8, 8, 16, 2, 7
STATE = ["rs_h", "rs_c"]
# short episodes: CartPole's terminations (random actions: ~20 steps) and truncations at
# 16 steps restart the envs at different steps, mid-batch and at batch boundaries
make_env = functools.partial(CartPoleEnv, ENVS, max_episode_steps=STEPS)


def sample(logits: torch.Tensor) -> torch.Tensor:
    """An action drawn from torch's global RNG (seeded per remote collector)."""
    return torch.distributions.Categorical(logits=logits).sample()


def make_policy() -> tuple[LSTMModule, Seq]:
    torch.manual_seed(0)
    lstm = LSTMModule(
        4, H, in_keys=["observation", *STATE], out_keys=["features", *(("next", k) for k in STATE)]
    )
    head = Mod(nn.Linear(H, 2), in_keys=["features"], out_keys=["logits"])
    return lstm, Seq(lstm, head, Mod(sample, in_keys=["logits"], out_keys=["action"]))


def local_batches(policy: Seq, worker: int, count: int) -> list:
    """What remote collector ``worker`` of :func:`ray_batches` collects, here."""
    seed = SEED + worker * SEED_STRIDE
    collector = Collector(
        make_env(), policy, frames_per_batch=ENVS * STEPS, traj_id_offset=worker,
        traj_id_stride=WORKERS,
    )  # fmt: skip
    torch.manual_seed(seed)  # what the remote collector's set_seed does to its process
    collector.set_seed(seed)
    try:
        return [collector.rollout() for _ in range(count)]
    finally:
        collector.shutdown()


def test_each_worker_steps_the_batched_env_exactly_as_a_local_collector(ray_session):
    lstm, policy = make_policy()
    with RayCollector(
        make_env, policy, frames_per_batch=WORKERS * ENVS * STEPS, total_frames=2 * WORKERS
        * ENVS * STEPS, num_collectors=WORKERS, sync=True,
    ) as collector:  # fmt: skip
        assert [w["env"] for w in collector.worker_info] == ["CartPoleEnv"] * WORKERS
        assert [w["env_device"] for w in collector.worker_info] == ["cpu"] * WORKERS
        collector.set_seed(SEED)
        remote = list(collector)
    assert [b.batch_size for b in remote] == [(WORKERS * ENVS, STEPS)] * 2
    for worker in range(WORKERS):
        rows = slice(worker * ENVS, (worker + 1) * ENVS)
        for got, expected in zip(remote, local_batches(policy, worker, 2), strict=True):
            got = got[rows]
            assert (got["collector", "worker_id"] == worker).all()
            got = got.exclude(("collector", "worker_id"), ("collector", "policy_version"))
            assert set(got.keys(True, True)) == set(expected.keys(True, True))
            for key in expected.keys(True, True):  # bit for bit, every entry
                assert torch.equal(got.get(key), expected.get(key)), (worker, key)
    batch = torch.cat(remote, dim=1)  # [16, 24]: both batches of every env, in order
    is_init = batch["is_init"].squeeze(-1)
    # partial resets: envs restart at different steps, mid-batch and across batches
    restarts = is_init[:, 1:].sum(0)
    assert 0 < int(restarts.max()) < WORKERS * ENVS and int(is_init[:, 1:].sum()) > WORKERS * ENVS
    ids = batch["collector", "traj_ids"]
    changed = ids[:, 1:] != ids[:, :-1]
    assert torch.equal(changed, is_init[:, 1:])  # a new id exactly at every is_init
    assert (ids % WORKERS == torch.arange(WORKERS).repeat_interleave(ENVS)[:, None]).all()
    # the state rides across the batch boundary, and zeros start every trajectory
    carried = ~is_init[:, STEPS]
    for key in STATE:
        assert torch.equal(batch[key][:, STEPS][carried], batch["next", key][:, STEPS - 1][carried])
        assert not batch[key][is_init].any()
    # recurrent mode over the received batch replays what sequential mode computed: the
    # features at every step, ("next", state) at every trajectory end
    replay = batch.select("observation", "is_init", *STATE).clone()
    with torch.no_grad(), set_recurrent_mode(True):
        lstm(replay)
    torch.testing.assert_close(replay["features"], batch["features"])
    ends = torch.cat([is_init[:, 1:], torch.ones_like(is_init[:, :1])], dim=1)
    for key in STATE:
        torch.testing.assert_close(replay["next", key][ends], batch["next", key][ends])


def test_an_env_with_two_batch_dims_is_refused_with_a_fix(ray_session):
    grid = functools.partial(CountingEnv, batch_size=(2, 4))  # a Collector steps [] or [N]
    with pytest.raises(ValueError, match=r"batch_size \[2, 4\] \(CountingEnv\).*Fix: a batch"):
        RayCollector(grid, frames_per_batch=16, num_collectors=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a process that sees no GPU")
def test_a_cuda_env_in_a_worker_without_a_gpu_says_how_to_get_one(ray_session):
    factory = functools.partial(CartPoleEnv, 4, device="cuda")
    with pytest.raises(RemoteCollectorError, match=r"(?s)could not build its env.*num_gpus"):
        RayCollector(factory, frames_per_batch=8, num_collectors=1)
