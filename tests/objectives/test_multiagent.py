"""MAPPO / IPPO: GAE per agent against a per-agent loop of the single-agent GAE, masked loss
terms, and the critics of :func:`multiagent_critic`."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq

from recurrl.functional.returns import generalized_advantage_estimate
from recurrl.modules import GRUModule, MultiAgentMLP
from recurrl.objectives import (
    GAE,
    ClipPPOLoss,
    TDLambdaEstimator,
    multiagent_critic,
    multiagent_keys,
    multiagent_ppo_loss,
)

N, OBS, HID, A = 3, 4, 5, 3
B, T = 2, 7


def batch(seed: int = 0, *, critic_state: bool = False) -> TensorDict:
    """Per-agent dones (terminated or truncated) at random steps, each agent's next episode
    starting (its is_init) right after; no env-level reset inside the window."""
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(B, T, N, 1, generator=g) < 0.25
    term = done & (torch.rand(B, T, N, 1, generator=g) < 0.5)
    is_init = torch.zeros(B, T, N, 1, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[:, 1:] = done[:, :-1]
    agents = {
        "observation": torch.randn(B, T, N, OBS, generator=g),
        "is_init": is_init,
        "mask": torch.rand(B, T, N, 1, generator=g) > 0.2,
        "action": torch.randint(0, A, (B, T, N), generator=g),
        "sample_log_prob": -torch.rand(B, T, N, generator=g) - 0.5,
    }
    if critic_state:
        agents["critic_state"] = torch.randn(B, T, N, 1, HID, generator=g) * ~is_init[..., None]
    nxt = {
        "observation": torch.randn(B, T, N, OBS, generator=g),
        "reward": torch.randn(B, T, N, 1, generator=g),
        "done": done,
        "terminated": term,
        "truncated": done & ~term,
    }
    env_flags = torch.zeros(B, T, 1, dtype=torch.bool)
    env_init = env_flags.clone()
    env_init[:, 0] = True
    return TensorDict(
        {
            "agents": TensorDict(agents, [B, T, N]),
            "is_init": env_init,
            "state": torch.randn(B, T, 6, generator=g),
            "next": {"agents": TensorDict(nxt, [B, T, N]), "done": env_flags,
                     "terminated": env_flags, "state": torch.randn(B, T, 6, generator=g)},
        },
        [B, T],
    )  # fmt: skip


def agent_slice(td: TensorDict, i: int) -> TensorDict:
    """Agent ``i``'s steps as a single-agent batch (the keys of recurrl's single-agent GAE)."""
    a, n = td.get("agents")[:, :, i], td.get(("next", "agents"))[:, :, i]
    out = {
        "obs": a.get("observation"),
        "is_init": a.get("is_init"),
        "next": {k: n.get(k) for k in ("reward", "done", "terminated")},
    }
    out["next"]["obs"] = n.get("observation")
    if "critic_state" in a:
        out["critic_state"] = a.get("critic_state")
    return TensorDict(out, [B, T])


@pytest.mark.parametrize("recurrent", [False, True])
def test_gae_per_agent_equals_single_agent_gae_per_agent(recurrent):
    """IPPO critic (shared weights): GAE over the group equals, for every agent, the
    single-agent GAE of a single-agent critic with the same weights on that agent's steps."""
    torch.manual_seed(0)
    critic = multiagent_critic(N, "ippo", observation_size=OBS, recurrent=recurrent,
                               hidden_size=HID)  # fmt: skip
    td = batch(critic_state=recurrent)
    _, gae = multiagent_ppo_loss(Mod(lambda x: x, [("agents", "observation")], ["unused"]),
                                 critic, gamma=0.9, lmbda=0.8)  # fmt: skip
    gae(td)
    if recurrent:
        memory, head = critic[0], critic[1].module
        single_rnn = GRUModule(in_keys=["obs", "critic_state"], out_key="feat", gru=memory.rnn)
        single = Seq(single_rnn, Mod(head.net, ["feat"], ["state_value"]))
    else:
        single = Mod(critic.module.net, ["obs"], ["state_value"])
    for i in range(N):
        ref = GAE(0.9, 0.8, single)(agent_slice(td, i))
        for key in ("advantage", "value_target", "state_value"):
            torch.testing.assert_close(td.get(("agents", key))[:, :, i], ref.get(key),
                                       atol=1e-5, rtol=1e-5)  # fmt: skip


