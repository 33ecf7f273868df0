"""TapeSampler: whole episodes end to end, and losses on a tape equal losses per episode."""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from tensordict import TensorDict

from recurrl.data import LazyTensorStorage, ReplayBuffer, TapeSampler, TensorDictReplayBuffer
from recurrl.objectives import GAE, ClipPPOLoss, DQNLoss
from tests.data._fake import TRAJ, FakeCollector, split_slices, time_order
from tests.objectives._helpers import OBS, recurrent_critic

MASK = ("collector", "mask")


def complete_episodes(storage) -> dict[int, int]:
    """Brute force: ``{tid: length}`` of the stored episodes whose first step (``t == 0``)
    and last step (done) are both stored, every step in between too."""
    data = storage.data[time_order(storage)]
    out = {}
    for tid in data["tid"].unique().tolist():
        ep = data[data["tid"] == tid]
        t, done = ep["t"], ep["next", "done"].reshape(-1)
        n = ep.batch_size[0]
        if t[0] == 0 and bool(done[-1]) and (t == torch.arange(n)).all():
            out[tid] = n
    return out


def check_batch(sample, num_tapes: int, frames: int, complete: dict[int, int],
                overflow: str) -> list:  # fmt: skip
    """Every invariant of a sampled batch; returns the episodes ``(tape, piece, cut)``."""
    assert sample.batch_size == torch.Size([num_tapes * frames])
    found = []
    for k, tape in enumerate(sample.view(num_tapes, frames).unbind(0)):
        mask = tape[MASK]
        real = int(mask.sum())
        assert mask[:real].all() and not mask[real:].any(), "padding only at the tape end"
        assert tape["is_init"][real:].all(), "padding starts sequences"
        assert bool(tape["is_init"][0]), "a tape starts an episode"
        episodes = split_slices(tape[:real])
        for i, ep in enumerate(episodes):
            n = ep.batch_size[0]
            tid = int(ep["tid"][0])
            assert tid in complete, "an incomplete (running or overwritten) episode was drawn"
            assert (ep["tid"] == tid).all(), "an episode mixes trajectories"
            assert (ep["t"] == torch.arange(n)).all(), "an episode must start at its start"
            trunc = ep["next", "truncated"].reshape(-1)
            done = ep["next", "done"].reshape(-1)
            cut = n < complete[tid]
            if cut:
                assert overflow == "cut" and i == len(episodes) - 1 and real == frames
                assert bool(trunc[-1]) and bool(done[-1]), "a cut is marked truncated/done"
                assert not bool(ep["next", "terminated"][-1]), "a cut is not a termination"
            else:
                assert n == complete[tid] and bool(done[-1])
            assert not done[:-1].any() and not trunc[:-1].any()
            found.append((k, ep, cut))
        tids = [int(ep["tid"][0]) for j, ep, _ in found if j == k]
        assert len(set(tids)) == len(tids) == len(episodes), "an episode twice in a tape"
    return found


@pytest.mark.parametrize("overflow", ["cut", "drop"])
@pytest.mark.parametrize("num_envs", [None, 3])
def test_tapes_hold_whole_episodes_over_wraparound(overflow, num_envs):
    rng = random.Random(0)
    collector = FakeCollector(num_envs, 1, 12, seed=1)
    sampler = TapeSampler(num_tapes=2, overflow=overflow, step_key="t",
                          generator=torch.Generator().manual_seed(0))  # fmt: skip
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(97), sampler=sampler, batch_size=40)
    wrapped = cuts = joined = 0
    for _ in range(25):  # several times around the ring, episodes across batches
        rb.extend(collector.batch(rng.randint(1, 9)))
        complete = complete_episodes(rb.storage)
        if not complete or (overflow == "drop" and min(complete.values()) > 20):
            continue
        sample = rb.sample()
        found = check_batch(sample, 2, 20, complete, overflow)
        running = set(collector.ids.tolist())
        assert not running & {int(ep["tid"][0]) for _, ep, _ in found}
        for _, ep, cut in found:
            cuts += cut
            step = ep["index"].diff()
            wrapped += bool((step < 0).any())
            joined += bool((step > 1).any())  # rows of several [N, T] writes
    assert wrapped, "some episode should wrap around the end of the ring"
    assert (joined > 0) == (num_envs is not None)
    assert (cuts > 0) == (overflow == "cut")


def test_2d_storage():
    collector = FakeCollector(4, 1, 12, seed=3)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(80, ndim=2), batch_size=30,
                                sampler=TapeSampler(num_tapes=3))  # fmt: skip
    for _ in range(8):
        rb.extend(collector.batch(5))
        check_batch(rb.sample(), 3, 10, complete_episodes(rb.storage), "cut")


