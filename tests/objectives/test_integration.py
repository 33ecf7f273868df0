"""Objectives on real pipeline data: Collector batches and SliceSampler samples.

The collector stores the hidden state the policy actually used, so with unchanged weights the
next-state value of every step must equal the critic run one step on ``("next", obs)`` with
the stored ``("next", h)``: the recurrent pass (shifted inside trajectories, recomputed state
at trajectory and slice ends) must reproduce what the agent saw.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.collectors import Collector
from recurrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
from recurrl.modules import GRUModule, set_recurrent_mode
from recurrl.objectives import GAE, ClipPPOLoss, DQNLoss
from recurrl.objectives.value._next_state import values_and_next_values
from recurrl.testing import CountingEnv

H, SLICE_LEN, NUM_SLICES = 6, 5, 8


def _sample_action(logits):
    dist = torch.distributions.Categorical(logits=logits)
    action = dist.sample()
    return action, dist.log_prob(action)


@pytest.fixture(scope="module")
def pipeline():
    torch.manual_seed(0)
    trunk = GRUModule(3, H, in_keys=["observation", "rs"], out_keys=["feat", ("next", "rs")])
    critic = Seq(trunk, Mod(nn.Linear(H, 1), in_keys=["feat"], out_keys=["state_value"]))
    logits = Mod(nn.Linear(H, 2), in_keys=["feat"], out_keys=["logits"])
    q = Mod(nn.Linear(H, 2), in_keys=["feat"], out_keys=["action_value"])
    actor = Seq(trunk, logits)
    sample = Mod(_sample_action, in_keys=["logits"], out_keys=["action", "sample_log_prob"])
    policy = Seq(trunk, logits, q, sample)
    env = CountingEnv(batch_size=(3,), max_steps=[4, 7, 11])
    collector = Collector(env, policy, frames_per_batch=3 * 20, total_frames=3 * 40)
    with torch.no_grad():
        batches = list(collector)
    collector.shutdown()
    return trunk, actor, critic, Seq(trunk, q), batches


def _one_step_on_next(net, td, key):
    nxt = td["next"].copy()
    nxt["is_init"] = torch.zeros_like(td["is_init"])
    with torch.no_grad(), set_recurrent_mode(False):
        return net(nxt)[key]


def _check_next_values(net, td, key, mask=None):
    with torch.no_grad():
        _, nv = values_and_next_values(net, td, key)
    ref = _one_step_on_next(net, td, key)
    mask = torch.ones(td.shape, dtype=torch.bool) if mask is None else mask
    torch.testing.assert_close(nv[mask], ref[mask], atol=1e-5, rtol=1e-4)


def test_next_values_on_collector_batches(pipeline):
    _, _, critic, qnet, batches = pipeline
    for batch in batches:
        assert batch["is_init"][:, 1:].any()  # episodes end inside the batch
        _check_next_values(critic, batch, "state_value")
        _check_next_values(qnet, batch, "action_value")


@pytest.mark.parametrize("pad", [False, True])
def test_slices_gae_ppo_dqn(pipeline, pad):
    _, actor, critic, qnet, batches = pipeline
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(500),
        sampler=SliceSampler(slice_len=SLICE_LEN, strict_length=False, pad_output=pad),
        batch_size=SLICE_LEN * NUM_SLICES,
    )
    for batch in batches:
        rb.extend(batch)
    td = rb.sample()
    mask = td.get(("collector", "mask"), None)
    _check_next_values(critic, td, "state_value", mask)
    GAE(0.9, 0.95, critic)(td)
    out = ClipPPOLoss(actor, critic)(td)
    # with unchanged weights the ratio is 1: nothing is clipped, kl is 0
    assert out["clip_fraction"] == 0
    assert abs(out["kl_approx"]) < 1e-5
    loss = sum(v for k, v in out.items() if k.startswith("loss_"))
    loss.backward()
    dqn = DQNLoss(qnet, burn_in=1)(td)
    assert torch.isfinite(dqn["loss"])
    if pad:
        assert not mask.all()
        td2 = td.clone()
        td2["advantage"][~mask] = 1e3
        out2 = ClipPPOLoss(actor, critic)(td2)
        torch.testing.assert_close(out2["loss_objective"], out["loss_objective"])


def test_gae_known_answer_on_counting_env():
    # reward 1 at every step, episodes of 4 steps ending terminated, zero critic, lmbda 1:
    # the advantage is the discounted reward-to-go 1 + g + ... + g^(3 - k) at step k.
    env = CountingEnv(batch_size=(1,), max_steps=4)
    critic = Mod(lambda o: torch.zeros_like(o[..., :1]), ["observation"], ["state_value"])
    policy = Mod(lambda o: torch.zeros(o.shape[:-1], dtype=torch.long), ["observation"],
                 ["action"])  # fmt: skip
    collector = Collector(env, policy, frames_per_batch=12, total_frames=12)
    td = next(iter(collector))
    collector.shutdown()
    GAE(0.5, 1.0, critic)(td)
    per_episode = torch.tensor([1.875, 1.75, 1.5, 1.0])
    torch.testing.assert_close(td["advantage"].view(-1), per_episode.repeat(3))
    assert isinstance(td, TensorDict)


def _train_recall(memory: bool, batches: int = 20) -> list[float]:
    """PPO on RecallEnv (cue at the first step, query 2 blank steps later)."""
    from recurrl.testing.envs import RecallEnv

    torch.manual_seed(0)
    if memory:
        trunk = GRUModule(3, 16, in_keys=["observation", "rs"], out_keys=["feat", ("next", "rs")])
    else:
        trunk = Mod(nn.Sequential(nn.Linear(3, 16), nn.Tanh()), ["observation"], ["feat"])
    logits = Mod(nn.Linear(16, 2), ["feat"], ["logits"])
    actor = Seq(trunk, logits)
    critic = Seq(trunk, Mod(nn.Linear(16, 1), ["feat"], ["state_value"]))
    policy = Seq(trunk, logits, Mod(_sample_action, ["logits"], ["action", "sample_log_prob"]))
    env = RecallEnv(batch_size=(16,), num_cues=2, delay=2)
    env.set_seed(0)
    collector = Collector(env, policy, frames_per_batch=16 * 12, total_frames=16 * 12 * batches)
    gae, loss = GAE(0.9, 0.95, critic), ClipPPOLoss(actor, critic)
    opt = torch.optim.Adam(loss.parameters(), lr=1e-2)
    returns = []
    for batch in collector:
        gae(batch)
        returns.append((batch["next", "reward"].sum() / batch["next", "done"].sum()).item())
        for _ in range(4):
            out = loss(batch)
            opt.zero_grad()
            sum(v for k, v in out.items() if k.startswith("loss_")).backward()
            opt.step()
    collector.shutdown()
    return returns


def test_ppo_learns_recall_with_memory_only():
    # known answer: memory gets return 1, any memoryless policy 1 / num_cues = 0.5
    with_memory = _train_recall(memory=True)
    without = _train_recall(memory=False)
    assert sum(with_memory[-3:]) / 3 > 0.9
    assert sum(without[-3:]) / 3 < 0.75