def test_gae_known_answer_terminated_vs_truncated():
    """A critic of constant value 1 and reward 1 at each agent's done: gamma=0.5, lambda=1.
    Agent 0 terminates at t=2 (no bootstrap), agent 1 is truncated at t=2 (bootstraps the
    value 1 of its next observation), agent 2 never ends (bootstraps at the last step)."""
    td = batch()
    done = torch.zeros(B, T, N, 1, dtype=torch.bool)
    done[:, 2, :2] = True
    term = done.clone()
    term[:, :, 1] = False
    reward = done.float()
    td.set(("next", "agents", "done"), done)
    td.set(("next", "agents", "terminated"), term)
    td.set(("next", "agents", "reward"), reward)
    is_init = torch.zeros_like(done)
    is_init[:, 0] = True
    is_init[:, 3] = done[:, 2]
    td.set(("agents", "is_init"), is_init)
    critic = Mod(lambda x: torch.ones(*x.shape[:-1], 1), [("agents", "observation")],
                 [("agents", "state_value")])  # fmt: skip
    names = ("reward", "done", "terminated", "value", "advantage", "value_target", "is_init")
    gae = GAE(0.5, 1.0, critic).set_keys(
        **{k: v for k, v in multiagent_keys().items() if k in names}
    )
    adv = gae(td).get(("agents", "advantage"))[0, :, :, 0]
    # delta_t = r_t + 0.5 (1 - term_t) V - V, A_t = delta_t + 0.5 A_{t+1} within a trajectory
    # agent 0: delta = [-0.5, -0.5, 0.0] then a new trajectory of deltas -0.5 (last bootstraps)
    torch.testing.assert_close(adv[:3, 0], torch.tensor([-0.75, -0.5, 0.0]))
    # agent 1: delta = [-0.5, -0.5, 0.5]
    torch.testing.assert_close(adv[:3, 1], torch.tensor([-0.625, -0.25, 0.5]))
    # agent 2: delta = -0.5 everywhere; the window ends at t = 6 (bootstrap): A_6 = -0.5
    expected = torch.tensor([-0.5 * (2 - 0.5 ** (T - t - 1)) for t in range(T)])
    torch.testing.assert_close(adv[:, 2], expected)
    # agents 0 and 1 after their episode: a fresh trajectory of T - 3 steps
    torch.testing.assert_close(adv[3:, 0], expected[3:])


def test_functional_gae_time_dim_minus_three_is_a_loop_over_agents():
    g = torch.Generator().manual_seed(3)
    v, nv, r = (torch.randn(B, T, N, 1, generator=g) for _ in range(3))
    done = torch.rand(B, T, N, 1, generator=g) < 0.3
    term = done & (torch.rand(B, T, N, 1, generator=g) < 0.5)
    adv, target = generalized_advantage_estimate(0.9, 0.7, v, nv, r, done, term, time_dim=-3)
    for i in range(N):
        a, t = generalized_advantage_estimate(
            0.9, 0.7, v[:, :, i], nv[:, :, i], r[:, :, i], done[:, :, i], term[:, :, i],
            time_dim=-2,
        )
        torch.testing.assert_close(adv[:, :, i], a)
        torch.testing.assert_close(target[:, :, i], t)


def test_td_lambda_per_agent_and_env_level_value_broadcast():
    """A MAPPO critic writing one value per env row ("state_value" [*B, T, 1]) gives it to
    every agent; TD(lambda) runs per agent too."""
    torch.manual_seed(0)
    td = batch()
    # consistent transitions: the next state of step t is the state of step t + 1
    td.get(("next", "state"))[:, :-1] = td.get("state")[:, 1:]
    critic = Mod(torch.nn.Linear(6, 1), ["state"], ["state_value"])
    keys = {k: v for k, v in multiagent_keys().items()
            if k in ("reward", "done", "terminated", "advantage", "value_target")}  # fmt: skip
    gae = GAE(0.9, 0.8, critic).set_keys(**keys)
    adv = gae(td.clone()).get(("agents", "advantage"))
    assert adv.shape == (B, T, N, 1)
    with torch.no_grad():
        v = critic.module(td.get("state")).unsqueeze(2).expand(B, T, N, 1)
        nv = critic.module(td.get(("next", "state"))).unsqueeze(2).expand(B, T, N, 1)
    n = td.get(("next", "agents"))
    ref, _ = generalized_advantage_estimate(0.9, 0.8, v, nv, n.get("reward"), n.get("done"),
                                            n.get("terminated"), time_dim=-3)  # fmt: skip
    torch.testing.assert_close(adv, ref)
    lam = TDLambdaEstimator(0.9, 0.8, critic).set_keys(**keys)(td.clone())
    assert lam.get(("agents", "value_target")).shape == (B, T, N, 1)


def _actor():
    torch.manual_seed(1)
    return Mod(MultiAgentMLP(OBS, A, N), [("agents", "observation")], [("agents", "logits")])