def test_end_flag_mode_without_ids():
    collector = FakeCollector(None, 2, 6, seed=2)
    data = collector.batch(60).exclude(TRAJ)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=15,
                                sampler=TapeSampler(frames_per_tape=15))  # fmt: skip
    rb.extend(data)
    assert rb.sampler.traj_key is None and rb.sampler.end_key == ("next", "done")
    for _ in range(5):
        check_batch(rb.sample(), 1, 15, complete_episodes(rb.storage), "cut")


def episodes_data(lengths, *, extra: int = 0, seed: int = 0) -> TensorDict:
    """One env's episodes of the given lengths, then ``extra`` steps of a running one."""
    g = torch.Generator().manual_seed(seed)
    ts = [torch.arange(n) for n in lengths] + ([torch.arange(extra)] if extra else [])
    t = torch.cat(ts)
    tid = torch.cat([torch.full((len(x),), i) for i, x in enumerate(ts)])
    done = torch.cat([torch.arange(n) == n - 1 for n in lengths] + [torch.zeros(extra).bool()])
    done = done.unsqueeze(-1)
    n = t.numel()
    is_init = (t == 0).unsqueeze(-1)
    obs = torch.randn(n + 1, OBS, generator=g)
    next_obs = obs[1:].clone()
    next_obs[done.reshape(-1)] = torch.randn(len(lengths), OBS, generator=g)
    term = done & (torch.rand(n, 1, generator=g) < 0.5)
    states = {
        k: torch.randn(n, 1, 5, generator=g) * ~is_init.unsqueeze(-1)  # primer's zeros
        for k in ("recurrent_state_h", "recurrent_state_c")
    }
    return TensorDict(
        {
            "obs": obs[:-1], "is_init": is_init, "tid": tid, "t": t, TRAJ: tid.clone(),
            "action": torch.randint(0, 4, (n,), generator=g), **states,
            "next": {"obs": next_obs, "reward": torch.randn(n, 1, generator=g), "done": done,
                     "terminated": term, "truncated": done & ~term},
        },
        [n],
    )  # fmt: skip


@pytest.mark.parametrize("weight", ["uniform", "length"])
def test_draws_are_uniform_over_episodes(weight):
    lengths = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    rb = ReplayBuffer(storage=LazyTensorStorage(200), batch_size=12 * 400,
                      sampler=TapeSampler(num_tapes=400, weight=weight,
                                          generator=torch.Generator().manual_seed(3)))  # fmt: skip
    rb.extend(episodes_data(lengths, extra=5))
    counts = torch.zeros(len(lengths) + 1)
    for _ in range(5):
        first = rb.sample()["tid"].view(400, 12)[:, 0]  # each tape's first draw
        counts += torch.bincount(first, minlength=len(lengths) + 1)
    assert counts[-1] == 0, "the running episode is never drawn"
    p = torch.ones(len(lengths)) if weight == "uniform" else torch.tensor(lengths).double()
    expected = counts.sum() * p / p.sum()
    chi2 = float(((counts[:-1] - expected) ** 2 / expected).sum())
    assert chi2 < 27.9  # 99.9% quantile of chi-square with 9 degrees of freedom


def test_budget_shape_padding_and_long_episodes():
    g = torch.Generator().manual_seed(0)
    data = episodes_data([20, 3])
    cut = TensorDictReplayBuffer(storage=LazyTensorStorage(50), batch_size=8,
                                 sampler=TapeSampler(frames_per_tape=8, generator=g))  # fmt: skip
    cut.extend(data)
    with pytest.warns(UserWarning, match="20 steps, more than frames_per_tape=8") as record:
        for _ in range(10):
            check_batch(cut.sample(), 1, 8, {0: 20, 1: 3}, "cut")
    assert len(record) == 1, "warned once, not at every sample"
    drop = TensorDictReplayBuffer(storage=LazyTensorStorage(50), batch_size=8,
                                  sampler=TapeSampler(overflow="drop", generator=g))  # fmt: skip
    drop.extend(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # drop never draws the long episode: nothing to warn
        tape = drop.sample()
    assert (tape["tid"][:3] == 1).all() and not tape[MASK][3:].any()
    assert (tape["obs"][3:] == 0).all(), "padding is zeros"


def test_state_dict_replays_the_same_tapes():
    data = episodes_data([3, 4, 5, 6, 7])

    def buffer():
        sampler = TapeSampler(frames_per_tape=10, generator=torch.Generator().manual_seed(5))
        return ReplayBuffer(storage=LazyTensorStorage(40), sampler=sampler, batch_size=10)

    a, b = buffer(), buffer()
    a.extend(data)
    a.sample()
    b.load_state_dict(a.state_dict())
    assert (a.sample()["tid"] == b.sample()["tid"]).all()


def test_bad_arguments_and_data_raise_clear_errors():
    for kwargs in ({"frames_per_tape": 0}, {"num_tapes": 0}, {"frames_per_tape": 2.5},
                   {"overflow": "pad"}, {"weight": "priority"}, {"init_key": None}):  # fmt: skip
        with pytest.raises(ValueError, match="TapeSampler: expected"):
            TapeSampler(**kwargs)
    sampler = TapeSampler(frames_per_tape=4)
    with pytest.raises(ValueError, match="batch_size = num_tapes"):
        sampler.tape_shape(5)
    with pytest.raises(ValueError, match="positive multiple of num_tapes=2"):
        TapeSampler(num_tapes=2).tape_shape(5)
    with pytest.raises(ValueError, match="batch_size = num_tapes"):
        ReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler, batch_size=5)
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler, batch_size=4)
    with pytest.raises(RuntimeError, match="storage is empty"):
        rb.sample()
    rb.extend(episodes_data([], extra=6))
    with pytest.raises(RuntimeError, match="at least one complete stored episode"):
        rb.sample()
    no_starts = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4,
                             sampler=TapeSampler(frames_per_tape=4))  # fmt: skip
    no_starts.extend(episodes_data([3]).exclude("is_init"))
    with pytest.raises(KeyError, match="episode starts under init_key"):
        no_starts.sample()
    no_keys = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4,
                           sampler=TapeSampler(frames_per_tape=4))  # fmt: skip
    with pytest.raises(KeyError, match="TapeSampler: expected the trajectory id key"):
        no_keys.extend(TensorDict({"x": torch.zeros(3)}, [3]))
    drop = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2,
                        sampler=TapeSampler(overflow="drop"))  # fmt: skip
    drop.extend(episodes_data([3]))
    with pytest.raises(RuntimeError, match="at most frames_per_tape=2 steps"):
        drop.sample()


