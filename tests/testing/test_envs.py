"""Tests of the fake envs in recurrl.testing.envs: their behaviour is the known answer."""

import pytest
import torch

from recurrl.envs import Categorical, EnvBase
from recurrl.testing import CountingEnv, RecallEnv


class TestCountingEnv:
    def test_single(self):
        env = CountingEnv(max_steps=3, obs_dim=2)
        assert isinstance(env, EnvBase) and env.action_spec == Categorical(2)
        data = env.rollout(10)
        assert data.batch_size == (3,)
        assert data["observation"].tolist() == [[0, 0], [1, 1], [2, 2]]
        assert data["next", "observation"][:, 0].tolist() == [1, 2, 3]
        assert (data["next", "reward"] == 1).all()
        assert data["next", "terminated"].squeeze(-1).tolist() == [False, False, True]
        assert not data["next", "truncated"].any()

    def test_per_env_max_steps(self):
        env = CountingEnv(batch_size=(3,), max_steps=[1, 2, 4])
        data = env.rollout(4, break_when_any_done=False)
        done = data["next", "done"].squeeze(-1)
        assert done.tolist() == [
            [True, True, True, True],
            [False, True, False, True],
            [False, False, False, True],
        ]

    def test_partial_reset_only_masked(self):
        env = CountingEnv(batch_size=(2,), max_steps=10)
        td = env.reset()
        for _ in range(3):
            td = env.step_mdp(env.step(env.rand_action(td)))
        td["_reset"] = torch.tensor([[False], [True]])
        assert env.reset(td)["observation"][:, 0].tolist() == [3, 0]
        assert env.count.tolist() == [3, 0]

    def test_keeps_counting_after_done(self):
        env = CountingEnv(max_steps=1)
        td = env.step_mdp(env.step(env.rand_action(env.reset())))
        td = env.step(env.rand_action(td))
        assert td["next", "observation"][0] == 2 and td["next", "terminated"].item()

    def test_errors(self):
        with pytest.raises(ValueError, match="one value per env"):
            CountingEnv(batch_size=(2,), max_steps=[1, 2, 3])
        with pytest.raises(ValueError, match="max_steps >= 1"):
            CountingEnv(max_steps=0)


class TestRecallEnv:
    def test_episode_structure(self):
        env = RecallEnv(batch_size=(4,), num_cues=3, delay=2)
        data = env.rollout(10)
        assert data.batch_size == (4, 3)  # delay + 1 steps
        obs = data["observation"]
        assert (obs[:, 0, :3].sum(-1) == 1).all() and (obs[:, 0, 3] == 0).all()
        assert (obs[:, 1] == 0).all()
        assert (obs[:, 2, 3] == 1).all() and (obs[:, 2, :3] == 0).all()
        assert (data["next", "reward"][:, :2] == 0).all()
        assert data["next", "terminated"][:, -1].all()

    def test_memory_policy_is_perfect(self):
        env = RecallEnv(batch_size=(16,), num_cues=4, delay=3)
        env.set_seed(0)

        def remember(td):  # reads the cue from a memory it keeps in the TensorDict
            obs = td["observation"]
            seen = obs[..., :-1].sum(-1) > 0
            memory = td.get("memory", torch.zeros(16, dtype=torch.int64))
            td["memory"] = torch.where(seen, obs[..., :-1].argmax(-1), memory)
            td["action"] = td["memory"]
            return td

        data = env.rollout(4, remember)
        assert (data["next", "reward"].sum((-2, -1)) == 1).all()

    def test_memoryless_policy_is_at_chance(self):
        env = RecallEnv(batch_size=(4000,), num_cues=4, delay=1)
        env.set_seed(0)

        def constant(td):
            td["action"] = torch.zeros(4000, dtype=torch.int64)
            return td

        ret = env.rollout(2, constant)["next", "reward"].sum((-2, -1)).mean().item()
        assert abs(ret - 0.25) < 0.03

    def test_seeded_cues_reproducible_and_partial_reset(self):
        a, b = RecallEnv(batch_size=(8,)), RecallEnv(batch_size=(8,))
        a.set_seed(1)
        b.set_seed(1)
        assert torch.equal(a.reset()["observation"], b.reset()["observation"])
        td = a.step_mdp(a.step(a.rand_action(a.reset())))
        cues = a.cue.clone()
        td["_reset"] = torch.tensor([True] + [False] * 7)
        out = a.reset(td)
        assert torch.equal(a.cue[1:], cues[1:]) and a.count.tolist() == [0] + [1] * 7
        assert out["observation"][0, :-1].sum() == 1 and (out["observation"][1:] == 0).all()

    def test_errors(self):
        with pytest.raises(ValueError, match="delay >= 1"):
            RecallEnv(delay=0)
        with pytest.raises(ValueError, match="num_cues >= 2"):
            RecallEnv(num_cues=1)
