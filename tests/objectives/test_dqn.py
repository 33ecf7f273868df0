"""DQNLoss against a hand-written reference on a recurrent Q-network; target updaters."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tensordict.nn import TensorDictModule as Mod

from recurrl.objectives import DQNLoss, HardUpdate, SoftUpdate
from tests.objectives._helpers import loop_values, make_batch, recurrent_critic

N_ACT = 4


def _net(kind="gru"):
    return recurrent_critic(kind, out_key="action_value", out=N_ACT)


def _reference(loss, rnn, td, *, double, gamma, burn_in, mask=None, fn="smooth_l1"):
    """Per-step loop: y_t = r_t + gamma (1 - term_t) Q_tgt(s_{t+1}, a*), mean over kept steps."""
    q, q_next = loop_values(loss.value_network, rnn, td, "action_value")
    target_net = loss.target_value_network or loss.value_network
    tgt_rnn = next(m for m in target_net.modules() if type(m) is type(rnn))
    _, q_next_tgt = loop_values(target_net, tgt_rnn, td, "action_value")
    rows = td.reshape(-1, td.shape[-1]) if td.batch_dims > 1 else td.unsqueeze(0)
    q = q.reshape(rows.shape[0], rows.shape[1], N_ACT)
    q_next = q_next.reshape_as(q)
    q_next_tgt = q_next_tgt.reshape_as(q)
    keep = torch.ones(rows.shape, dtype=torch.bool) if mask is None else mask.reshape(rows.shape)
    terms = []
    for i in range(rows.shape[0]):
        since_start = 0
        for t in range(rows.shape[1]):
            if t > 0 and bool(rows["is_init"][i, t]):
                since_start = 0
            a = int(rows["action"][i, t])
            a_star = int(q_next[i, t].argmax()) if double else int(q_next_tgt[i, t].argmax())
            boot = 0.0 if rows["next", "terminated"][i, t] else float(q_next_tgt[i, t, a_star])
            y = float(rows["next", "reward"][i, t]) + gamma * boot
            if since_start >= burn_in and keep[i, t]:
                if fn == "smooth_l1":
                    terms.append(F.smooth_l1_loss(q[i, t, a], torch.tensor(y)))
                else:
                    terms.append((q[i, t, a] - y) ** 2)
            since_start += 1
    return torch.stack(terms).mean()


def _perturb_target(loss):
    with torch.no_grad():
        for p in loss.target_value_network.parameters():
            p.add_(0.3 * torch.randn_like(p))


@pytest.mark.parametrize("double", [True, False])
@pytest.mark.parametrize("burn_in", [0, 2])
@pytest.mark.parametrize("shape", [(20,), (3, 7)])
def test_matches_reference(double, burn_in, shape):
    net, rnn = _net("lstm")
    loss = DQNLoss(net, double_dqn=double, gamma=0.9, burn_in=burn_in)
    _perturb_target(loss)  # online and target differ, so double DQN matters
    td = make_batch(shape, states=rnn.state_keys, seed=1, n_actions=N_ACT)
    out = loss(td)
    ref = _reference(loss, rnn, td, double=double, gamma=0.9, burn_in=burn_in)
    torch.testing.assert_close(out["loss"], ref, atol=1e-5, rtol=1e-5)


def test_l2_no_target_and_mask():
    net, rnn = _net("gru")
    loss = DQNLoss(net, double_dqn=False, gamma=0.8, delay_value=False, loss_function="l2")
    assert loss.target_value_network is None
    td = make_batch((16,), states=rnn.state_keys, seed=2, n_actions=N_ACT)
    mask = torch.rand(16) > 0.3
    td["collector", "mask"] = mask
    out = loss(td)
    ref = _reference(loss, rnn, td, double=False, gamma=0.8, burn_in=0, mask=mask, fn="l2")
    torch.testing.assert_close(out["loss"], ref, atol=1e-5, rtol=1e-5)


def test_one_hot_actions_equal_index_actions():
    net, rnn = _net("gru")
    loss = DQNLoss(net)
    td = make_batch((3, 5), states=rnn.state_keys, seed=3, n_actions=N_ACT)
    out = loss(td)
    td1 = td.clone()
    td1["action"] = F.one_hot(td["action"], N_ACT).float()
    torch.testing.assert_close(loss(td1)["loss"], out["loss"])


def test_burn_in_warms_up_from_stored_state():
    net, rnn = _net("gru")
    loss = DQNLoss(net, burn_in=3)
    td = make_batch((1, 8), states=rnn.state_keys, seed=4, n_actions=N_ACT)
    td["is_init"][:] = False
    td["next", "done"][:] = False
    td["next", "done"][0, -1] = True
    base = loss(td)["loss"]
    # rewards of burn-in steps do not enter the loss ...
    td2 = td.clone()
    td2["next", "reward"][0, :3] += 100.0
    torch.testing.assert_close(loss(td2)["loss"], base)
    # ... but the stored state at the slice start does (the warm-up starts from it)
    td3 = td.clone()
    td3["recurrent_state"][0, 0] += 1.0
    assert not torch.allclose(loss(td3)["loss"], base)


def test_gradients_reach_online_not_target():
    net, rnn = _net("lstm")
    loss = DQNLoss(net, burn_in=1)
    td = make_batch((12,), states=rnn.state_keys, seed=5, n_actions=N_ACT)
    loss(td)["loss"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in rnn.parameters())
    assert all(p.grad is None for p in loss.target_value_network.parameters())


def test_hard_and_soft_update():
    net, _ = _net("gru")
    loss = DQNLoss(net)
    online = dict(net.named_parameters())
    target = dict(loss.target_value_network.named_parameters())
    for p in online.values():
        p.data.add_(1.0)
    hard = HardUpdate(loss, value_network_update_interval=3)
    hard.step(), hard.step()
    assert not any(torch.equal(online[n], target[n]) for n in online)
    hard.step()
    assert all(torch.equal(online[n], target[n]) for n in online)
    old = {n: t.clone() for n, t in target.items()}
    for p in online.values():
        p.data.add_(1.0)
    SoftUpdate(loss, tau=0.25).step()
    for n in online:
        torch.testing.assert_close(target[n], 0.75 * old[n] + 0.25 * online[n])


def test_errors():
    q = Mod(torch.nn.Linear(3, N_ACT), ["obs"], ["action_value"])
    with pytest.raises(ValueError, match="loss_function"):
        DQNLoss(q, loss_function="huber")
    with pytest.raises(ValueError, match="burn_in"):
        DQNLoss(q, burn_in=-1)
    with pytest.raises(ValueError, match="delay_value=True"):
        HardUpdate(DQNLoss(q, delay_value=False))
    with pytest.raises(ValueError, match="tau"):
        SoftUpdate(DQNLoss(q), tau=0.0)
    with pytest.raises(ValueError, match="valid keys"):
        DQNLoss(q).set_keys(qvalue="q")
