"""Recurrent modules over an agent dimension (``n_agents=``, ``share_params=``): the contract
of ``docs/guides/multiagent.md`` for every memory kind and backend."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import Tensor

from recurrl.functional.recurrent import backend_refusal, recurrent_backend_names
from recurrl.modules import (
    GRUModule,
    LRUModule,
    LSTMModule,
    MinGRUModule,
    RecurrentModule,
    set_recurrent_mode,
)

KINDS = {"lstm": LSTMModule, "gru": GRUModule, "mingru": MinGRUModule, "lru": LRUModule}
N, F, H = 3, 4, 5
X, Y = ("agents", "obs"), ("agents", "feat")


def _backends() -> list[tuple[str, str]]:
    out = []
    for kind, cls in KINDS.items():
        for backend in recurrent_backend_names():
            if backend == "triton" and not torch.cuda.is_available():
                continue
            python_based = kind in ("mingru", "lru")
            if backend_refusal(backend, cls.cell, python_based=python_based) is None:
                out.append((kind, backend))
    return out


def make(kind: str, share: bool = True, **kwargs) -> RecurrentModule:
    torch.manual_seed(0)
    return KINDS[kind](F, H, in_key=X, out_key=Y, n_agents=N, share_params=share, **kwargs)


def step_td(obs: Tensor, is_init: Tensor, states: dict) -> TensorDict:
    b = obs.shape[:-2]
    agents = TensorDict({"obs": obs, "is_init": is_init}, [*b, N])
    td = TensorDict({"agents": agents}, b)
    for key, value in states.items():
        td.set(key, value)
    return td


def collect(module: RecurrentModule, obs: Tensor, is_init: Tensor, init_states: dict):
    """Sequential mode over ``[B, T, N]`` steps, the state threaded by hand as a collector
    does: returns the ``[B, T]`` TensorDict of what it recorded (inputs, stored states,
    outputs, next states)."""
    states, steps = dict(init_states), []
    for t in range(obs.shape[1]):
        out = module(step_td(obs[:, t], is_init[:, t], states))
        steps.append(out)
        states = {k: out.get(("next", *k)) for k in states}
    return torch.stack(steps, 1)


def data(module: RecurrentModule, b: int = 2, t: int = 6, p: float = 0.3):
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(b, t, N, F, generator=g)
    is_init = torch.rand(b, t, N, 1, generator=g) < p
    is_init[:, 0] = True
    states = {
        key: torch.randn(b, *shape, generator=g) for key, (shape, _) in
        module.recurrent_state_spec.items()
    }  # fmt: skip
    return obs, is_init, states


def run_recurrent(module: RecurrentModule, collected: TensorDict) -> TensorDict:
    seq = collected.select(*module.in_keys).clone()
    with set_recurrent_mode(True):
        return module(seq)


def test_keys_spec_and_defaults():
    m = GRUModule(F, H, in_key=X, out_key=Y, n_agents=N)
    assert m.in_keys == [X, ("agents", "recurrent_state"), ("agents", "is_init")]
    assert m.out_keys == [Y, ("next", "agents", "recurrent_state")]
    assert m.recurrent_state_spec == {
        ("agents", "recurrent_state"): (torch.Size([N, 1, H]), torch.float32)
    }
    assert m.share_params and m.n_agents == N and not hasattr(m, "agent_networks")
    single = GRUModule(F, H, in_key="obs", out_key="feat")
    assert single.n_agents is None
    assert single.recurrent_state_spec["recurrent_state"][0] == torch.Size([1, H])
    # explicit keys, with or without the group's is_init at the end
    m2 = LSTMModule(F, H, in_keys=[X, ("agents", "h"), ("agents", "c"), ("agents", "is_init")],
                    out_key=Y, n_agents=N)  # fmt: skip
    assert m2.in_keys[-1] == ("agents", "is_init") and m2.state_keys[0] == ("agents", "h")


@pytest.mark.parametrize("kind, backend", _backends())
@pytest.mark.parametrize("share", [True, False])
def test_sequential_equals_recurrent(kind, backend, share):
    """Outputs, next states and gradients of both modes agree, with random per-agent resets
    and random stored states at the first step (a slice starting mid-episode)."""
    module = make(kind, share, recurrent_backend=backend)
    obs, is_init, states = data(module)
    collected = collect(module, obs, is_init, states)
    out = run_recurrent(module, collected)
    torch.testing.assert_close(out.get(Y), collected.get(Y), atol=1e-5, rtol=1e-5)
    is_end = torch.ones(2, 6, N, dtype=torch.bool)
    is_end[:, :-1] = is_init[:, 1:, :, 0]
    for key in module.state_keys:
        nxt, ref = out.get(("next", *key)), collected.get(("next", *key))
        torch.testing.assert_close(nxt[is_end], ref[is_end], atol=1e-5, rtol=1e-5)
    # gradients: the same loss through both modes
    weights = torch.randn(collected.get(Y).shape)
    module.zero_grad()
    (collect(module, obs, is_init, states).get(Y) * weights).sum().backward()
    ref_grads = [p.grad.clone() for p in module.parameters()]
    module.zero_grad()
    (run_recurrent(module, collected).get(Y) * weights).sum().backward()
    for got, ref in zip((p.grad for p in module.parameters()), ref_grads, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", list(KINDS))
def test_backends_agree(kind):
    """Every backend that runs the cell gives the same numbers with an agent dim."""
    backends = [b for k, b in _backends() if k == kind]
    module = make(kind)
    collected = collect(module, *data(module, t=7))
    outs = []
    for backend in backends:
        module.recurrent_backend = backend
        outs.append(run_recurrent(module, collected).get(Y))
    for backend, out in zip(backends[1:], outs[1:], strict=True):
        torch.testing.assert_close(out, outs[0], atol=1e-5, rtol=1e-5, msg=backend)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("share", [True, False])
def test_agent_reset_mid_episode(kind, share):
    """An agent whose is_init is True mid-episode starts from zeros (its output is the fresh
    module's), and no other agent's output or next state changes."""
    module = make(kind, share)
    obs, is_init, states = data(module, b=2, t=5, p=0.0)
    base = collect(module, obs, is_init, states)
    reset = is_init.clone()
    reset[:, 3, 1] = True  # agent 1 re-enters at step 3
    with_reset = collect(module, obs, reset, states)
    others = [0, 2]
    torch.testing.assert_close(with_reset.get(Y)[:, :, others], base.get(Y)[:, :, others])
    for key in module.state_keys:
        nk = ("next", *key)
        torch.testing.assert_close(with_reset.get(nk)[:, :, others], base.get(nk)[:, :, others])
        # the stored state the step started from is recorded as zeros (what replay reads)
        assert (with_reset.get(key)[:, 3, 1] == 0).all()
        assert (base.get(key)[:, 3, 1] != 0).any()
    assert not torch.allclose(with_reset.get(Y)[:, 3, 1], base.get(Y)[:, 3, 1])
    # agent 1 from step 3 on equals a run that starts there from zeros
    zeros = {k: torch.zeros_like(v) for k, v in states.items()}
    fresh = collect(module, obs[:, 3:], reset[:, 3:], zeros)
    torch.testing.assert_close(with_reset.get(Y)[:, 3:, 1], fresh.get(Y)[:, :, 1])


@pytest.mark.parametrize("kind", ["lstm", "lru"])
@pytest.mark.parametrize("share", [True, False])
def test_replay_from_slice_starts(kind, share):
    """A slice starting mid-episode, replayed in recurrent mode from its stored per-agent
    states, reproduces the collected outputs and states; so does a flat batch of slices
    concatenated with is_init at every slice start."""
    module = make(kind, share)
    obs, is_init, states = data(module, b=2, t=8, p=0.15)
    collected = collect(module, obs, is_init, states)
    piece = collected[:, 3:]
    out = run_recurrent(module, piece)
    torch.testing.assert_close(out.get(Y), collected.get(Y)[:, 3:], atol=1e-5, rtol=1e-5)
    for key in module.state_keys:
        nk = ("next", *key)
        torch.testing.assert_close(out.get(nk)[:, -1], collected.get(nk)[:, -1], atol=1e-5,
                                   rtol=1e-5)  # fmt: skip
    # two slices concatenated into one row [T1 + T2], the second marked at its start: per
    # agent, or at env level only (as samplers mark slice starts)
    ref = torch.cat([collected.get(Y)[0, 2:5], collected.get(Y)[1, 4:]], 0)
    for level in ("agents", "env"):
        flat = torch.cat([collected[0, 2:5], collected[1, 4:]], 0).select(*module.in_keys)
        flat = flat.clone()
        if level == "agents":
            flat.get("agents").get("is_init")[3] = True
        else:
            flat.set("is_init", torch.zeros(len(flat), 1, dtype=torch.bool))
            flat.get("is_init")[3] = True
        with set_recurrent_mode(True):
            out = module(flat)
        torch.testing.assert_close(out.get(Y), ref, atol=1e-5, rtol=1e-5, msg=level)


@pytest.mark.parametrize("share", [True, False])
def test_env_level_is_init_restarts_every_agent_of_its_row(share):
    """A row's "is_init" [*B, 1] starts every agent of that row (zeros in sequential mode,
    the stored states in recurrent mode); other rows keep their states."""
    module = make("lstm", share)
    obs, is_init, states = data(module, b=2, t=1, p=0.0)
    is_init[:] = False
    td = step_td(obs[:, 0], is_init[:, 0], states)
    td.set("is_init", torch.tensor([[True], [False]]))
    out = module(td.clone())
    zeros = {k: torch.where(torch.tensor([True, False]).view(2, 1, 1, 1), 0.0, v)
             for k, v in states.items()}  # fmt: skip
    ref = module(step_td(obs[:, 0], is_init[:, 0], zeros))
    torch.testing.assert_close(out.get(Y), ref.get(Y))
    plain = module(step_td(obs[:, 0], is_init[:, 0], states))
    assert not torch.allclose(out.get(Y)[0], plain.get(Y)[0])
    torch.testing.assert_close(out.get(Y)[1], plain.get(Y)[1])
    bad = step_td(obs[:, 0], is_init[:, 0], states)
    bad.set("is_init", torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="env-level 'is_init' must have shape"):
        module(bad)


def test_shared_params_are_permutation_equivariant():
    module = make("gru", True)
    obs, is_init, states = data(module, b=2, t=4)
    perm = [2, 0, 1]
    out = collect(module, obs, is_init, states)
    permuted = collect(module, obs[:, :, perm], is_init[:, :, perm],
                       {k: v[:, perm] for k, v in states.items()})  # fmt: skip
    torch.testing.assert_close(permuted.get(Y), out.get(Y)[:, :, perm])
    # one network: same input and state, same output for every agent
    same = collect(module, obs[:, :, :1].expand_as(obs), is_init[:, :, :1].expand_as(is_init),
                   {k: v[:, :1].expand_as(v) for k, v in states.items()})  # fmt: skip
    y = same.get(Y)
    torch.testing.assert_close(y, y[:, :, :1].expand_as(y))


@pytest.mark.parametrize("kind", list(KINDS))
def test_per_agent_weights(kind):
    """share_params=False: agent i's output is that of a single-agent module wrapping its own
    network on its own inputs; changing one agent's weights changes nothing else."""
    module = make(kind, False)
    nets = module.agent_networks
    assert len(nets) == N and nets[0] is module.rnn
    assert not torch.equal(next(nets[0].parameters()), next(nets[1].parameters()))
    obs, is_init, states = data(module, b=2, t=5)
    out = collect(module, obs, is_init, states)
    cls = KINDS[kind]
    for i in range(N):
        single = cls(in_key="x", out_key="y", **{cls.network_attr: nets[i]})
        ref_states = {k[-1]: v[:, i] for k, v in states.items()}
        steps = []
        for t in range(5):
            td = TensorDict({"x": obs[:, t, i], "is_init": is_init[:, t, i], **ref_states}, [2])
            res = single(td)
            steps.append(res.get("y"))
            ref_states = {k: res.get(("next", k)) for k in ref_states}
        torch.testing.assert_close(out.get(Y)[:, :, i], torch.stack(steps, 1))
    # permuting the inputs does not permute the outputs: each agent keeps its network
    perm = [1, 0, 2]
    swapped = collect(module, obs[:, :, perm], is_init[:, :, perm],
                      {k: v[:, perm] for k, v in states.items()})  # fmt: skip
    torch.testing.assert_close(swapped.get(Y)[:, :, 2], out.get(Y)[:, :, 2])
    assert not torch.allclose(swapped.get(Y)[:, :, 0], out.get(Y)[:, :, 1])
    # another set of weights for agent 1 only
    with torch.no_grad():
        for p in nets[1].parameters():
            p.add_(0.5)
    changed = collect(module, obs, is_init, states)
    torch.testing.assert_close(changed.get(Y)[:, :, [0, 2]], out.get(Y)[:, :, [0, 2]])
    assert not torch.allclose(changed.get(Y)[:, :, 1], out.get(Y)[:, :, 1])


