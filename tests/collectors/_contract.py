"""The collector contract on any batched env, checked over several batches (shared by the
engine tests: gymnasium's vector envs, EnvPool, recurrl's torch envs)."""

from __future__ import annotations

import torch

from recurrl.collectors import Collector
from recurrl.modules import set_recurrent_mode
from tests.collectors.test_collector import STATE_KEYS


def check_collector_contract(
    env, lstm, policy, *, steps: int = 16, batches: int = 3, start_bound: float | None = None
) -> None:
    """``policy`` (whose recurrent part is ``lstm``, writing ``"features"`` and the states
    of ``STATE_KEYS``) collected in ``env`` for ``batches`` batches of ``steps`` steps:

    - episodes end inside batches; ``is_init`` is True exactly at episode starts (the first
      step, and every step after a done);
    - a new trajectory id exactly at ``is_init``, each id owned by one env, ids numbered
      from 0 in order of appearance;
    - the carried state is zeros at ``is_init`` and the previous step's ``("next", h)``
      elsewhere; the root after a step is its ``("next", "observation")`` within an episode,
      and a reset one (``|obs| <= start_bound`` where given) after an episode end;
    - recurrent-mode replay of each batch (later ones start mid-episode) gives the collected
      features and final states.
    """
    n = env.batch_size[0]
    collector = Collector(env, policy, frames_per_batch=n * steps)
    got = [collector.rollout() for _ in range(batches)]
    collector.shutdown()
    assert torch.cat(got, dim=1).batch_size == (n, steps * batches)
    check_batches_contract(got, lstm, start_bound=start_bound)


def check_batches_contract(
    got: list, lstm, *, start_bound: float | None = None, ids_from_zero: bool = True
) -> None:
    """The checks of :func:`check_collector_contract` on consecutive ``[N, T]`` batches
    ``got`` of the same ``N`` envs (each row continues from one batch to the next), e.g.
    from a multi-process collector. ``ids_from_zero=False`` (ids laid out by a collector
    among several) replaces "ids numbered from 0 in order" by "one distinct id per
    trajectory"; the other checks are the same.
    """
    data = torch.cat(got, dim=1)
    n = data.batch_size[0]
    is_init, done = data["is_init"].squeeze(-1), data["next", "done"].squeeze(-1)
    assert torch.stack([b["next", "done"].squeeze(-1)[:, :-1] for b in got]).any()
    assert is_init[:, 0].all()
    assert torch.equal(is_init[:, 1:], done[:, :-1])
    ids = data["collector", "traj_ids"]
    if ids_from_zero:
        assert ids[:, 0].tolist() == list(range(n))
    assert torch.equal(ids[:, 1:] != ids[:, :-1], is_init[:, 1:])
    owners: dict[int, int] = {}
    for row, env_ids in enumerate(ids.tolist()):
        for i in env_ids:
            assert owners.setdefault(i, row) == row
    if ids_from_zero:
        assert sorted(owners) == list(range(int(is_init.sum())))
    else:  # one id per trajectory start, never reused
        assert len(owners) == int(is_init.sum())
    carried = ~is_init[:, 1:]
    for key in STATE_KEYS:
        assert data[key][is_init].abs().max() == 0
        torch.testing.assert_close(
            data[key][:, 1:][carried], data["next", key][:, :-1][carried], rtol=0, atol=0
        )
    obs, nxt = data["observation"], data["next", "observation"]
    torch.testing.assert_close(obs[:, 1:][carried], nxt[:, :-1][carried], rtol=0, atol=0)
    if start_bound is not None:
        assert (obs[is_init].abs() <= start_bound).all()
    for batch in got:
        replay = batch.exclude("features", *(("next", k) for k in STATE_KEYS))
        with set_recurrent_mode(True):
            lstm(replay)
        torch.testing.assert_close(replay["features"], batch["features"], atol=1e-5, rtol=1e-4)
        for key in STATE_KEYS:
            torch.testing.assert_close(
                replay["next", key][:, -1], batch["next", key][:, -1], atol=1e-5, rtol=1e-4
            )
