"""The property the replay pipeline exists for.

A recurrent policy computes features while collecting (sequential mode, one env step per
call, the env carrying the hidden state). Replayed slices sampled from a buffer, run in
recurrent mode, must reproduce those features step for step: every slice restarts from the
hidden state stored at its first step, and no state leaks from one slice into the next.
"""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
from recurrl.envs import Compose, InitTracker, TransformedEnv
from recurrl.modules import LSTMModule, set_recurrent_mode
from recurrl.testing.envs import CountingEnv

H, SLICE_LEN, NUM_SLICES = 8, 6, 12


@pytest.fixture(scope="module")
def collected():
    """Two consecutive [3, 20] batches from 3 envs with episodes of 4, 7 and 11 steps."""
    torch.manual_seed(0)
    rnn = LSTMModule(3, H, in_key="observation", out_key="features")
    head = Mod(nn.Linear(H, 2), in_keys=["features"], out_keys=["logits"])
    act = Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"])
    env = TransformedEnv(CountingEnv(batch_size=(3,), max_steps=[4, 7, 11]),
                         Compose(InitTracker(), rnn.make_tensordict_primer()))  # fmt: skip
    with torch.no_grad():
        data = env.rollout(40, Seq(rnn, head, act), break_when_any_done=False)  # sequential
    # the collector's global trajectory ids: a new id at every is_init, unique across envs
    starts = data["is_init"].squeeze(-1).long()
    per_env = starts.cumsum(-1) - 1
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), starts.sum(-1).cumsum(0)[:-1]])
    data["collector", "traj_ids"] = per_env + offsets.unsqueeze(-1)
    return rnn, [data[:, :20], data[:, 20:]]


def _replay(rnn, sample):
    replay = sample.exclude("features", *(("next", k) for k in rnn.state_keys))
    with torch.no_grad(), set_recurrent_mode(True):
        return rnn(replay)


@pytest.mark.parametrize("capacity", [200, 70])  # 70 < 120 steps: the storage wraps
@pytest.mark.parametrize("layout", ["ragged", "strict", "padded", "padded_2d", "span"])
@pytest.mark.parametrize("ndim", [1, 2])  # 2: each env's [20] steps are one storage row
def test_replayed_slices_reproduce_collected_features(collected, capacity, layout, ndim):
    rnn, batches = collected
    sampler = SliceSampler(slice_len=SLICE_LEN, strict_length=layout == "strict",
                           pad_output=layout.startswith("padded"),
                           span=layout == "span")  # fmt: skip
    storage = LazyTensorStorage(capacity, ndim=ndim)
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler,
                                batch_size=SLICE_LEN * NUM_SLICES)  # fmt: skip
    for batch in batches:
        rb.extend(batch)
    for _ in range(5):
        sample = rb.sample()
        mask = sample.get(("collector", "mask"), torch.ones(sample.batch_size, dtype=torch.bool))
        if layout == "padded_2d":
            sample = sample.view(NUM_SLICES, SLICE_LEN)
            mask = mask.view(NUM_SLICES, SLICE_LEN)
        out = _replay(rnn, sample)
        torch.testing.assert_close(out["features"][mask], sample["features"][mask],
                                   atol=1e-5, rtol=1e-4)  # fmt: skip
        ends = sample["next", "truncated"].squeeze(-1) & mask  # every slice end
        for key in rnn.state_keys:  # the state is exact at every slice end
            torch.testing.assert_close(out["next", key][ends], sample["next", key][ends],
                                       atol=1e-5, rtol=1e-4)  # fmt: skip


def test_without_slice_marks_state_would_leak(collected):
    """Control: dropping the is_init marks at slice starts breaks the equality, so the
    test above would catch a sampler that forgot them."""
    rnn, batches = collected
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(200),
                                sampler=SliceSampler(slice_len=SLICE_LEN),
                                batch_size=SLICE_LEN * NUM_SLICES)  # fmt: skip
    for batch in batches:
        rb.extend(batch)
    sample = rb.sample()
    stored = rb.storage.data["is_init"][sample["index"]]
    sample["is_init"] = stored  # undo the marks
    sample["is_init"][0] = True
    out = _replay(rnn, sample)
    assert (out["features"] - sample["features"]).abs().max() > 1e-3
