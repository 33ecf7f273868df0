"""A recurrent policy in a real rollout, then replayed in recurrent mode.

The env carries the hidden state (``InitTracker`` + the module's primer); replaying the
collected data in recurrent mode must reproduce the collected features step for step, with
full and partial resets. A missing transform fails loudly, never with a silent zero state.
"""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.envs import Compose, GymEnv, InitTracker, TransformedEnv
from recurrl.modules import (
    GRUModule,
    LSTMModule,
    get_env_transforms_from_module,
    get_primers_from_module,
    set_recurrent_mode,
)
from recurrl.testing.envs import CountingEnv

from ._reference import trajectory_end_mask

MODULES = {"lstm": LSTMModule, "gru": GRUModule}
H = 8


def _policy(kind: str, obs_dim: int, **kwargs):
    torch.manual_seed(0)
    rnn = MODULES[kind](obs_dim, H, in_key="observation", out_key="features", **kwargs)
    head = Mod(nn.Linear(H, 2), in_keys=["features"], out_keys=["logits"])
    act = Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"])
    return rnn, Seq(rnn, head, act)


def _env(base, rnn, *, tracker: bool = True, primer: bool = True):
    transforms = [InitTracker()] if tracker else []
    if primer:
        transforms.append(rnn.make_tensordict_primer())
    return TransformedEnv(base, Compose(*transforms))


def _check_replay(rnn, data):
    """Recurrent mode over the collected data reproduces the collected features."""
    is_init = data["is_init"].squeeze(-1)
    ends = trajectory_end_mask(is_init)
    for key in rnn.state_keys:
        # the primer stored zeros at every episode start
        assert data[key][is_init].abs().max() == 0
        # between resets the state rides from ("next", key) at t to key at t + 1
        carried = ~is_init[..., 1:]
        torch.testing.assert_close(
            data[key][..., 1:, :, :][carried], data["next", key][..., :-1, :, :][carried]
        )
    replay = data.clone()
    for key in ["features", *(("next", k) for k in rnn.state_keys)]:
        del replay[key]
    with set_recurrent_mode(True):
        rnn(replay)
    torch.testing.assert_close(replay["features"], data["features"], atol=1e-5, rtol=1e-4)
    for key in rnn.state_keys:
        torch.testing.assert_close(
            replay["next", key][ends], data["next", key][ends], atol=1e-5, rtol=1e-4
        )
        assert replay["next", key][~ends].abs().max() == 0


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("backend", ["pad", "scan"])
def test_batched_counting_env_with_partial_resets(kind, backend):
    rnn, policy = _policy(kind, 3, recurrent_backend=backend, num_layers=2)
    env = _env(CountingEnv(batch_size=(3,), max_steps=[2, 3, 5]), rnn)
    with torch.no_grad():
        data = env.rollout(8, policy, break_when_any_done=False)
    assert data.batch_size == (3, 8)
    expected_init = torch.tensor([[t % n == 0 for t in range(8)] for n in (2, 3, 5)])
    assert data["is_init"].squeeze(-1).tolist() == expected_init.tolist()
    _check_replay(rnn, data)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_single_counting_env(kind):
    rnn, policy = _policy(kind, 3)
    env = _env(CountingEnv(max_steps=3), rnn)
    with torch.no_grad():
        data = env.rollout(7, policy, break_when_any_done=False)
    assert data.batch_size == (7,)
    assert data["is_init"].squeeze(-1).nonzero().squeeze(-1).tolist() == [0, 3, 6]
    _check_replay(rnn, data)


def test_cartpole():
    rnn, policy = _policy("lstm", 4)
    env = _env(GymEnv("CartPole-v1"), rnn)
    env.set_seed(0)
    with torch.no_grad():
        data = env.rollout(40, policy, break_when_any_done=False)
    assert data["is_init"][0].item() and data["is_init"][1:].any()  # a reset mid-rollout
    _check_replay(rnn, data)


def test_primers_from_the_whole_policy():
    rnn, policy = _policy("gru", 3)
    env = TransformedEnv(
        CountingEnv(batch_size=(2,), max_steps=[2, 4]),
        Compose(InitTracker(), get_primers_from_module(policy)),
    )
    with torch.no_grad():
        data = env.rollout(6, policy, break_when_any_done=False)
    _check_replay(rnn, data)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_env_transforms_from_the_whole_policy(kind):
    rnn, policy = _policy(kind, 3)
    env = TransformedEnv(
        CountingEnv(batch_size=(2,), max_steps=[2, 4]), get_env_transforms_from_module(policy)
    )
    with torch.no_grad():
        data = env.rollout(6, policy, break_when_any_done=False)
    assert data["is_init"][:, 0].all() and data["is_init"][:, 1:].any()
    _check_replay(rnn, data)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_without_init_tracker(kind):
    rnn, policy = _policy(kind, 3)
    env = _env(CountingEnv(batch_size=(2,)), rnn, tracker=False)
    with pytest.raises(KeyError, match="InitTracker"):
        env.rollout(3, policy)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_without_primer_fails_at_the_first_carried_step(kind):
    rnn, policy = _policy(kind, 3)
    env = _env(CountingEnv(batch_size=(2,)), rnn, primer=False)
    td = policy(env.reset())  # every env starts: zero state, allowed
    assert td["is_init"].all()
    with pytest.raises(KeyError, match="TensorDictPrimer"):
        env.rollout(3, policy)
