"""Shared fixtures for the objectives tests: recurrent critics and synthetic slices."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq

from recurrl.modules import GRUModule, LSTMModule

OBS, HID = 3, 5


def recurrent_critic(kind: str = "gru", out_key: str = "state_value", out: int = 1):
    cls = GRUModule if kind == "gru" else LSTMModule
    rnn = cls(input_size=OBS, hidden_size=HID, in_key="obs", out_key="feat")
    head = Mod(torch.nn.Linear(HID, out), in_keys=["feat"], out_keys=[out_key])
    return Seq(rnn, head), rnn


def make_batch(batch, *, states=("recurrent_state",), num_layers=1, seed=0, n_actions=None):
    """Random consistent transitions: ("next", obs)[t] == obs[t + 1] inside a trajectory.

    ``batch`` is ``[B]`` (flat) or ``[N, T]``. Starts (is_init) at t=0, at random places, and
    after every done step; random stored states (as after a mid-episode slice start).
    """
    g = torch.Generator().manual_seed(seed)
    shape = torch.Size(batch)
    t = shape[-1]
    obs_seq = torch.randn(*shape[:-1], t + 1, OBS, generator=g)
    done = torch.rand(*shape, 1, generator=g) < 0.2
    term = done & (torch.rand(*shape, 1, generator=g) < 0.5)
    done[..., -1, :] = True  # slice end
    is_init = torch.zeros(*shape, 1, dtype=torch.bool)
    is_init[..., 0, :] = True
    is_init[..., 1:, :] = done[..., :-1, :]
    next_obs = obs_seq[..., 1:, :].clone()
    # after a done step, the next trajectory starts from an unrelated observation
    obs = obs_seq[..., :-1, :].clone()
    fresh = torch.randn(*shape, OBS, generator=g)
    obs = torch.where(is_init, fresh, obs)
    next_obs[..., :-1, :] = torch.where(is_init[..., 1:, :], next_obs[..., :-1, :],
                                        obs[..., 1:, :])  # fmt: skip
    data = {
        "obs": obs,
        "is_init": is_init,
        "next": {
            "obs": next_obs,
            "reward": torch.randn(*shape, 1, generator=g),
            "done": done,
            "terminated": term,
            "truncated": done & ~term,
        },
    }
    for k in states:
        data[k] = torch.randn(*shape, num_layers, HID, generator=g) * is_init.unsqueeze(-1)
        data["next"][k] = torch.randn(*shape, num_layers, HID, generator=g)
    if n_actions is not None:
        data["action"] = torch.randint(0, n_actions, shape, generator=g)
    return TensorDict(data, shape)


@torch.no_grad()
def loop_values(critic, rnn, td, out_key="state_value"):
    """Reference: step the critic one step at a time over each row (time last, [.., T]).

    Returns (value, next_value), each [*B, T, F].
    """
    flat = td.reshape(-1, td.shape[-1]) if td.batch_dims > 1 else td.unsqueeze(0)
    keys = rnn.state_keys
    vals, nvals = [], []
    for row in flat.unbind(0):
        vr, nvr, state = [], [], None
        for t in range(row.shape[0]):
            step = row[t].select(*row.keys()).copy()
            if t == 0 or bool(step["is_init"]) or bool(row["next", "done"][t - 1]):
                state = [step[k] for k in keys]
            for k, s in zip(keys, state, strict=True):
                step[k] = s
            step["is_init"] = torch.zeros(1, dtype=torch.bool)
            out = critic(step)
            vr.append(out[out_key])
            state = [out["next", k] for k in keys]
            nstep = row["next"][t].copy()
            for k, s in zip(keys, state, strict=True):
                nstep[k] = s
            nstep["is_init"] = torch.zeros(1, dtype=torch.bool)
            nvr.append(critic(nstep)[out_key])
        vals.append(torch.stack(vr))
        nvals.append(torch.stack(nvr))
    v, nv = torch.stack(vals), torch.stack(nvals)
    return v.reshape(*td.shape, -1), nv.reshape(*td.shape, -1)
