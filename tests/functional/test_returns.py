"""Return estimators against hand-written per-step loops and closed forms."""

from __future__ import annotations

import pytest
import torch

from recurrl.functional.returns import (
    generalized_advantage_estimate,
    td0_return_estimate,
    td_lambda_return_estimate,
)


def _random_batch(b: int = 3, t: int = 9, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(b, t, generator=g)
    nv = torch.randn(b, t, generator=g)
    r = torch.randn(b, t, generator=g)
    term = torch.rand(b, t, generator=g) < 0.15
    trunc = torch.rand(b, t, generator=g) < 0.15
    return v, nv, r, term | trunc, term


def _gae_loop(gamma, lmbda, v, nv, r, done, term):
    b, t = r.shape
    adv = torch.zeros(b, t)
    for i in range(b):
        a = 0.0
        for s in reversed(range(t)):
            boot = 0.0 if term[i, s] else float(nv[i, s])
            delta = float(r[i, s]) + gamma * boot - float(v[i, s])
            a = delta + (0.0 if done[i, s] or s == t - 1 else gamma * lmbda * a)
            adv[i, s] = a
    return adv


def _td_lambda_loop(gamma, lmbda, nv, r, done, term):
    b, t = r.shape
    out = torch.zeros(b, t)
    for i in range(b):
        g = 0.0
        for s in reversed(range(t)):
            if term[i, s]:
                g = float(r[i, s])
            elif done[i, s] or s == t - 1:
                g = float(r[i, s]) + gamma * float(nv[i, s])
            else:
                g = float(r[i, s]) + gamma * ((1 - lmbda) * float(nv[i, s]) + lmbda * g)
            out[i, s] = g
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("lmbda", [0.0, 0.9, 1.0])
def test_gae_matches_loop(seed, lmbda):
    v, nv, r, done, term = _random_batch(seed=seed)
    assert done.any() and term.any() and (done & ~term).any()
    adv, target = generalized_advantage_estimate(0.97, lmbda, v, nv, r, done, term)
    ref = _gae_loop(0.97, lmbda, v, nv, r, done, term)
    torch.testing.assert_close(adv, ref)
    torch.testing.assert_close(target, ref + v)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("lmbda", [0.0, 0.5, 1.0])
def test_td_lambda_matches_loop(seed, lmbda):
    _, nv, r, done, term = _random_batch(seed=seed)
    out = td_lambda_return_estimate(0.9, lmbda, nv, r, done, term)
    torch.testing.assert_close(out, _td_lambda_loop(0.9, lmbda, nv, r, done, term))


def test_td_lambda_zero_is_td0():
    _, nv, r, done, term = _random_batch(seed=3)
    torch.testing.assert_close(
        td_lambda_return_estimate(0.9, 0.0, nv, r, done, term),
        td0_return_estimate(0.9, nv, r, term),
    )


def test_gae_lambda_one_target_equals_td_lambda_one():
    # With lmbda = 1, the GAE value target is the bootstrapped Monte-Carlo return only when
    # the critic is consistent (V(s_{t+1}) == next V); use a consistent critic.
    g = torch.Generator().manual_seed(4)
    values = torch.randn(2, 8, generator=g)
    v, nv = values[:, :-1], values[:, 1:]
    r = torch.randn(2, 7, generator=g)
    flags = torch.zeros(2, 7, dtype=torch.bool)
    flags[0, 3] = True
    _, target = generalized_advantage_estimate(0.9, 1.0, v, nv, r, flags, flags)
    torch.testing.assert_close(target, td_lambda_return_estimate(0.9, 1.0, nv, r, flags, flags))


def test_closed_form_reward_at_last_step():
    # Reward r only at the last (terminal) step, constant critic c:
    # delta_t = gamma c - c for t < T-1 and r - c at T-1, so with lmbda = 1
    # A_t = gamma^(T-1-t) r + sum_k gamma^k (gamma c - c) ... = gamma^(T-1-t) r - c.
    gamma, r, c, t = 0.9, 2.0, 0.5, 5
    v = torch.full((t,), c)
    reward = torch.zeros(t)
    reward[-1] = r
    term = torch.zeros(t, dtype=torch.bool)
    term[-1] = True
    adv, target = generalized_advantage_estimate(gamma, 1.0, v, v, reward, term, term)
    expected = torch.tensor([gamma ** (t - 1 - s) * r - c for s in range(t)])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(target, expected + c)
    # zero critic, lmbda < 1: A_t = (gamma lmbda)^(T-1-t) r
    z = torch.zeros(t)
    adv, _ = generalized_advantage_estimate(gamma, 0.8, z, z, reward, term, term)
    torch.testing.assert_close(adv, torch.tensor([(gamma * 0.8) ** (t - 1 - s) * r
                                                  for s in range(t)]))  # fmt: skip
    # hand-written values: gamma = 0.5, T = 3, r = 1, zero critic
    adv, _ = generalized_advantage_estimate(0.5, 1.0, z[:3], z[:3], torch.tensor([0, 0, 1.0]),
                                            term[-3:], term[-3:])  # fmt: skip
    assert adv.tolist() == [0.25, 0.5, 1.0]


def test_truncated_and_terminated_differ_by_bootstrap():
    gamma, lmbda = 0.9, 0.7
    v, nv, r, _, _ = _random_batch(b=1, t=6, seed=5)
    done = torch.zeros(1, 6, dtype=torch.bool)
    done[0, 2] = True
    no_term = torch.zeros_like(done)
    adv_trunc, _ = generalized_advantage_estimate(gamma, lmbda, v, nv, r, done, no_term)
    adv_term, _ = generalized_advantage_estimate(gamma, lmbda, v, nv, r, done, done)
    diff = adv_trunc - adv_term
    # steps 0..2 see the bootstrap gamma V(s_3) discounted by (gamma lmbda)^(2 - t)
    expected = torch.zeros(1, 6)
    for s in range(3):
        expected[0, s] = (gamma * lmbda) ** (2 - s) * gamma * nv[0, 2]
    torch.testing.assert_close(diff, expected)
    ret_trunc = td_lambda_return_estimate(gamma, lmbda, nv, r, done, no_term)
    ret_term = td_lambda_return_estimate(gamma, lmbda, nv, r, done, done)
    torch.testing.assert_close(ret_trunc - ret_term, expected)


def test_time_dim_minus_two_and_batch_dims():
    v, nv, r, done, term = _random_batch(b=4, t=7, seed=6)
    adv, target = generalized_advantage_estimate(0.9, 0.9, v, nv, r, done, term)
    u = lambda x: x.view(2, 2, 7).unsqueeze(-1)  # noqa: E731
    adv3, target3 = generalized_advantage_estimate(0.9, 0.9, u(v), u(nv), u(r), u(done),
                                                   u(term), time_dim=-2)  # fmt: skip
    assert adv3.shape == (2, 2, 7, 1)
    torch.testing.assert_close(adv3, u(adv))
    torch.testing.assert_close(target3, u(target))
    ret = td_lambda_return_estimate(0.9, 0.9, u(nv), u(r), u(done), u(term), time_dim=-2)
    torch.testing.assert_close(ret, u(td_lambda_return_estimate(0.9, 0.9, nv, r, done, term)))


def test_shape_mismatch_error():
    with pytest.raises(ValueError, match="expected shape"):
        generalized_advantage_estimate(0.9, 0.9, torch.zeros(3), torch.zeros(3), torch.zeros(4),
                                       torch.zeros(4).bool(), torch.zeros(4).bool())  # fmt: skip


def test_gradients_flow_to_values():
    v, nv, r, done, term = _random_batch(seed=7)
    v.requires_grad_(True)
    adv, _ = generalized_advantage_estimate(0.9, 0.9, v, nv, r, done, term)
    adv.sum().backward()
    assert v.grad is not None


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_flags_select_so_nothing_non_finite_crosses_them(poison):
    """A value behind a ``terminated`` step, or a whole trajectory after a ``done`` step, may
    be non-finite (a terminal observation, a diverged episode in the same row): the results
    before it are those of the same batch with finite numbers there, bit for bit."""
    v, nv, r, done, term = _random_batch(b=4, t=12, seed=3)
    done[:, 5] = True  # every row: trajectory A is steps 0..5, B is steps 6..
    term[:, 2] = True
    done |= term
    hidden = torch.zeros_like(done)  # what steps 0..5 must never read
    hidden[:, 6:] = True
    nv_bad, r_bad, v_bad = nv.clone(), r.clone(), v.clone()
    nv_bad[:, 2] = poison  # the terminal step's next value
    nv_bad[hidden], r_bad[hidden], v_bad[hidden] = poison, poison, poison
    keep = ~hidden
    adv, target = generalized_advantage_estimate(0.9, 0.8, v_bad, nv_bad, r_bad, done, term)
    adv_ok, target_ok = generalized_advantage_estimate(0.9, 0.8, v, nv, r, done, term)
    assert torch.equal(adv[keep], adv_ok[keep]) and torch.equal(target[keep], target_ok[keep])
    lam = td_lambda_return_estimate(0.9, 0.8, nv_bad, r_bad, done, term)
    assert torch.equal(lam[keep], td_lambda_return_estimate(0.9, 0.8, nv, r, done, term)[keep])
    td0 = td0_return_estimate(0.9, nv_bad, r_bad, term)
    assert torch.equal(td0[keep], td0_return_estimate(0.9, nv, r, term)[keep])
    assert torch.isfinite(adv[keep]).all() and torch.isfinite(lam[keep]).all()