def test_per_agent_parameters_and_conversion():
    module = make("lstm", False)
    # agent 0's network is also the module's rnn: its parameters are counted once
    n_params = sum(p.numel() for p in module.parameters())
    assert n_params == N * sum(p.numel() for p in module.rnn.parameters())
    obs, is_init, states = data(module, b=2, t=4)
    collected = collect(module, obs, is_init, states)
    module.make_python_based()
    assert all(type(net).__module__.startswith("recurrl") for net in module.agent_networks)
    assert module.agent_networks[0] is module.rnn
    again = collect(module, obs, is_init, states)
    torch.testing.assert_close(again.get(Y), collected.get(Y), atol=1e-6, rtol=1e-5)
    out = run_recurrent(module, collected)  # python-based recurrent mode (the pad runner)
    torch.testing.assert_close(out.get(Y), collected.get(Y), atol=1e-5, rtol=1e-5)
    module.make_cudnn_based()
    assert all(isinstance(net, torch.nn.LSTM) for net in module.agent_networks)
    torch.testing.assert_close(collect(module, obs, is_init, states).get(Y), collected.get(Y))
    state = module.state_dict()
    clone = make("lstm", False)
    clone.load_state_dict(state)
    torch.testing.assert_close(collect(clone, obs, is_init, states).get(Y), collected.get(Y))


