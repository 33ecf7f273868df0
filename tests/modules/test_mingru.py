"""``MinGRUModule``: the recurrent-module contract (keys, both modes, resets, primer,
collector wiring) for the minGRU cell, on every backend that runs it."""

from __future__ import annotations

import itertools

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.collectors import Collector
from recurrl.modules import MinGRUModule, set_recurrent_mode
from recurrl.modules.nets import MinGRU
from recurrl.testing import CountingEnv

BACKENDS = ["auto", "assoc", "scan", "pad", "cpp"]


KEY = "recurrent_state"


def _module(layers=2, backend="auto", seed=0, **kw):
    torch.manual_seed(seed)
    return MinGRUModule(4, 6, layers, recurrent_backend=backend, in_key="obs", out_key="y", **kw)


def _sequential(module, obs, is_init):
    """Step by step as an env would run it: the stored states before every step, the outputs
    and the state after every step."""
    n, steps, _ = obs.shape
    h = torch.zeros(n, module.config.num_layers, 6)
    stored, ys, nexts = [], [], []
    for t in range(steps):
        h = h.masked_fill(is_init[:, t, :, None], 0.0)  # what the primer writes on reset
        stored.append(h)
        td = TensorDict({"obs": obs[:, t], "is_init": is_init[:, t], KEY: h}, batch_size=[n])
        module(td)
        h = td["next", KEY]
        ys.append(td["y"])
        nexts.append(h)
    return torch.stack(stored, 1), torch.stack(ys, 1), torch.stack(nexts, 1)


def _inputs(n=3, steps=50, seed=1):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, steps, 4, generator=g)
    is_init = torch.rand(n, steps, 1, generator=g) < 0.1
    is_init[:, 0] = True
    return obs, is_init


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layers", [1, 2])
def test_sequential_and_recurrent_mode_agree(backend, layers):
    module = _module(layers, backend)
    obs, is_init = _inputs()
    stored, seq_y, nexts = _sequential(module, obs, is_init)
    td = TensorDict({"obs": obs, "is_init": is_init, KEY: stored}, batch_size=[3, 50])
    with set_recurrent_mode(True):
        module(td)
    torch.testing.assert_close(td["y"], seq_y)
    # ("next", h) is exact at every trajectory end (the last step included), zero elsewhere
    ends = torch.cat([is_init[:, 1:, 0], torch.ones(3, 1, dtype=torch.bool)], dim=1)
    assert ends[:, :-1].any()
    torch.testing.assert_close(td["next", KEY][ends], nexts[ends])
    assert td["next", KEY][~ends].abs().max() == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_replayed_slice_starts_from_its_stored_state(backend):
    """A slice cut mid-episode (its first step not an episode start) gives the outputs of
    the full run from there on."""
    module = _module(backend=backend)
    obs, is_init = _inputs(steps=40)
    stored, seq_y, _ = _sequential(module, obs, is_init)
    cut = slice(17, 40)
    td = TensorDict(
        {"obs": obs[:, cut], "is_init": is_init[:, cut], KEY: stored[:, cut]}, batch_size=[3, 23]
    )
    with set_recurrent_mode(True):
        module(td)
    torch.testing.assert_close(td["y"], seq_y[:, cut])


@pytest.mark.parametrize("backend", BACKENDS)
def test_nothing_leaks_across_is_init(backend):
    module = _module(backend=backend)
    obs, is_init = _inputs(steps=30)
    is_init[:, 12] = True
    stored = torch.randn(3, 30, 2, 6)
    outs = []
    for changed in (False, True):
        o, s = obs.clone(), stored.clone()
        if changed:
            o[:, :12] += 5
            s[:, :12] -= 3  # read or not, every stored state before the restart
        td = TensorDict({"obs": o, "is_init": is_init, KEY: s}, batch_size=[3, 30])
        with set_recurrent_mode(True):
            outs.append(module(td)["y"])
    assert not torch.allclose(outs[0][:, :12], outs[1][:, :12])
    torch.testing.assert_close(outs[0][:, 12:], outs[1][:, 12:], rtol=0, atol=0)


def test_contract_pieces_primer_spec_and_tensor_call():
    module = _module(layers=3)
    assert module.in_keys == ["obs", KEY, "is_init"]
    assert module.out_keys == ["y", ("next", KEY)]
    assert module.recurrent_state_spec == {KEY: (torch.Size([3, 6]), torch.float32)}
    assert module.make_tensordict_primer() is not None
    assert module.python_based and module.recurrent_backend == "auto"
    y, h = module(obs=torch.randn(5, 4), is_init=torch.ones(5, 1, dtype=torch.bool))
    assert y.shape == (5, 6) and h.shape == (5, 3, 6)
    assert "recurrent_recompute" in MinGRUModule.__doc__ and "mingru:" in MinGRUModule.__doc__


def test_wraps_an_existing_network_and_refuses_what_it_cannot_run():
    net = MinGRU(4, 6, 2, batch_first=True)
    module = MinGRUModule(mingru=net, in_key="obs", out_key="y")
    assert module.rnn is net and module.config.num_layers == 2
    with pytest.raises(ValueError, match="'triton' does not run the 'mingru' cell"):
        _module(backend="triton")
    with pytest.raises(ValueError, match="mingru= wraps an existing module"):
        MinGRUModule(4, mingru=net, in_key="obs", out_key="y")
    with pytest.raises(ValueError, match="mingru= must be a"):
        MinGRUModule(mingru=nn.GRU(4, 6), in_key="obs", out_key="y")
    module.recurrent_backend = "assoc"
    module.recurrent_recompute = "full"
    # auto with recompute picks a backend that recomputes (never pad)
    assert _module(backend="auto", recurrent_recompute="full").recurrent_recompute == "full"


def test_a_collector_wires_the_env_and_replay_reproduces_the_features():
    torch.manual_seed(0)
    module = MinGRUModule(3, 6, in_key="observation", out_key="features")
    policy = Seq(
        module,
        Mod(nn.Linear(6, 2), in_keys=["features"], out_keys=["logits"]),
        Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"]),
    )
    env = CountingEnv(batch_size=(3,), max_steps=[2, 3, 5])  # no InitTracker, no primer
    collector = Collector(env, policy, frames_per_batch=30)
    batches = list(itertools.islice(collector, 2))
    for data in batches:
        is_init = data["is_init"].squeeze(-1)
        assert is_init.any() and data[KEY][is_init].abs().max() == 0
        replay = data.clone()
        del replay["features"]
        del replay["next", KEY]
        with set_recurrent_mode(True):
            module(replay)
        torch.testing.assert_close(replay["features"], data["features"], atol=1e-5, rtol=1e-4)
