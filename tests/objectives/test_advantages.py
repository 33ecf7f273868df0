"""GAE / TD(lambda) modules against a step-by-step loop over a recurrent critic."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule as Mod

from recurrl.functional.returns import (
    generalized_advantage_estimate,
    td_lambda_return_estimate,
)
from recurrl.modules import recurrent_mode
from recurrl.objectives import GAE, TDLambdaEstimator
from recurrl.objectives.value._next_state import values_and_next_values
from tests.objectives._helpers import loop_values, make_batch, recurrent_critic


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("shape", [(17,), (3, 8)])
def test_values_and_next_values_match_loop(kind, shape):
    critic, rnn = recurrent_critic(kind)
    td = make_batch(shape, states=rnn.state_keys, seed=1)
    v, nv = values_and_next_values(critic, td, "state_value")
    rv, rnv = loop_values(critic, rnn, td)
    torch.testing.assert_close(v, rv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nv, rnv, atol=1e-5, rtol=1e-5)


def test_done_without_is_init_is_a_boundary():
    critic, rnn = recurrent_critic("gru")
    td = make_batch((12,), states=rnn.state_keys, seed=2)
    td["next", "done"][4] = True  # a done step whose successor is not marked is_init
    td["is_init"][5] = False
    v, nv = values_and_next_values(critic, td, "state_value")
    rv, rnv = loop_values(critic, rnn, td)
    torch.testing.assert_close(v, rv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nv, rnv, atol=1e-5, rtol=1e-5)


def test_input_tensordict_state_untouched():
    critic, rnn = recurrent_critic("gru")
    td = make_batch((9,), states=rnn.state_keys, seed=3)
    before = td.clone()
    GAE(0.9, 0.9, critic)(td)
    for key in before.keys(True, True):
        torch.testing.assert_close(td[key], before[key])


@pytest.mark.parametrize("shape", [(15,), (2, 7)])
def test_gae_module_matches_loop(shape):
    critic, rnn = recurrent_critic("lstm")
    td = make_batch(shape, states=rnn.state_keys, seed=4)
    GAE(0.95, 0.9, critic)(td)
    rv, rnv = loop_values(critic, rnn, td)
    nxt = td["next"]
    adv, target = generalized_advantage_estimate(
        0.95, 0.9, rv, rnv, nxt["reward"], nxt["done"], nxt["terminated"], time_dim=-2
    )
    torch.testing.assert_close(td["advantage"], adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(td["value_target"], target, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(td["state_value"], rv, atol=1e-5, rtol=1e-5)
    assert not td["advantage"].requires_grad


def test_td_lambda_module_matches_loop():
    critic, rnn = recurrent_critic("gru")
    td = make_batch((3, 6), states=rnn.state_keys, seed=5)
    TDLambdaEstimator(0.9, 0.7, critic)(td)
    rv, rnv = loop_values(critic, rnn, td)
    nxt = td["next"]
    ret = td_lambda_return_estimate(
        0.9, 0.7, rnv, nxt["reward"], nxt["done"], nxt["terminated"], time_dim=-2
    )
    torch.testing.assert_close(td["value_target"], ret, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(td["advantage"], ret - rv, atol=1e-5, rtol=1e-5)


def test_average_gae_uses_masked_statistics():
    critic, rnn = recurrent_critic("gru")
    td = make_batch((20,), states=rnn.state_keys, seed=6)
    mask = torch.ones(20, dtype=torch.bool)
    mask[15:] = False
    td["collector", "mask"] = mask
    GAE(0.9, 0.9, critic, average_gae=True)(td)
    adv = td["advantage"].squeeze(-1)[mask]
    assert abs(adv.mean().item()) < 1e-5
    assert abs(adv.std(unbiased=False).item() - 1) < 1e-4


def test_feed_forward_critic_and_recurrent_mode():
    seen = []

    def value(obs):
        seen.append(recurrent_mode())
        return obs.sum(-1, keepdim=True)

    critic = Mod(value, in_keys=["obs"], out_keys=["state_value"])
    td = make_batch((2, 5), states=(), seed=7)
    GAE(0.9, 1.0, critic)(td)
    assert seen[0] is True  # the sequence pass runs in recurrent mode
    nv = td["next", "obs"].sum(-1, keepdim=True)
    v = td["obs"].sum(-1, keepdim=True)
    adv, _ = generalized_advantage_estimate(0.9, 1.0, v, nv, td["next", "reward"],
                                            td["next", "done"], td["next", "terminated"],
                                            time_dim=-2)  # fmt: skip
    torch.testing.assert_close(td["advantage"], adv)


def test_errors():
    critic, _ = recurrent_critic("gru")
    with pytest.raises(ValueError, match="gamma"):
        GAE(1.5, 0.9, critic)
    with pytest.raises(ValueError, match="value_network"):
        GAE(0.9, 0.9, torch.nn.Linear(2, 1))
    td = make_batch((5,), seed=8)
    with pytest.raises(KeyError, match="done"):
        GAE(0.9, 0.9, critic)(td.exclude(("next", "done")))
    with pytest.raises(KeyError, match="is_init"):  # the recurrent critic needs it
        GAE(0.9, 0.9, critic)(td.exclude("is_init"))
    with pytest.raises(ValueError, match="valid keys"):
        GAE(0.9, 0.9, critic).set_keys(advantages="a")


def _terminating_rows(td):
    """``td`` with every done step inside a row terminated (the last step may truncate):
    the data on which the reference's shifted=True gives the exact next values."""
    done, term = td["next", "done"], td["next", "terminated"].clone()
    term[..., :-1, :] = done[..., :-1, :]
    td["next", "terminated"] = term
    td["next", "truncated"] = done & ~term
    return td