# -- losses on a tape equal the frame-weighted losses of its episodes, computed alone ------
def tape_and_episodes(frames: int = 30, seed: int = 0):
    """Two flat tapes (cut at the budget), their real steps, and their episodes read alone
    from the storage (a cut one marked as a slice ending there would be)."""
    data = episodes_data([4, 9, 6, 12, 3, 7, 5], extra=4, seed=seed)
    sampler = TapeSampler(num_tapes=2, generator=torch.Generator().manual_seed(seed))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=2 * frames,
                                sampler=sampler)  # fmt: skip
    rb.extend(data)
    tapes = rb.sample()
    real = tapes[MASK]
    alone, cuts = [], 0
    for ep in split_slices(tapes[real]):
        one = rb.storage.get(ep["index"])
        if not bool(one["next", "done"][-1]):  # cut: a truncation, bootstrapped
            one["next", "done"][-1] = True
            one["next", "truncated"][-1] = True
            cuts += 1
        alone.append(one)
    assert cuts, "the tapes should hold a cut episode"
    return tapes, alone, real


@pytest.mark.parametrize("n_steps", [1, 3])
def test_dqn_loss_on_a_tape_equals_the_loss_per_episode(n_steps):
    torch.manual_seed(0)
    q, _ = recurrent_critic("lstm", out_key="action_value", out=4)
    loss = DQNLoss(q, gamma=0.9, n_steps=n_steps)
    tape, alone, real = tape_and_episodes()
    total = loss(tape)["loss"]
    errors, weighted = [], 0.0
    for ep in alone:
        weighted = weighted + loss(ep)["loss"] * ep.batch_size[0]
        errors.append(ep["td_error"])
    torch.testing.assert_close(tape["td_error"][real], torch.cat(errors))
    assert (tape["td_error"][~real] == 0).all()
    torch.testing.assert_close(total, weighted / int(real.sum()))
    rows = tape.view(2, -1).clone()  # [num_tapes, frames_per_tape]: the same steps
    torch.testing.assert_close(loss(rows)["loss"], total)
    torch.testing.assert_close(rows["td_error"].reshape(-1), tape["td_error"])


def test_gae_and_ppo_on_a_tape_equal_them_per_episode():
    torch.manual_seed(1)
    critic, _ = recurrent_critic("lstm")
    actor, _ = recurrent_critic("lstm", out_key="logits", out=4)
    gae, ppo = GAE(0.9, 0.8, critic), ClipPPOLoss(actor, critic)
    tape, alone, real = tape_and_episodes(frames=33, seed=1)
    tape["sample_log_prob"] = -torch.rand(tape.batch_size)
    gae(tape)
    out = ppo(tape)
    adv = []
    weighted = dict.fromkeys(("loss_objective", "loss_critic", "entropy"), 0.0)
    start, log_prob = 0, tape["sample_log_prob"][real]
    for ep in alone:
        n = ep.batch_size[0]
        ep["sample_log_prob"] = log_prob[start : start + n]
        gae(ep)
        adv.append(ep["advantage"])
        per = ppo(ep)
        for key in weighted:
            weighted[key] = weighted[key] + per[key] * n
        start += n
    torch.testing.assert_close(tape["advantage"][real], torch.cat(adv))
    for key, value in weighted.items():
        torch.testing.assert_close(out[key], value / int(real.sum()))
