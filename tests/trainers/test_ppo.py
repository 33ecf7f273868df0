"""Pieces of the PPO recipe: minibatching, episode returns, models."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from recurrl.trainers.config import ModelConfig
from recurrl.trainers.models import ActorCritic
from recurrl.trainers.ppo import minibatches


def _grid(n: int, t: int) -> TensorDict:
    return TensorDict({"i": torch.arange(n * t).view(n, t)}, [n, t])


def test_minibatches_of_whole_rows_cover_the_batch_once():
    mbs = list(minibatches(_grid(4, 6), num_minibatches=2, slice_len=0))
    assert [mb.batch_size for mb in mbs] == [torch.Size([2, 6])] * 2
    rows = torch.cat([mb["i"] for mb in mbs])
    assert sorted(rows[:, 0].tolist()) == [0, 6, 12, 18]
    assert (rows.diff(dim=1) == 1).all()  # time order kept


@pytest.mark.parametrize(("rows", "k"), [(6, 3), (5, 2)])
def test_minibatches_are_the_chunks_of_one_random_permutation(rows, k):
    """The rows of minibatch i are ``torch.randperm(rows).chunk(k)[i]`` (the same draw from
    torch's RNG as indexing once per minibatch), uneven counts included."""
    torch.manual_seed(3)
    chunks = torch.randperm(rows).chunk(k)
    torch.manual_seed(3)
    mbs = list(minibatches(_grid(rows, 2), num_minibatches=k, slice_len=0))
    assert len(mbs) == len(chunks)
    for idx, mb in zip(chunks, mbs, strict=True):
        assert mb["i"][:, 0].tolist() == (idx * 2).tolist()


def test_minibatches_of_slices_are_contiguous_pieces_of_rows():
    mbs = list(minibatches(_grid(4, 6), num_minibatches=4, slice_len=3))
    assert [mb.batch_size for mb in mbs] == [torch.Size([2, 3])] * 4
    pieces = torch.cat([mb["i"] for mb in mbs])
    assert sorted(pieces.flatten().tolist()) == list(range(24))
    assert (pieces.diff(dim=1) == 1).all() and (pieces[:, 0] % 3 == 0).all()


def test_actor_critic_keys_and_shared_trunk():
    for memory in ("lstm", "gru", "none"):
        model = ActorCritic(ModelConfig(memory=memory, hidden_size=8), obs_dim=2, n_actions=3)
        td = TensorDict({"observation": torch.randn(5, 2), "is_init": torch.ones(5, 1).bool()}, [5])
        out = model.policy()(td)
        assert out["logits"].shape == (5, 3) and out["action"].shape == (5,)
        assert out["sample_log_prob"].shape == (5,)
    shared = ActorCritic(ModelConfig(shared_trunk=True, hidden_size=8), obs_dim=2, n_actions=2)
    separate = ActorCritic(ModelConfig(hidden_size=8), obs_dim=2, n_actions=2)
    assert shared.actor[0] is shared.critic[0]
    n_shared = sum(p.numel() for p in shared.parameters())
    assert n_shared < sum(p.numel() for p in separate.parameters())


def _trainer(tmp_path, **ppo):
    from recurrl.trainers.config import EnvConfig, PPOConfig, RunConfig, TrainConfig
    from recurrl.trainers.ppo import PPOTrainer

    cfg = TrainConfig(
        env=EnvConfig(num_envs=2),
        model=ModelConfig(hidden_size=8),
        ppo=PPOConfig(frames=400, frames_per_batch=100, num_minibatches=2, **ppo),
        run=RunConfig(run_dir=str(tmp_path), tensorboard=False, plot=False, quiet=True),
    )
    return PPOTrainer(cfg)


def test_lr_entropy_weight_and_clip_range_follow_linear_schedules(tmp_path):
    trainer = _trainer(
        tmp_path, lr=1e-3, entropy_coef=0.02, entropy_coef_end=0.0, clip_epsilon=0.2,
        clip_epsilon_end=0.1,
    )  # fmt: skip
    seen = []
    for frames in (0, 100, 300):
        trainer.collector.frames = frames
        trainer._set_schedules()
        seen.append(
            (trainer.optimizer.param_groups[0]["lr"], trainer.loss.entropy_coef,
             trainer.loss.clip_epsilon)
        )  # fmt: skip
    expected = [(1e-3, 0.02, 0.2), (0.75e-3, 0.015, 0.175), (0.25e-3, 0.005, 0.125)]
    assert torch.allclose(
        torch.tensor(seen, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64)
    )


def test_entropy_weight_and_clip_range_are_constant_without_an_end_value(tmp_path):
    trainer = _trainer(
        tmp_path, entropy_coef=0.03, entropy_coef_end=None, clip_epsilon_end=None, anneal_lr=False
    )
    trainer.collector.frames = 300
    trainer._set_schedules()
    assert trainer.loss.entropy_coef == 0.03
    assert trainer.loss.clip_epsilon == trainer.cfg.ppo.clip_epsilon  # clip_epsilon_end None
    assert trainer.optimizer.param_groups[0]["lr"] == trainer.cfg.ppo.lr


def test_value_clipping_reaches_the_loss(tmp_path):
    trainer = _trainer(tmp_path, clip_value=0.05)
    plain = _trainer(tmp_path / "plain")
    assert trainer.loss.clip_value == 0.05 and plain.loss.clip_value is None
    batch = next(iter(trainer.collector))
    trainer.gae(batch)
    # targets equal to what the critic predicts now, stored values 1 away: unclipped the value
    # loss is 0; clipped, the prediction may move only 0.05 from the stored value
    batch["value_target"] = batch["state_value"].clone()
    batch["state_value"] = batch["state_value"] + 1.0
    coef = trainer.cfg.ppo.critic_coef
    expected = coef * 0.5 * 0.95**2
    assert trainer.loss(batch)["loss_critic"].item() == pytest.approx(expected, rel=1e-4)
    plain.loss.critic_network.load_state_dict(trainer.loss.critic_network.state_dict())
    assert plain.loss(batch)["loss_critic"].item() == pytest.approx(0.0, abs=1e-8)


def test_obs_norm_is_fitted_on_the_first_batch_which_is_not_trained_on(tmp_path):
    trainer = _trainer(tmp_path, obs_norm=True, obs_scale=1.0)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    batch = next(iter(trainer.collector))
    stats = trainer.update(batch)
    assert all(v != v for v in stats.values())  # NaN: no update ran
    after = trainer.model.state_dict()
    norm = trainer.model.obs_norm
    obs = batch["observation"].reshape(-1, 2)
    torch.testing.assert_close(norm.loc, obs.mean(0))
    torch.testing.assert_close(norm.scale, obs.std(0))
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed and all(k.endswith(("loc", "scale")) for k in changed)
    trainer.batches = 1  # the next batch trains
    stats = trainer.update(next(iter(trainer.collector)))
    assert stats["loss_critic"] == stats["loss_critic"]


def test_obs_scale_multiplies_what_both_trunks_read():
    torch.manual_seed(0)
    plain = ActorCritic(ModelConfig(hidden_size=8), obs_dim=2, n_actions=2)
    scaled = ActorCritic(ModelConfig(hidden_size=8), obs_dim=2, n_actions=2, obs_scale=10.0)
    for net in ("actor", "critic"):  # same trunk and head; the scale comes first
        for i in range(2):
            getattr(scaled, net)[i + 1].load_state_dict(getattr(plain, net)[i].state_dict())
    obs = torch.randn(5, 2)
    td = TensorDict({"observation": obs, "is_init": torch.ones(5, 1).bool()}, [5])
    ref = plain.policy()(td.clone().set("observation", obs * 10.0))
    out = scaled.policy()(td.clone())
    assert torch.equal(out["scaled_observation"], obs * 10.0)
    assert torch.allclose(out["logits"], ref["logits"])
    assert torch.allclose(out[("next", "critic_h")], ref[("next", "critic_h")])
    values = scaled.critic(td.clone())["state_value"]
    assert torch.allclose(
        values, plain.critic(td.clone().set("observation", obs * 10.0))["state_value"]
    )


def test_the_learner_uses_fused_adam_and_reports_the_mean_diagnostics(tmp_path):
    from recurrl.trainers.collection import next_batch

    trainer = _trainer(tmp_path)
    assert trainer.optimizer.defaults["fused"] is True
    batch = next_batch(trainer)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    stats = trainer.update(batch)
    keys = {"loss_objective", "loss_critic", "entropy", "kl_approx", "clip_fraction"}
    assert keys | {"grad_norm"} == set(stats)
    assert all(isinstance(v, float) for v in stats.values())
    assert any(not torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))
    trainer.collector.shutdown()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_torch_env_collects_on_the_device(tmp_path):
    from recurrl.trainers.collection import next_batch
    from recurrl.trainers.config import EnvConfig, PPOConfig, RunConfig, TrainConfig
    from recurrl.trainers.ppo import PPOTrainer

    cfg = TrainConfig(
        env=EnvConfig(num_envs=64),
        model=ModelConfig(hidden_size=8),
        ppo=PPOConfig(frames=6400, num_minibatches=2),
        run=RunConfig(run_dir=str(tmp_path), device="cuda", tensorboard=False, plot=False,
                      quiet=True),
    )  # fmt: skip
    trainer = PPOTrainer(cfg)
    assert trainer.env.device.type == "cuda"
    batch = next_batch(trainer)
    assert batch.device.type == "cuda" and batch.batch_size == (64, 50)
    stats = trainer.update(batch)
    assert all(v == v for v in stats.values())  # finite, not NaN
    trainer.collector.shutdown()