@pytest.mark.parametrize("kind", ["gru", "lstm", None])
@pytest.mark.parametrize("shape", [(17,), (3, 8)])
@pytest.mark.parametrize("cls", [GAE, TDLambdaEstimator])
def test_shifted_equals_unshifted_where_rows_end_by_termination(kind, shape, cls):
    if kind is None:
        critic = Mod(torch.nn.Linear(3, 1), ["obs"], ["state_value"])
        states = ()
    else:
        critic, rnn = recurrent_critic(kind)
        states = rnn.state_keys
    td = _terminating_rows(make_batch(shape, states=states, seed=3))
    shifted = cls(0.9, 0.8, critic, shifted=True)(td.clone())
    plain = cls(0.9, 0.8, critic)(td.clone())
    for key in ("advantage", "value_target", "state_value"):
        torch.testing.assert_close(shifted[key], plain[key], atol=1e-5, rtol=1e-5)
    if kind is not None:  # and both equal the step-by-step reference
        v, nv = loop_values(critic, rnn, td)
        reward, done = td["next", "reward"], td["next", "done"]
        adv, _ = generalized_advantage_estimate(
            0.9, 0.8, v, nv, reward, done, td["next", "terminated"], time_dim=-2
        )
        if cls is GAE:
            torch.testing.assert_close(shifted["advantage"], adv, atol=1e-5, rtol=1e-5)


def test_shifted_calls_the_critic_once():
    calls = []

    def value(obs):
        calls.append(obs.shape)
        return obs.sum(-1, keepdim=True)

    td = _terminating_rows(make_batch((2, 6), states=(), seed=4))
    GAE(0.9, 0.8, Mod(value, ["obs"], ["state_value"]), shifted=True)(td)
    assert calls == [torch.Size([2, 7, 3])]  # T + 1 steps, one call


def test_shifted_refuses_a_truncation_inside_a_row():
    critic, rnn = recurrent_critic("gru")
    td = _terminating_rows(make_batch((2, 6), states=rnn.state_keys, seed=5))
    td["next", "done"][1, 2] = True
    td["next", "truncated"][1, 2] = True
    td["is_init"][1, 3] = True
    with pytest.raises(ValueError, match=r"shifted=True.*1 step\(s\) end a trajectory"):
        GAE(0.9, 0.8, critic, shifted=True)(td)
    GAE(0.9, 0.8, critic)(td)  # the default computes the exact bootstrap there
    with pytest.raises(TypeError, match="shifted to be a bool"):
        GAE(0.9, 0.8, critic, shifted="yes")