@pytest.mark.parametrize("normalize", [False, True])
def test_ppo_masks_agents_that_do_not_act(normalize):
    """Steps where ("agents", "mask") is False change no loss term (nor the normalization);
    the loss equals the per-step terms averaged over acting agents only."""
    critic = multiagent_critic(N, "mappo", observation_size=OBS)
    loss, gae = multiagent_ppo_loss(_actor(), critic, normalize_advantage=normalize)
    td = gae(batch())
    out = loss(td)
    mask = td.get(("agents", "mask")).squeeze(-1)
    poisoned = td.clone()
    for key, value in (("advantage", 1e6), ("value_target", -1e6), ("sample_log_prob", 50.0)):
        x = poisoned.get(("agents", key))
        m = mask.reshape(*mask.shape, *([1] * (x.dim() - mask.dim())))
        poisoned.set(("agents", key), torch.where(m, x, torch.full_like(x, value)))
    out2 = loss(poisoned)
    for key in ("loss_objective", "loss_critic", "loss_entropy", "kl_approx", "clip_fraction"):
        torch.testing.assert_close(out2[key], out[key])
    # by hand, over acting agents only
    logits = loss.actor_network(td.copy()).get(("agents", "logits"))
    dist = torch.distributions.Categorical(logits=logits)
    lp = dist.log_prob(td.get(("agents", "action")))
    adv = td.get(("agents", "advantage")).squeeze(-1)[mask]
    if normalize:
        adv = (adv - adv.mean()) / (adv.var(unbiased=False).sqrt() + 1e-8)
    ratio = (lp - td.get(("agents", "sample_log_prob")))[mask].exp()
    gain = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    torch.testing.assert_close(out["loss_objective"], -gain.mean())
    torch.testing.assert_close(out["entropy"], dist.entropy()[mask].mean())


def test_ppo_agent_mask_and_collector_padding_combine():
    critic = multiagent_critic(N, "ippo", observation_size=OBS)
    loss, gae = multiagent_ppo_loss(_actor(), critic)
    td = gae(batch())
    padded = td.clone()
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[:, -2:] = False
    padded.set(("collector", "mask"), pad)
    both = td.clone()
    both.set(("agents", "mask"), td.get(("agents", "mask")) & pad[..., None, None])
    torch.testing.assert_close(loss(padded)["loss_objective"], loss(both)["loss_objective"])
    # average_gae normalizes over the same steps
    _, gae2 = multiagent_ppo_loss(_actor(), critic, average_gae=True)
    adv = gae2(padded.clone()).get(("agents", "advantage")).squeeze(-1)
    m = both.get(("agents", "mask")).squeeze(-1)
    torch.testing.assert_close(adv[m].mean(), torch.tensor(0.0), atol=1e-5, rtol=0)


