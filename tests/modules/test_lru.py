"""``LRUModule``: the recurrent-module contract (keys, both modes, resets, primer, collector
wiring) for the LRU cell, with its two state keys, on every backend that runs it."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.collectors import Collector
from recurrl.modules import LRUModule, set_recurrent_mode
from recurrl.modules.nets import LRU
from recurrl.testing import CountingEnv

BACKENDS = ["auto", "assoc", "scan", "pad", "cpp"]


KEYS = ("recurrent_state_y", "recurrent_state_h")
SIZES = (6, 12)


def _module(layers=2, backend="auto", seed=0, **kw):
    torch.manual_seed(seed)
    return LRUModule(4, 6, layers, recurrent_backend=backend, in_key="obs", out_key="y", **kw)


def _run_steps(module, obs, is_init):
    """Step by step as an env runs it: the stored states before every step (zeros where the
    primer resets them), the outputs, and the states after every step."""
    n, steps, _ = obs.shape
    layers = module.config.num_layers
    states = {k: torch.zeros(n, layers, s) for k, s in zip(KEYS, SIZES, strict=True)}
    stored, ys, nexts = {k: [] for k in KEYS}, [], {k: [] for k in KEYS}
    for t in range(steps):
        td = TensorDict({"obs": obs[:, t], "is_init": is_init[:, t]}, batch_size=[n])
        for k in KEYS:
            states[k] = states[k].masked_fill(is_init[:, t, :, None], 0.0)
            stored[k].append(states[k])
            td[k] = states[k]
        module(td)
        ys.append(td["y"])
        for k in KEYS:
            states[k] = td["next", k]
            nexts[k].append(states[k])
    stack = {k: torch.stack(v, 1) for k, v in stored.items()}
    return stack, torch.stack(ys, 1), {k: torch.stack(v, 1) for k, v in nexts.items()}


def _inputs(n=3, steps=50, seed=1):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, steps, 4, generator=g)
    is_init = torch.rand(n, steps, 1, generator=g) < 0.1
    is_init[:, 0] = True
    return obs, is_init


def _sequence(module, obs, is_init, stored):
    td = TensorDict({"obs": obs, "is_init": is_init, **stored}, batch_size=obs.shape[:2])
    with set_recurrent_mode(True):
        return module(td)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layers", [1, 2])
def test_single_step_and_recurrent_mode_agree(backend, layers):
    module = _module(layers, backend)
    obs, is_init = _inputs()
    stored, seq_y, nexts = _run_steps(module, obs, is_init)
    td = _sequence(module, obs, is_init, stored)
    torch.testing.assert_close(td["y"], seq_y)
    # the next states are exact at every trajectory end (the last step included), zero
    # elsewhere
    ends = torch.cat([is_init[:, 1:, 0], torch.ones(3, 1, dtype=torch.bool)], dim=1)
    assert ends[:, :-1].any()
    for k in KEYS:
        torch.testing.assert_close(td["next", k][ends], nexts[k][ends])
        assert td["next", k][~ends].abs().max() == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_replayed_slice_starts_from_its_stored_state(backend):
    """A slice cut mid-episode (its first step not an episode start) gives the outputs of
    the full run from there on: the complex state is restored from its real parts."""
    module = _module(backend=backend)
    obs, is_init = _inputs(steps=40)
    stored, seq_y, _ = _run_steps(module, obs, is_init)
    cut = slice(17, 40)
    td = _sequence(module, obs[:, cut], is_init[:, cut], {k: v[:, cut] for k, v in stored.items()})
    torch.testing.assert_close(td["y"], seq_y[:, cut])


@pytest.mark.parametrize("backend", BACKENDS)
def test_nothing_leaks_across_is_init(backend):
    module = _module(backend=backend)
    obs, is_init = _inputs(steps=30)
    is_init[:, 12] = True
    g = torch.Generator().manual_seed(2)
    base = {k: torch.randn(3, 30, 2, s, generator=g) for k, s in zip(KEYS, SIZES, strict=True)}
    outs = []
    for poison in (False, True):
        o, stored = obs.clone(), {k: v.clone() for k, v in base.items()}
        if poison:  # another trajectory's inputs and states go NaN
            o[:, :12] = float("nan")
            for v in stored.values():
                v[:, :12] = float("nan")
        outs.append(_sequence(module, o, is_init, stored)["y"])
    assert outs[1][:, :12].isnan().all()
    torch.testing.assert_close(outs[0][:, 12:], outs[1][:, 12:], rtol=0, atol=0)


def test_contract_pieces_primer_spec_and_tensor_call():
    module = _module(layers=3)
    assert module.in_keys == ["obs", *KEYS, "is_init"]
    assert module.out_keys == ["y", *(("next", k) for k in KEYS)]
    assert module.recurrent_state_spec == {
        KEYS[0]: (torch.Size([3, 6]), torch.float32),
        KEYS[1]: (torch.Size([3, 12]), torch.float32),
    }
    assert module.make_tensordict_primer() is not None
    assert module.python_based and module.recurrent_backend == "auto"
    y, y_next, h_next = module(obs=torch.randn(5, 4), is_init=torch.ones(5, 1, dtype=torch.bool))
    assert y.shape == (5, 6) and y_next.shape == (5, 3, 6) and h_next.shape == (5, 3, 12)
    assert torch.equal(y, y_next[:, -1])
    assert "recurrent_recompute" in LRUModule.__doc__ and "lru:" in LRUModule.__doc__


def test_wraps_an_existing_network_and_refuses_what_it_cannot_run():
    net = LRU(4, 6, 2, batch_first=True, r_min=0.5)
    module = LRUModule(lru=net, in_key="obs", out_key="y")
    assert module.rnn is net and module.config.num_layers == 2
    ring = LRUModule(4, 6, r_min=0.9, r_max=0.99, max_phase=math.pi / 10, in_key="o", out_key="y")
    assert (ring.rnn.r_min, ring.rnn.r_max, ring.rnn.max_phase) == (0.9, 0.99, math.pi / 10)
    with pytest.raises(ValueError, match="'triton' does not run the 'lru' cell"):
        _module(backend="triton")
    with pytest.raises(ValueError, match="lru= wraps an existing module"):
        LRUModule(4, lru=net, in_key="obs", out_key="y")
    with pytest.raises(ValueError, match="drop r_min, r_max and max_phase"):
        LRUModule(lru=net, r_min=0.2, in_key="obs", out_key="y")
    with pytest.raises(ValueError, match="lru= must be a"):
        LRUModule(lru=nn.GRU(4, 6), in_key="obs", out_key="y")
    with pytest.raises(ValueError, match="in_keys must hold 3 keys"):
        LRUModule(4, 6, in_keys=["obs", "h"], out_key="y")
    module.recurrent_backend = "assoc"
    module.recurrent_recompute = "full"
    # auto with recompute picks a backend that recomputes (never pad)
    assert _module(backend="auto", recurrent_recompute="full").recurrent_recompute == "full"


def test_a_collector_wires_the_env_and_replay_reproduces_the_features():
    torch.manual_seed(0)
    module = LRUModule(3, 6, in_key="observation", out_key="features")
    policy = Seq(
        module,
        Mod(nn.Linear(6, 2), in_keys=["features"], out_keys=["logits"]),
        Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"]),
    )
    env = CountingEnv(batch_size=(3,), max_steps=[2, 3, 5])  # no InitTracker, no primer
    collector = Collector(env, policy, frames_per_batch=30)
    for data in itertools.islice(collector, 2):
        is_init = data["is_init"].squeeze(-1)
        assert is_init.any()
        for k in KEYS:
            assert data[k][is_init].abs().max() == 0
        assert data[KEYS[1]][~is_init].abs().max() > 0
        replay = data.clone()
        del replay["features"]
        for k in KEYS:
            del replay["next", k]
        with set_recurrent_mode(True):
            module(replay)
        torch.testing.assert_close(replay["features"], data["features"], atol=1e-5, rtol=1e-4)