def test_missing_state_is_zero_where_every_agent_starts():
    module = make("gru")
    obs = torch.randn(2, N, F)
    out = module(step_td(obs, torch.ones(2, N, 1, dtype=torch.bool), {}))
    ref = module(step_td(obs, torch.ones(2, N, 1, dtype=torch.bool),
                         {("agents", "recurrent_state"): torch.randn(2, N, 1, H)}))  # fmt: skip
    torch.testing.assert_close(out.get(Y), ref.get(Y))
    init = torch.ones(2, N, 1, dtype=torch.bool)
    init[0, 1] = False
    with pytest.raises(KeyError, match="recurrent_state"):
        module(step_td(obs, init, {}))


def test_errors():
    with pytest.raises(ValueError, match="nested under the agent group"):
        GRUModule(F, H, in_key="obs", out_key="feat", n_agents=N)
    with pytest.raises(ValueError, match="needs n_agents"):
        GRUModule(F, H, in_key=X, out_key=Y, share_params=False)
    with pytest.raises(ValueError, match="n_agents must be an int >= 1"):
        GRUModule(F, H, in_key=X, out_key=Y, n_agents=0)
    module = make("gru")
    td = step_td(torch.randn(2, N, F), torch.zeros(2, N, 1, dtype=torch.bool), {})
    del td["agents", "is_init"]
    with pytest.raises(KeyError, match=r"\('agents', 'is_init'\) not found"):
        module(td)
    wrong = {"obs": torch.randn(2, N + 1, F), "is_init": torch.ones(2, N + 1, 1).bool()}
    bad = TensorDict({"agents": TensorDict(wrong, [2, N + 1])}, [2])
    with pytest.raises(ValueError, match=r"\[\*B, n_agents, \.\.\.\]"):
        module(bad)
    with pytest.raises(TypeError, match="is called with a TensorDict"):
        module(torch.randn(2, N, F))
    seq = step_td(torch.randn(N, F), torch.ones(N, 1, dtype=torch.bool), {})
    with pytest.raises(ValueError, match="needs a time dimension"), set_recurrent_mode(True):
        module(seq)
