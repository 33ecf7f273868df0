"""ClipPPOLoss against a hand-written PPO loss; masking, recurrent mode, shared trunks."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq

from recurrl.modules import GRUModule, recurrent_mode, set_recurrent_mode
from recurrl.objectives import GAE, ClipPPOLoss
from tests.objectives._helpers import HID, OBS, make_batch


def _shared(n_out: int, continuous: bool = False):
    trunk = GRUModule(input_size=OBS, hidden_size=HID, in_key="obs", out_key="feat")
    if continuous:
        head = torch.nn.Linear(HID, 2 * n_out)

        def params(feat):
            loc, s = head(feat).chunk(2, -1)
            return loc, torch.nn.functional.softplus(s) + 0.1

        actor = Seq(trunk, Mod(params, in_keys=["feat"], out_keys=["loc", "scale"]))
        actor.head = head
    else:
        actor = Seq(trunk, Mod(torch.nn.Linear(HID, n_out), in_keys=["feat"],
                               out_keys=["logits"]))  # fmt: skip
    critic = Seq(trunk, Mod(torch.nn.Linear(HID, 1), in_keys=["feat"], out_keys=["state_value"]))
    return actor, critic, trunk


def _data(shape, *, continuous=False, seed=0):
    td = make_batch(shape, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    if continuous:
        td["action"] = torch.rand(*shape, 2, generator=g) * 1.8 - 0.9
    else:
        td["action"] = torch.randint(0, 3, shape, generator=g)
    td["sample_log_prob"] = -torch.rand(*shape, generator=g) - 0.5
    return td


def _reference(actor, critic, td, *, eps, ent_coef, critic_coef, dist, clip_value=None,
               mask=None, normalize=False):  # fmt: skip
    """Hand-written PPO: one formula per line, plain means over the kept steps."""
    keep = torch.ones(td.shape, dtype=torch.bool) if mask is None else mask
    a_out = actor(td.copy())
    if dist == "categorical":
        d = torch.distributions.Categorical(logits=a_out["logits"])
    elif dist == "normal":
        d = torch.distributions.Independent(
            torch.distributions.Normal(a_out["loc"], a_out["scale"]), 1
        )
    logp = d.log_prob(td["action"])
    adv = td["advantage"].squeeze(-1)
    if normalize:
        adv = (adv - adv[keep].mean()) / (adv[keep].std(unbiased=False) + 1e-8)
    ratio = torch.exp(logp - td["sample_log_prob"])
    surr = torch.min(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)
    v = critic(td.copy())["state_value"].squeeze(-1)
    tgt = td["value_target"].squeeze(-1)
    lv = 0.5 * (v - tgt) ** 2
    if clip_value is not None:
        old = td["state_value"].squeeze(-1)
        vc = old + torch.clamp(v - old, -clip_value, clip_value)
        lv = torch.max(lv, 0.5 * (vc - tgt) ** 2)
    ent = d.entropy()[keep].mean()
    return {
        "loss_objective": -surr[keep].mean(),
        "loss_critic": critic_coef * lv[keep].mean(),
        "loss_entropy": -ent_coef * ent,
        "entropy": ent,
        "kl_approx": (td["sample_log_prob"] - logp)[keep].mean(),
        "clip_fraction": ((ratio - 1).abs() > eps).float()[keep].mean(),
    }


@pytest.mark.parametrize("shape", [(16,), (3, 6)])
@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("clip_value", [None, 0.1])
def test_matches_reference(shape, continuous, clip_value):
    actor, critic, _ = _shared(2 if continuous else 3, continuous)
    td = _data(shape, continuous=continuous, seed=1)
    GAE(0.9, 0.95, critic)(td)
    td["sample_log_prob"] = td["sample_log_prob"] * 0.1 - 1.0  # some ratios get clipped
    loss = ClipPPOLoss(actor, critic, clip_epsilon=0.15, entropy_coef=0.03, critic_coef=0.7,
                       clip_value=clip_value)  # fmt: skip
    out = loss(td)
    with set_recurrent_mode(True):
        ref = _reference(actor, critic, td, eps=0.15, ent_coef=0.03, critic_coef=0.7,
                         dist="normal" if continuous else "categorical",
                         clip_value=clip_value)  # fmt: skip
    for key, value in ref.items():
        torch.testing.assert_close(out[key], value, msg=key)
    assert 0 < out["clip_fraction"] < 1 or continuous


def test_masked_padding_is_excluded():
    actor, critic, _ = _shared(3)
    td = _data((18,), seed=2)
    GAE(0.9, 0.95, critic)(td)
    mask = torch.ones(18, dtype=torch.bool)
    mask[[5, 6, 12, 17]] = False
    td["collector", "mask"] = mask
    loss = ClipPPOLoss(actor, critic, normalize_advantage=True)
    out = loss(td)
    # garbage in the padded steps must not change anything
    td2 = td.clone()
    td2["advantage"][~mask] = 1e6
    td2["value_target"][~mask] = -1e6
    td2["sample_log_prob"][~mask] = 50.0
    out2 = loss(td2)
    with set_recurrent_mode(True):
        ref = _reference(actor, critic, td, eps=0.2, ent_coef=0.01, critic_coef=1.0,
                         dist="categorical", mask=mask, normalize=True)  # fmt: skip
    for key, value in ref.items():
        torch.testing.assert_close(out[key], value, msg=key)
        torch.testing.assert_close(out2[key], value, msg=key)


def test_gradients_flow_into_shared_recurrent_trunk():
    actor, critic, trunk = _shared(3)
    td = _data((3, 5), seed=3)
    GAE(0.9, 0.95, critic)(td)
    for term in ("loss_objective", "loss_critic", "loss_entropy"):
        trunk.zero_grad()
        out = ClipPPOLoss(actor, critic)(td)
        out[term].backward()
        grads = [p.grad for p in trunk.parameters()]
        assert all(gr is not None and gr.abs().sum() > 0 for gr in grads), term


def test_actor_and_critic_run_in_recurrent_mode():
    seen = {"actor": [], "critic": []}

    def logits(obs):
        seen["actor"].append(recurrent_mode())
        return obs[..., :3]

    def value(obs):
        seen["critic"].append(recurrent_mode())
        return obs[..., :1]

    actor = Mod(logits, in_keys=["obs"], out_keys=["logits"])
    critic = Mod(value, in_keys=["obs"], out_keys=["state_value"])
    td = _data((6,), seed=4)
    td["advantage"] = torch.randn(6, 1)
    td["value_target"] = torch.randn(6, 1)
    ClipPPOLoss(actor, critic)(td)
    assert seen == {"actor": [True], "critic": [True]}


def test_recurrent_actor_matches_sequential_replay():
    # the loss's log-probs come from the recurrent pass: check against a step loop
    actor, critic, _ = _shared(3)
    td = _data((10,), seed=5)
    td["advantage"] = torch.ones(10, 1)
    td["value_target"] = torch.zeros(10, 1)
    out = ClipPPOLoss(actor, critic, entropy_coef=0.0)(td)
    logps = []
    state = None
    with torch.no_grad():
        for t in range(10):
            step = td[t].copy()
            if t == 0 or step["is_init"]:
                state = step["recurrent_state"]
            step["recurrent_state"] = state
            step["is_init"] = torch.zeros(1, dtype=torch.bool)
            o = actor(step)
            state = o["next", "recurrent_state"]
            logps.append(torch.log_softmax(o["logits"], -1)[td["action"][t]])
    ratio = (torch.stack(logps) - td["sample_log_prob"]).exp()
    ref = -torch.minimum(ratio, ratio.clamp(0.8, 1.2)).mean()
    torch.testing.assert_close(out["loss_objective"], ref)


def test_tanh_normal_log_prob():
    actor = Mod(lambda o: (o[..., :2], torch.ones_like(o[..., :2])), in_keys=["obs"],
                out_keys=["loc", "scale"])  # fmt: skip
    critic = Mod(lambda o: o[..., :1], in_keys=["obs"], out_keys=["state_value"])
    loss = ClipPPOLoss(actor, critic, distribution="tanh_normal")
    td = _data((5,), continuous=True, seed=6)
    dist = loss.get_distribution(actor(td.copy()))
    a = td["action"]
    u = torch.atanh(a)
    ref = (torch.distributions.Normal(td["obs"][..., :2], 1.0).log_prob(u)
           - torch.log1p(-a.pow(2))).sum(-1)  # fmt: skip
    torch.testing.assert_close(dist.log_prob(a), ref, atol=1e-4, rtol=1e-4)
    td["advantage"] = torch.randn(5, 1)
    td["value_target"] = torch.randn(5, 1)
    out = loss(td)
    assert torch.isfinite(out["entropy"])


def test_a_callable_distribution_gives_the_log_probs_and_the_entropy():
    """``distribution=(loc, scale) -> Distribution``: the loss takes the log-probabilities of
    the batch's actions and the entropy from it (here a Gaussian in [0, 2] per entry: a
    bounded one of the user's own), the terms as the hand-written loss computes them."""
    from recurrl.trainers.models import squashed_gaussian

    low, high = torch.zeros(2), torch.full((2,), 2.0)
    actor, critic, _ = _shared(2, continuous=True)

    def bounded(loc, scale):
        return squashed_gaussian(loc, scale, low, high)

    td = _data((4, 6), continuous=True, seed=8)
    td["action"] = td["action"] + 1.0  # inside (0, 2)
    GAE(0.9, 0.95, critic)(td)
    loss = ClipPPOLoss(actor, critic, distribution=bounded, entropy_coef=0.0)
    with set_recurrent_mode(True):
        out = loss(td)
        params = actor(td.copy())
    log_prob = bounded(params["loc"], params["scale"]).log_prob(td["action"])
    ratio = (log_prob - td["sample_log_prob"]).exp()
    adv = td["advantage"][..., 0]
    ref = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
    torch.testing.assert_close(out["loss_objective"], ref)
    assert torch.isfinite(out["entropy"])


def test_errors():
    actor, critic, _ = _shared(3)
    with pytest.raises(ValueError, match=r"distribution must be one of .* or a callable"):
        ClipPPOLoss(actor, critic, distribution="beta")
    with pytest.raises(ValueError, match="actor_network"):
        ClipPPOLoss(torch.nn.Linear(2, 2), critic)
    td = _data((4,), seed=7)
    with pytest.raises(KeyError, match="GAE"):
        ClipPPOLoss(actor, critic)(td)
    with pytest.raises(ValueError, match="valid keys"):
        ClipPPOLoss(actor, critic).set_keys(bogus="x")
    loss = ClipPPOLoss(actor, critic).set_keys(advantage="adv")
    td["adv"] = torch.zeros(4, 1)
    td["value_target"] = torch.zeros(4, 1)
    assert isinstance(loss(td), TensorDict)
