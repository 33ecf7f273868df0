"""Tests of recurrl.collectors._ray_wire: the form in which a remote collector's batch
crosses the process boundary (numpy arrays out of band), and its one-copy concatenation.

These run without Ray: the wire form is plain Python data, and what Ray does with it
(pickle protocol 5) is run here with ``pickle`` itself."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from recurrl.collectors._ray_wire import as_tensordict, is_wire, pack, unpack


def batch(n: int = 3, t: int = 4, seed: int = 0) -> TensorDict:
    """A collected batch's layout: root keys, hidden states, ``"next"``, ``"collector"``."""
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "observation": torch.randn(n, t, 2, generator=g),
            "is_init": torch.rand(n, t, 1, generator=g) < 0.3,
            "rs_h": torch.randn(n, t, 1, 8, generator=g),
            "action": torch.randint(0, 2, (n, t), generator=g),
            "half": torch.randn(n, t, generator=g).to(torch.bfloat16),  # numpy has no bf16
            "next": {
                "rs_h": torch.randn(n, t, 1, 8, generator=g),
                "reward": torch.randn(n, t, 1, generator=g),
                "done": torch.rand(n, t, 1, generator=g) < 0.2,
                "empty": TensorDict({}, [n, t]),
            },
            "collector": {"traj_ids": torch.randint(0, 99, (n, t), generator=g)},
        },
        batch_size=[n, t],
    )


def assert_same(a: TensorDict, b: TensorDict) -> None:
    assert a.batch_size == b.batch_size
    assert set(a.keys(True)) == set(b.keys(True))  # empty sub-TensorDicts included
    for key in a.keys(True, True):
        x, y = a.get(key), b.get(key)
        assert x.dtype == y.dtype and torch.equal(x, y), key


def test_round_trip_keeps_every_entry_dtype_and_nesting():
    td = batch()
    wire = pack(td)
    assert is_wire(wire)
    assert isinstance(wire["entries"]["next"]["rs_h"], np.ndarray)
    assert isinstance(wire["entries"]["half"], torch.Tensor)  # travels as a torch tensor
    back = unpack([pickle.loads(pickle.dumps(wire, protocol=5))])
    assert_same(back, td)


def test_pack_does_not_copy_and_unpack_copies_once_into_writable_memory():
    td = batch()
    wire = pack(td)
    assert np.shares_memory(wire["entries"]["rs_h"], td["rs_h"].numpy())  # a view
    readonly = {**wire, "entries": {**wire["entries"]}}
    readonly["entries"]["rs_h"] = wire["entries"]["rs_h"].copy()
    readonly["entries"]["rs_h"].flags.writeable = False  # as the object store hands it out
    out = unpack([readonly])
    out["rs_h"].add_(1.0)  # writable, and not the worker's memory
    assert torch.equal(out["rs_h"], td["rs_h"] + 1.0)


def test_concatenation_follows_the_order_of_the_batches():
    parts = [batch(seed=s) for s in range(3)]
    out = unpack([pack(p) for p in parts])
    assert_same(out, torch.cat(parts, 0))


def test_batches_that_differ_are_refused_by_entry():
    a, b = batch(), batch()
    b.set(("next", "extra"), torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"different keys at entry 'next'"):
        unpack([pack(a), pack(b)])
    c = batch()
    c.set("rs_h", c["rs_h"].double())  # never promoted silently
    with pytest.raises(ValueError, match=r"different dtypes or shapes at entry 'rs_h'"):
        unpack([pack(a), pack(c)])


def test_what_is_not_a_plain_cpu_tensordict_travels_as_itself():
    td = batch()
    td.names = ["env", "time"]
    assert pack(td) is td  # dim names: pickled as the TensorDict
    assert as_tensordict(td) is td
    mixed = unpack([pack(batch(seed=1)), td])  # a wire form and a TensorDict still join
    assert mixed.batch_size == (6, 4)
