"""DQNLoss against a hand-written reference on a recurrent Q-network; target updaters."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from tensordict.nn import TensorDictModule as Mod

from recurrl.objectives import DQNLoss, HardUpdate, SoftUpdate
from tests.objectives._helpers import loop_values, make_batch, recurrent_critic

N_ACT = 4


def _net(kind="gru"):
    return recurrent_critic(kind, out_key="action_value", out=N_ACT)


def _reference(loss, rnn, td, *, double, gamma, burn_in, mask=None, fn="smooth_l1", n_steps=1,
               fresh_starts=False):  # fmt: skip
    """Per-step loop: y_t = sum_{i<m} gamma^i r_{t+i} + gamma^m (1 - term) Q_tgt(s_{t+m}, a*)
    with m = n_steps or up to the sequence end; mean over kept steps (not the first burn_in
    of a sequence, unless it starts an episode and fresh_starts)."""
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
    n_t = rows.shape[1]

    def boot(i, t):
        a_star = int(q_next[i, t].argmax()) if double else int(q_next_tgt[i, t].argmax())
        return float(q_next_tgt[i, t, a_star])

    def seq_end(i, t):
        return t == n_t - 1 or bool(rows["next", "done"][i, t]) or bool(rows["is_init"][i, t + 1])

    for i in range(rows.shape[0]):
        since_start, exempt = 0, False
        for t in range(rows.shape[1]):
            if t == 0 or bool(rows["is_init"][i, t]):
                since_start = 0
                exempt = fresh_starts and int(rows["step_count"][i, t]) == 0
            a = int(rows["action"][i, t])
            y, disc = 0.0, 1.0
            for s in range(t, t + n_steps):
                y += disc * float(rows["next", "reward"][i, s])
                if rows["next", "terminated"][i, s]:
                    break
                if s == t + n_steps - 1 or seq_end(i, s):
                    y += disc * gamma * boot(i, s)
                    break
                disc *= gamma
            if (since_start >= burn_in or exempt) and keep[i, t]:
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


@pytest.mark.parametrize("double", [True, False])
@pytest.mark.parametrize("n_steps", [2, 5])
@pytest.mark.parametrize("shape", [(20,), (3, 9)])
def test_n_step_matches_reference(double, n_steps, shape):
    net, rnn = _net("gru")
    loss = DQNLoss(net, double_dqn=double, gamma=0.9, burn_in=1, n_steps=n_steps)
    _perturb_target(loss)
    td = make_batch(shape, states=rnn.state_keys, seed=6, n_actions=N_ACT)
    ref = _reference(loss, rnn, td, double=double, gamma=0.9, burn_in=1, n_steps=n_steps)
    torch.testing.assert_close(loss(td)["loss"], ref, atol=1e-5, rtol=1e-5)


def test_n_step_target_by_hand():
    # Q = 0 everywhere (zero head): the target is the discounted reward sum up to the
    # sequence end, cut by the slice start at t=3 and the terminal step t=4
    q, td = _constant_q(0.0), _by_hand_batch()
    loss = DQNLoss(q, gamma=0.5, n_steps=3, loss_function="l1")
    # targets: 1 + 1 + 1 = 3, 2 + 2 = 4, 4, 8 + 8 = 16, 16, 32 (|0 - y| averaged)
    torch.testing.assert_close(loss(td)["loss"], torch.tensor((3 + 4 + 4 + 16 + 16 + 32) / 6))


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


@pytest.mark.parametrize("layout", ["flat", "grid", "padded"])
def test_burned_in_steps_never_reach_the_loss(layout):
    """The gradient w.r.t. the chosen Q-value (and so the loss's dependence on the target) is
    zero at the first burn_in steps of every slice, non-zero after; flat ragged, [B, T] and
    padded slices alike."""
    net, rnn = _net("lstm")
    burn_in = 2
    q_seen = {}

    class Spy(torch.nn.Module):  # keeps the action values to read their gradient
        def forward(self, x):
            x = x.clone().requires_grad_(True) if not x.requires_grad else x
            x.retain_grad()
            q_seen.setdefault("q", x)
            return x

    spy = Mod(Spy(), ["action_value"], ["action_value"])
    from tensordict.nn import TensorDictSequential as Seq

    loss = DQNLoss(Seq(net, spy), burn_in=burn_in, n_steps=2)
    lengths = [5, 3, 4]  # three slices from stored states
    td = make_batch((12,), states=rnn.state_keys, seed=7, n_actions=N_ACT)
    td["next", "done"][:] = False
    td["next", "terminated"][:] = False
    td["is_init"][:] = False
    starts = torch.tensor([0, 5, 8])
    td["is_init"][starts] = True
    td["next", "done"][starts[1:] - 1] = True
    td["next", "done"][-1] = True
    expect = torch.ones(12, dtype=torch.bool)
    for start in starts.tolist():
        expect[start : start + burn_in] = False
    mask = None
    if layout == "grid":  # [3, 4]: three slices of 4 steps
        td, expect = td[:12].reshape(3, 4), torch.tensor([[0, 0, 1, 1]] * 3).bool()
        td["is_init"][:] = False
        td["is_init"][:, 0] = True
        td["next", "done"][:] = False
        td["next", "done"][:, -1] = True
    elif layout == "padded":  # [3 * 5] with ("collector", "mask"): 5, 3 and 4 real steps
        index, real = [], []
        for start, n in zip(starts.tolist(), lengths, strict=True):
            index += [start + i if i < n else start for i in range(5)]
            real += [i < n for i in range(5)]
        td = td[torch.tensor(index)]
        mask = torch.tensor(real)
        td["is_init"] = (torch.arange(15) % 5 == 0).unsqueeze(-1) | ~mask.unsqueeze(-1)
        td["collector", "mask"] = mask
        expect = mask & torch.tensor([i % 5 >= burn_in for i in range(15)])
    out = loss(td)
    out["loss"].backward()
    grad = q_seen["q"].grad.abs().sum(-1)
    assert ((grad > 0) == expect).all()
    # changing rewards at burned-in steps (the targets there) leaves the loss unchanged
    td2 = td.clone()
    td2["next", "reward"][~expect] += 100.0
    torch.testing.assert_close(loss(td2)["loss"].detach(), out["loss"].detach())


def test_burn_in_skips_sequences_that_start_an_episode():
    # three slices: mid-episode (4 steps), episode start (3 steps), mid-episode (5 steps)
    q = Mod(torch.nn.Linear(1, 2), ["obs"], ["action_value"])
    is_init = torch.tensor([1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0]).bool().unsqueeze(-1)
    step_count = torch.tensor([5, 6, 7, 8, 0, 1, 2, 3, 4, 5, 6, 7]).unsqueeze(-1)
    td = TensorDict({"is_init": is_init, "step_count": step_count}, [12])
    strict = DQNLoss(q, burn_in=2)
    fresh = DQNLoss(q, burn_in=2, burn_in_episode_starts=False)
    assert strict._burned_in(td).int().tolist() == [1, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0, 0]
    assert fresh._burned_in(td).int().tolist() == [1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0]
    with pytest.raises(KeyError, match="StepCounter"):
        fresh._burned_in(td.exclude("step_count"))
    with pytest.raises(KeyError, match="is_init"):
        strict._burned_in(td.exclude("is_init"))


@pytest.mark.parametrize("burn_in", [0, 3])
def test_fresh_episode_starts_match_reference(burn_in):
    net, rnn = _net("gru")
    loss = DQNLoss(net, burn_in=burn_in, n_steps=2, burn_in_episode_starts=False)
    td = make_batch((2, 10), states=rnn.state_keys, seed=8, n_actions=N_ACT)
    td["step_count"] = torch.randint(0, 2, (2, 10, 1))  # some sequences start episodes
    ref = _reference(loss, rnn, td, double=True, gamma=0.99, burn_in=burn_in, n_steps=2,
                     fresh_starts=True)  # fmt: skip
    torch.testing.assert_close(loss(td)["loss"], ref, atol=1e-5, rtol=1e-5)


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
    with pytest.raises(ValueError, match="burn_in"):
        DQNLoss(q, burn_in=1.5)
    with pytest.raises(ValueError, match="n_steps"):
        DQNLoss(q, n_steps=0)
    with pytest.raises(ValueError, match="delay_value=True"):
        HardUpdate(DQNLoss(q, delay_value=False))
    with pytest.raises(ValueError, match="tau"):
        SoftUpdate(DQNLoss(q), tau=0.0)
    with pytest.raises(ValueError, match="valid keys"):
        DQNLoss(q).set_keys(qvalue="q")


# -- burn-in gradients, prioritized replay, value rescaling ---------------------------------
def _by_hand_batch():
    """Six steps, two slices (starts 0 and 3), the second ends in a terminal step; with a
    zero Q-head the l1 step losses are the targets 3, 4, 4, 16, 16, 32 (gamma 0.5, 3 steps)."""
    z = torch.zeros(6, 1, dtype=torch.bool)
    return TensorDict({
        "obs": torch.zeros(6, 1), "action": torch.zeros(6, dtype=torch.long),
        "is_init": z.clone().index_fill_(0, torch.tensor([0, 3]), True),
        "next": {"obs": torch.zeros(6, 1), "reward": torch.tensor([1.0, 2, 4, 8, 16, 32])[:, None],
                 "done": z.clone().index_fill_(0, torch.tensor([4, 5]), True),
                 "terminated": z.clone().index_fill_(0, torch.tensor([4]), True)},
    }, [6])  # fmt: skip


def _constant_q(value: float = 0.0):
    q = Mod(torch.nn.Linear(1, 2), ["obs"], ["action_value"])
    torch.nn.init.zeros_(q.module.weight)
    torch.nn.init.constant_(q.module.bias, value)
    return q


def _cut_batch(states, layout):
    """Three slices from stored states (starts 0, 5, 8 of 12 steps), as a flat ragged batch,
    or padded to 5 steps with ("collector", "mask"), or a [3, 4] grid; with the burn-in (2
    steps) of each slice."""
    td = make_batch((12,), states=states, seed=9, n_actions=N_ACT)
    td["next", "done"][:] = False
    td["next", "terminated"][:] = False
    td["is_init"][:] = False
    td["is_init"][torch.tensor([0, 5, 8])] = True
    burned = torch.zeros(12, dtype=torch.bool)
    burned[torch.tensor([0, 1, 5, 6, 8, 9])] = True
    if layout == "grid":
        td, burned = td.reshape(3, 4), torch.tensor([[1, 1, 0, 0]] * 3).bool()
        td["is_init"][:] = False
        td["is_init"][:, 0] = True
    elif layout == "padded":
        index = [0, 1, 2, 3, 4, 5, 6, 7, 5, 5, 8, 9, 10, 11, 8]
        real = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0]).bool()
        td, burned = td[torch.tensor(index)], burned[torch.tensor(index)] & real
        td["is_init"] = (torch.arange(15) % 5 == 0).unsqueeze(-1) | ~real.unsqueeze(-1)
        td["collector", "mask"] = real
    return td, burned


def _obs_and_state_grads(loss, td, states):
    td = td.clone()
    for key in ("obs", *states):
        td[key].requires_grad_(True)
    out = loss(td)
    out["loss"].backward()
    return out["loss"].detach(), td["obs"].grad.abs().sum(-1), td


def test_burn_in_observations_get_no_gradient_from_a_feed_forward_network():
    """The burned-in steps' own Q-values are out of the loss and bootstrap values carry no
    gradient: with a feed-forward network their observations get none."""
    td, burned = _cut_batch((), "flat")
    ff = Mod(torch.nn.Linear(3, N_ACT), ["obs"], ["action_value"])
    for stop in (False, True):
        _, grad, _ = _obs_and_state_grads(DQNLoss(ff, burn_in=2, burn_in_stop_gradient=stop),
                                          td, ())  # fmt: skip
        assert (grad[~burned] > 0).all() and (grad[burned] == 0).all()


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("layout", ["flat", "grid", "padded"])
def test_burn_in_stop_gradient_isolates_the_burn_in(kind, layout):
    """burn_in_stop_gradient=True (R2D2): the same loss, but no gradient reaches the burn-in
    steps' observations nor the stored states; by default (False) it does, through the hidden
    state of the trained steps."""
    net, rnn = _net(kind)
    td, burned = _cut_batch(rnn.state_keys, layout)
    real = td.get(("collector", "mask"), torch.ones(burned.shape, dtype=torch.bool))
    trained = real & ~burned
    plain = DQNLoss(net, burn_in=2, n_steps=2)
    _perturb_target(plain)
    stop = DQNLoss(net, burn_in=2, n_steps=2, burn_in_stop_gradient=True)
    stop.target_value_network.load_state_dict(plain.target_value_network.state_dict())
    value, grad, seen = _obs_and_state_grads(plain, td, rnn.state_keys)
    assert (grad[burned] > 0).any()  # through the hidden state
    value_stop, grad_stop, seen_stop = _obs_and_state_grads(stop, td, rnn.state_keys)
    torch.testing.assert_close(value_stop, value, rtol=1e-5, atol=1e-6)
    assert (grad_stop[burned] == 0).all() and (grad_stop[trained] > 0).all()
    for key in rnn.state_keys:  # the stored states (read at slice starts) get none either
        assert seen_stop[key].grad is None or (seen_stop[key].grad == 0).all()
        assert seen[key].grad is not None and seen[key].grad.abs().sum() > 0
    assert "td_error" in seen_stop  # the input of the call is still the one written


@pytest.mark.parametrize("burn_in", [0, 1])
def test_importance_weights_by_hand(burn_in):
    td = _by_hand_batch()
    w = torch.tensor([1.0, 0.5, 0.25, 1.0, 0.1, 0.8])
    td["_weight"] = w
    loss = DQNLoss(_constant_q(), gamma=0.5, n_steps=3, loss_function="l1", burn_in=burn_in)
    y = torch.tensor([3.0, 4, 4, 16, 16, 32])
    kept = torch.tensor([True] * 6) if burn_in == 0 else torch.tensor([0, 1, 1, 0, 1, 1]).bool()
    # mean of w_t * l_t over the K steps in the loss (not divided by the sum of the weights)
    expect = (w * y)[kept].sum() / kept.sum()
    torch.testing.assert_close(loss(td)["loss"], expect)
    td["_weight"] = w.unsqueeze(-1)  # [*B, 1] as well
    torch.testing.assert_close(loss(td)["loss"], expect)
    # padded steps (mask False, weight 0 from the sampler) stay out of the count
    td["collector", "mask"] = torch.tensor([1, 1, 1, 1, 1, 0]).bool()
    kept[5] = False
    torch.testing.assert_close(loss(td)["loss"], (w * y)[kept].sum() / kept.sum())


def test_td_errors_are_written_per_step_and_zero_out_of_the_loss():
    from recurrl.functional import sequence_priority

    td = _by_hand_batch()
    td["collector", "mask"] = torch.tensor([1, 1, 1, 1, 1, 0]).bool()
    loss = DQNLoss(_constant_q(), gamma=0.5, n_steps=3, loss_function="l1", burn_in=1)
    out = loss(td)
    assert td["td_error"].tolist() == [0.0, 4.0, 4.0, 0.0, 16.0, 0.0]  # burn-in, padding: 0
    assert not td["td_error"].requires_grad
    torch.testing.assert_close(out["td_error"], torch.tensor(8.0))  # mean over the loss steps
    keep = loss.loss_mask(td)
    assert keep.tolist() == [False, True, True, False, True, False]
    first, prio = sequence_priority(td["td_error"], td["is_init"].squeeze(-1), keep, eta=0.5)
    assert first.tolist() == [0, 3]
    torch.testing.assert_close(prio, torch.tensor([4.0, 16.0]))
    # a burn-in step's error (here a huge reward there) changes no priority
    td2 = td.clone()
    td2["next", "reward"][0] += 1000.0
    td2["next", "reward"][3] += 1000.0
    loss(td2)
    again = sequence_priority(td2["td_error"], td2["is_init"].squeeze(-1), keep, eta=0.5)
    torch.testing.assert_close(again[1], prio)
    # renamed key
    loss.set_keys(priority="priority")
    loss(td)
    assert td["priority"].tolist() == td["td_error"].tolist()


def test_value_rescaling_target_by_hand():
    from recurrl.functional import signed_hyperbolic as h
    from recurrl.functional import signed_parabolic as h_inv

    td = _by_hand_batch()
    c = 3.0  # every Q-value (online and target)
    loss = DQNLoss(_constant_q(c), gamma=0.5, n_steps=1, loss_function="l1",
                   value_rescale=True)  # fmt: skip
    r = td["next", "reward"].squeeze(-1)
    term = td["next", "terminated"].squeeze(-1)
    boot = torch.where(term, torch.zeros(()), 0.5 * h_inv(torch.tensor(c)))
    target = h(r + boot)
    torch.testing.assert_close(loss(td)["loss"], (c - target).abs().mean())
    # 3-step: h(sum of rewards + gamma^m h^-1(Q')) with the cuts of the plain target
    loss3 = DQNLoss(_constant_q(c), gamma=0.5, n_steps=3, loss_function="l1",
                    value_rescale=True, value_rescale_eps=0.01)  # fmt: skip
    raw = h_inv(torch.tensor(c), 0.01)
    g = torch.stack([
        1 + 0.5 * 2 + 0.25 * 4 + 0.125 * raw, 2 + 0.5 * 4 + 0.25 * raw, 4 + 0.5 * raw,
        8 + 0.5 * 16 + 0 * raw, 16 + 0 * raw, 32 + 0.5 * raw,
    ])  # fmt: skip
    torch.testing.assert_close(loss3(td)["loss"], (c - h(g, 0.01)).abs().mean())
    # off by default: the plain target
    plain = DQNLoss(_constant_q(c), gamma=0.5, n_steps=1, loss_function="l1")
    expect = (c - (r + torch.where(term, 0.0, 0.5 * c))).abs().mean()
    torch.testing.assert_close(plain(td)["loss"], expect)


def test_value_rescale_errors():
    q = _constant_q()
    with pytest.raises(ValueError, match="value_rescale to be a bool"):
        DQNLoss(q, value_rescale=1)
    with pytest.raises(ValueError, match="value_rescale_eps"):
        DQNLoss(q, value_rescale=True, value_rescale_eps=-1e-3)


# -- the reference's spellings: action_space, SoftUpdate(eps=), a QValueModule in the net ---
def test_soft_update_eps_is_one_minus_tau():
    q = Mod(torch.nn.Linear(1, 1, bias=False), ["obs"], ["action_value"])
    loss = DQNLoss(q)
    with torch.no_grad():
        q.module.weight.fill_(1.0)
        loss.target_value_network.module.weight.fill_(0.0)
    SoftUpdate(loss, eps=0.95).step()  # target <- 0.95 * target + 0.05 * online
    torch.testing.assert_close(loss.target_value_network.module.weight, torch.full((1, 1), 0.05))
    assert SoftUpdate(loss).tau == 0.005  # recurrl's default, unchanged
    with pytest.raises(ValueError, match="one of tau and eps"):
        SoftUpdate(loss, tau=0.1, eps=0.9)
    with pytest.raises(ValueError, match=r"eps \(the target's weight\) in \[0, 1\)"):
        SoftUpdate(loss, eps=1.0)


def _one_step_batch(action):
    return TensorDict({
        "obs": torch.eye(2), "action": action,
        "is_init": torch.tensor([[True], [False]]),
        "next": {"obs": torch.eye(2).flip(0), "reward": torch.tensor([[1.0], [2.0]]),
                 "done": torch.tensor([[False], [True]]),
                 "terminated": torch.tensor([[False], [True]])}}, [2])  # fmt: skip


def test_action_space_reads_one_hot_and_categorical_actions():
    from recurrl.envs import Categorical, OneHot
    from recurrl.modules import QValueModule

    lin = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))  # Q(e0) = [1, 3], Q(e1) = [2, 4]
    # a QValueModule inside the value network (as the tutorial builds it) must not overwrite
    # the batch's actions
    from tensordict.nn import TensorDictSequential

    q = TensorDictSequential(Mod(lin, ["obs"], ["action_value"]), QValueModule("categorical"))
    # step 0: a = 0, Q = 1, target = 1 + 0.5 * Q(e1)[argmax] = 1 + 0.5 * 4 = 3 -> l1 error 2
    # step 1: a = 0, Q = 2, terminal: target = 2 -> error 0
    expected = (2.0 + 0.0) / 2
    for space, action in [
        ("categorical", torch.tensor([0, 0])),
        (Categorical(2), torch.tensor([[0], [0]])),
        ("one_hot", torch.tensor([[1, 0], [1, 0]])),  # an int64 one-hot: read as one-hot
        (OneHot(2), torch.tensor([[True, False], [True, False]])),
    ]:
        loss = DQNLoss(q, action_space=space, gamma=0.5, delay_value=False, loss_function="l1")
        td = _one_step_batch(action)
        assert loss(td)["loss"].item() == pytest.approx(expected)
        assert torch.equal(td["action"], action)  # the greedy action did not replace it
    with pytest.raises(ValueError, match="expected action_space in"):
        DQNLoss(q, action_space="binary")
