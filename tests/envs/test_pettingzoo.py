"""PettingZooEnv: the key convention over PettingZoo's parallel API, against the raw envs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pettingzoo = pytest.importorskip("pettingzoo", reason="pip install 'recurrl[multiagent]'")
pytest.importorskip("mpe2", reason="pip install 'recurrl[multiagent]'")

from gymnasium import spaces  # noqa: E402

from recurrl.envs import (  # noqa: E402
    InitTracker,
    PettingZooEnv,
    TransformedEnv,
    check_env_specs,
    make_multiagent_env,
)


class LeaveAndReturn(pettingzoo.ParallelEnv):
    """Three agents; ``b`` leaves after ``leave`` steps and comes back ``away`` steps later;
    the episode lasts ``length`` steps. Observations count steps; every action received is
    logged, so a test can check that no absent agent was ever stepped."""

    metadata = {"name": "leave_and_return"}

    def __init__(self, length: int = 6, leave: int = 2, away: int = 2) -> None:
        self.possible_agents = ["a", "b", "c"]
        self.length, self.leave, self.away = length, leave, away
        self.log: list[dict] = []
        self.state_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def observation_space(self, agent):
        return spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(3)

    def state(self):
        return np.array([self.t, len(self.agents)], np.float32)

    def _obs(self):
        return {a: np.array([self.t, ord(a)], np.float32) for a in self.agents}

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.log.append(dict(actions))
        self.t += 1
        rewards = {a: float(actions[a]) for a in self.agents}
        ended = self.t >= self.length
        leaving = self.t == self.leave and "b" in self.agents
        term = {a: ended or (a == "b" and leaving) for a in self.agents}
        trunc = dict.fromkeys(self.agents, False)
        obs = self._obs()
        if ended:
            self.agents = []
        elif leaving:
            self.agents = ["a", "c"]
        elif self.t == self.leave + self.away:
            self.agents = list(self.possible_agents)
            obs = self._obs()
        return obs, rewards, term, trunc, {a: {} for a in obs}


def test_shapes_and_specs_on_simple_spread():
    env = PettingZooEnv("mpe2:simple_spread_v3", num_envs=2, seed=0, max_cycles=4)
    td = env.reset()
    assert td["agents", "observation"].shape == (2, 3, 18)
    assert td["agents", "mask"].all() and td["state"].shape == (2, 54)
    assert env.action_spec.shape == (2, 3) and env.action_spec.n == 5
    check_env_specs(env, seed=0, steps=10)


def test_same_seeds_same_observations_and_rewards_as_the_raw_env():
    from mpe2 import simple_spread_v3

    env = PettingZooEnv("mpe2:simple_spread_v3", num_envs=2, seed=3, max_cycles=5, N=2)
    raws = [simple_spread_v3.parallel_env(max_cycles=5, N=2) for _ in range(2)]
    td = env.reset()
    for i, raw in enumerate(raws):
        obs, _ = raw.reset(seed=3 + i)
        for j, agent in enumerate(raw.possible_agents):
            np.testing.assert_allclose(td["agents", "observation"][i, j].numpy(), obs[agent])
        np.testing.assert_allclose(td["state"][i].numpy(), raw.state())
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        td["agents", "action"] = torch.randint(0, 5, (2, 2), generator=generator)
        td = env.step(td)
        for i, raw in enumerate(raws):
            acts = {a: int(td["agents", "action"][i, j]) for j, a in enumerate(raw.possible_agents)}
            obs, rew, _, _, _ = raw.step(acts)
            for j, agent in enumerate(raw.possible_agents):
                np.testing.assert_allclose(td["next", "agents", "observation"][i, j], obs[agent])
                assert td["next", "agents", "reward"][i, j, 0].item() == pytest.approx(rew[agent])
        td = env.step_mdp(td)
    assert td["done"].all() and td["truncated"].all() and not td["terminated"].any()


def test_agent_that_leaves_is_masked_never_stepped_and_restarts_with_its_own_is_init():
    made: list[LeaveAndReturn] = []

    def factory():
        made.append(LeaveAndReturn(length=6, leave=2, away=2))
        return made[-1]

    env = TransformedEnv(PettingZooEnv(factory, num_envs=2), InitTracker())
    data = env.rollout(6, lambda td: td.set(("agents", "action"), torch.full((2, 3), 2)))
    mask = data["agents", "mask"].squeeze(-1)[0, :, 1].tolist()  # agent b over time
    assert mask == [True, True, False, False, True, True]
    init_b = data["agents", "is_init"].squeeze(-1)[0, :, 1].tolist()
    assert init_b == [True, False, False, False, True, False]
    others = data["agents", "is_init"].squeeze(-1)[0, 1:, [0, 2]]
    assert not others.any()
    done_b = data["next", "agents", "done"].squeeze(-1)[0, :, 1].tolist()
    assert done_b == [False, True, True, False, False, True]
    reward_b = data["next", "agents", "reward"].squeeze(-1)[0, :, 1].tolist()
    assert reward_b == [2.0, 2.0, 0.0, 0.0, 2.0, 2.0]
    assert (data["next", "agents", "observation"][0, 2, 1] == 0).all()  # absent: zeros
    assert data["next", "done"].squeeze(-1)[0].tolist() == [False] * 5 + [True]
    assert [len(step) for step in made[0].log] == [3, 3, 2, 2, 3, 3]
    np.testing.assert_allclose(data["state"][0, :, 1].numpy(), [3, 3, 2, 2, 3, 3])


def test_partial_reset_per_row():
    lengths = iter([2, 3])

    def factory():
        return LeaveAndReturn(length=next(lengths), leave=10)

    env = PettingZooEnv(factory, num_envs=2, return_state=False)
    data = env.rollout(6, break_when_any_done=False)
    assert "state" not in data
    done = data["next", "done"].squeeze(-1).tolist()
    assert done == [[False, True] * 3, [False, False, True] * 2]
    assert data["agents", "observation"][:, :, 0, 0].tolist() == [[0, 1] * 3, [0, 1, 2] * 2]


def test_done_on_any_ends_the_row_when_one_agent_is_done():
    env = PettingZooEnv(lambda: LeaveAndReturn(length=6, leave=2), num_envs=1, done_on_any=True)
    data = env.rollout(6)
    assert data.shape == (1, 2)
    assert data["next", "agents", "done"][0, -1].all() and data["next", "terminated"][0, -1]


def test_groups_by_prefix_when_spaces_differ():
    with pytest.raises(ValueError, match="group_map='prefix'"):
        PettingZooEnv("mpe2:simple_adversary_v3", num_envs=1)
    env = PettingZooEnv("mpe2:simple_adversary_v3", num_envs=2, group_map="prefix", seed=0)
    td = env.reset()
    assert td["adversary"].batch_size == (2, 1) and td["agent"].batch_size == (2, 2)
    check_env_specs(env, seed=0, steps=4)


def test_env_ids_resolve_with_kwargs():
    env = make_multiagent_env("mpe2:simple_spread_v3", 2, seed=0, max_episode_steps=3, N=2)
    assert isinstance(env, PettingZooEnv)
    assert env.rollout(10).shape == (2, 3)
    with pytest.raises(ValueError, match="not a multi-agent env id"):
        make_multiagent_env("CartPole-v1", 2)
    with pytest.raises(ImportError, match="mpe2:simple_spread_v3"):
        PettingZooEnv("mpe2:no_such_task_v0")