@pytest.mark.parametrize("algorithm, kwargs, in_key", [
    ("mappo", {"observation_size": OBS}, ("agents", "observation")),
    ("mappo", {"state_size": 6}, "state"),
    ("mappo", {"state_size": 6, "recurrent": True}, "state"),
    ("mappo", {"observation_size": OBS, "recurrent": True}, ("agents", "observation")),
    ("ippo", {"observation_size": OBS, "share_params": False}, ("agents", "observation")),
    ("ippo", {"observation_size": OBS, "recurrent": True}, ("agents", "observation")),
])  # fmt: skip
def test_critics_train_with_the_loss(algorithm, kwargs, in_key):
    torch.manual_seed(0)
    critic = multiagent_critic(N, algorithm, hidden_size=HID, **kwargs)
    assert critic.in_keys[0] == in_key
    loss, gae = multiagent_ppo_loss(_actor(), critic)
    td = batch()
    if kwargs.get("recurrent"):
        for key, (shape, _) in critic[0].recurrent_state_spec.items():
            td.set(key, torch.zeros(B, T, *shape))
    td = gae(td)
    assert td.get(("agents", "state_value")).shape == (B, T, N, 1)
    out = loss(td)
    (out["loss_objective"] + out["loss_critic"]).backward()
    grads = [p.grad for p in critic.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    x = td.clone()
    if in_key == "state":  # a MAPPO critic over the state reads nothing of the agents
        x.get("agents").get("observation").add_(1.0)
        v = critic(x.copy()).get(("agents", "state_value"))
        torch.testing.assert_close(v, critic(td.copy()).get(("agents", "state_value")))


def test_centralized_vs_independent_critic():
    """MAPPO's critic of one agent reads the other agents' observations; IPPO's does not."""
    torch.manual_seed(0)
    td = batch()
    changed = td.clone()
    changed.get("agents").get("observation")[:, :, 2] += 1.0
    for algorithm, sees_others in (("mappo", True), ("ippo", False)):
        critic = multiagent_critic(N, algorithm, observation_size=OBS)
        v0 = critic(td.copy()).get(("agents", "state_value"))[:, :, 0]
        v1 = critic(changed.copy()).get(("agents", "state_value"))[:, :, 0]
        assert torch.allclose(v0, v1) != sees_others


def _recurrent_agents(obs_dim: int, n_agents: int = 3, actions: int = 3) -> Seq:
    """A GRU actor over the agents (shared weights), its head and a categorical sampler."""
    from recurrl.trainers.models import CategoricalSampler

    memory = GRUModule(obs_dim, HID, in_key=("agents", "observation"),
                       out_key=("agents", "feat"), n_agents=n_agents)  # fmt: skip
    head = Mod(MultiAgentMLP(HID, actions, n_agents), [("agents", "feat")],
               [("agents", "logits")])  # fmt: skip
    sampler = Mod(CategoricalSampler(), [("agents", "logits")],
                  [("agents", "action"), ("agents", "sample_log_prob")])  # fmt: skip
    return Seq(memory, head, sampler)


def test_errors():
    with pytest.raises(ValueError, match="algorithm must be one of"):
        multiagent_critic(N, "qmix", observation_size=OBS)
    with pytest.raises(ValueError, match="observation_size is required"):
        multiagent_critic(N, "ippo")
    critic = multiagent_critic(N, "ippo", observation_size=OBS)
    td = batch()
    gae = GAE(0.9, 0.9, critic, shifted=True).set_keys(
        done=("agents", "done"), terminated=("agents", "terminated"),
        reward=("agents", "reward"), value=("agents", "state_value"),
    )  # fmt: skip
    with pytest.raises(ValueError, match="shifted=True reads env-level flags"):
        gae(td)
    loss = ClipPPOLoss(_actor(), critic).set_keys(**{
        k: v for k, v in multiagent_keys().items()
        if k in ("action", "logits", "sample_log_prob", "value", "value_target")
    })  # fmt: skip
    td.set(("agents", "advantage"), torch.zeros(B, T, N, 1))
    td.set("advantage", torch.zeros(B, T, 1))
    with pytest.raises(ValueError, match=r"sample_log_prob.\) must have shape \[2, 7\]"):
        loss(td)  # an env-level advantage with per-agent actions


def test_collected_recurrent_mappo_replays_exactly():
    """Collected with per-agent resets (an agent re-entering mid-episode, agents finishing
    early), a recurrent actor replayed in recurrent mode gives back the collected
    log-probabilities (kl 0, no clipping), and a recurrent centralized critic carried by the
    collecting policy runs in GAE."""
    from recurrl.collectors import Collector
    from recurrl.testing.multiagent_envs import MultiAgentRecallEnv

    torch.manual_seed(0)
    env = MultiAgentRecallEnv(batch_size=(4,), n_agents=3, num_cues=3, reenter=(2, 5))
    actor = _recurrent_agents(env.obs_dim)
    critic = multiagent_critic(3, "mappo", state_size=10, recurrent=True, hidden_size=HID)
    loss, gae = multiagent_ppo_loss(actor, critic)
    collector = Collector(env, Seq(actor, critic[0]), frames_per_batch=4 * 9, total_frames=72)
    for data in collector:
        assert data.get(("agents", "is_init"))[:, 1:].any()  # per-agent starts inside rows
        out = loss(gae(data))
        assert abs(float(out["kl_approx"])) < 1e-6 and float(out["clip_fraction"]) == 0.0
        assert torch.isfinite(data.get(("agents", "advantage"))).all()
    collector.shutdown()


@pytest.mark.parametrize("pad", [False, True])
def test_replayed_slices_of_recurrent_agents_replay_exactly(pad):
    """Slices from a SliceSampler (flat, several slices per row, starts mid-episode, marked
    by the env-level "is_init" only) replay the collected per-agent states: kl 0."""
    from recurrl.collectors import Collector
    from recurrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
    from recurrl.testing.multiagent_envs import MultiAgentRecallEnv

    torch.manual_seed(0)
    env = MultiAgentRecallEnv(batch_size=(4,), n_agents=3, num_cues=3, reenter=(2, 5))
    actor = _recurrent_agents(env.obs_dim)
    critic = multiagent_critic(3, "mappo", state_size=10, hidden_size=HID)
    loss, gae = multiagent_ppo_loss(actor, critic)
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(400),
        sampler=SliceSampler(slice_len=5, strict_length=False, pad_output=pad),
        batch_size=40,
    )
    for data in Collector(env, actor, frames_per_batch=4 * 12, total_frames=96):
        rb.extend(data)
    td = rb.sample()
    assert td.batch_dims == 1  # flat: slices one after the other
    out = loss(gae(td))
    assert abs(float(out["kl_approx"])) < 1e-6 and float(out["clip_fraction"]) == 0.0
