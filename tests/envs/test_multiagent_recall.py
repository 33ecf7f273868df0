"""MultiAgentRecallEnv: the key convention, masks, re-entry, known answers, partial resets."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from recurrl.envs import InitTracker, TransformedEnv, check_env_specs
from recurrl.testing import MultiAgentRecallEnv


def _oracle(env: MultiAgentRecallEnv):
    """A policy with perfect memory of each agent's cue (reads the env's cue: the answer)."""

    def policy(td):
        td.set(("agents", "action"), env.cue.clone())
        return td

    return policy


def test_shapes_follow_the_convention():
    env = MultiAgentRecallEnv(batch_size=(4,), n_agents=3, num_cues=3)
    td = env.reset()
    assert td["agents"].batch_size == (4, 3)
    assert td["agents", "observation"].shape == (4, 3, 3 + 1 + 3)
    assert td["agents", "mask"].shape == (4, 3, 1) and td["agents", "mask"].all()
    assert td["state"].shape == (4, 3 * 3 + 1)
    assert td["done"].shape == (4, 1)
    td = env.step(env.rand_action(td))
    assert td["agents", "action"].shape == (4, 3) and td["agents", "action"].dtype == torch.int64
    for key in ("reward", "done", "terminated", "truncated"):
        assert td["next", "agents", key].shape == (4, 3, 1)
    check_env_specs(env, seed=0, steps=12)


def test_agents_finish_at_their_lengths_and_are_masked():
    env = MultiAgentRecallEnv(batch_size=(2,), n_agents=3, lengths=(4, 3, 2))
    data = env.rollout(4)
    mask = data["agents", "mask"].squeeze(-1)[0].T  # [agent, t]
    assert mask.tolist() == [[True] * 4, [True] * 3 + [False], [True] * 2 + [False] * 2]
    done = data["next", "agents", "done"].squeeze(-1)[0].T
    assert done.tolist() == [[False] * 3 + [True], [False, False, True, True],
                             [False, True, True, True]]  # fmt: skip
    assert data["next", "done"].squeeze(-1).tolist() == [[False] * 3 + [True]] * 2
    # masked agents: zero reward, zero observation, their actions never used
    masked = ~data["agents", "mask"].squeeze(-1)
    assert (data["next", "agents", "reward"].squeeze(-1)[masked] == 0).all()
    assert env.actions_taken.tolist() == [[4, 3, 2]] * 2


def test_masked_actions_are_ignored():
    """Garbage in a masked agent's action changes nothing (it is never used)."""
    runs = []
    for garbage in (0, 1):
        env = MultiAgentRecallEnv(batch_size=(3,), n_agents=2, lengths=(4, 2))
        env.set_seed(7)
        td = env.reset()
        rewards = []
        for _ in range(4):
            action = env.cue.clone()
            acting = td["agents", "mask"].squeeze(-1)
            action[~acting] = garbage
            td["agents", "action"] = action
            td = env.step(td)
            rewards.append(td["next", "agents", "reward"])
            td = env.step_mdp(td)
        runs.append(torch.stack(rewards))
    torch.testing.assert_close(runs[0], runs[1])


def test_known_answers_memory_vs_memoryless():
    env = MultiAgentRecallEnv(batch_size=(256,), n_agents=2, num_cues=2, lengths=(3, 2))
    env.set_seed(0)
    data = env.rollout(3, _oracle(env))
    per_agent = data["next", "agents", "reward"].sum(1).squeeze(-1)
    assert (per_agent == 1).all()
    data = env.rollout(3, lambda td: td.set(("agents", "action"), torch.zeros(256, 2).long()))
    mean = data["next", "agents", "reward"].sum(1).mean().item()
    assert 0.35 < mean < 0.65  # 1 / num_cues


def test_cue_only_at_each_agents_first_step_and_query_at_its_last():
    env = MultiAgentRecallEnv(batch_size=(1,), n_agents=2, num_cues=2, lengths=(3, 2))
    env.set_seed(3)
    data = env.rollout(3)
    obs = data["agents", "observation"][0]  # [t, agent, D]
    cue = env.cue[0]
    for agent, length in enumerate((3, 2)):
        assert obs[0, agent, :2].argmax() == cue[agent] and obs[0, agent, :2].sum() == 1
        assert (obs[1:, agent, :2] == 0).all()
        assert obs[length - 1, agent, 2] == 1 and obs[: length - 1, agent, 2].sum() == 0
        assert obs[:length, agent, 3 + agent].tolist() == [1.0] * length


def test_reenter_gives_a_fresh_episode_and_a_per_agent_is_init():
    env = TransformedEnv(
        MultiAgentRecallEnv(batch_size=(2,), n_agents=3, lengths=(4, 3, 2), reenter=(2, 3)),
        InitTracker(),
    )
    data = env.rollout(5)
    assert data["next", "done"].squeeze(-1)[0].tolist() == [False] * 4 + [True]
    mask = data["agents", "mask"].squeeze(-1)[0, :, 2].tolist()
    assert mask == [True, True, False, True, True]
    init = data["agents", "is_init"].squeeze(-1)[0].T.tolist()
    assert init == [[True] + [False] * 4, [True] + [False] * 4, [True, False, False, True, False]]
    assert data["is_init"].squeeze(-1)[0].tolist() == [True] + [False] * 4
    # the re-entering agent sees a cue at its new first step
    assert data["agents", "observation"][0, 3, 2, :2].sum() == 1


def test_immediate_reentry_is_done_and_masked_true():
    env = TransformedEnv(
        MultiAgentRecallEnv(batch_size=(1,), n_agents=2, lengths=(5, 2), reenter=(1, 2)),
        InitTracker(),
    )
    data = env.rollout(5)
    assert data["agents", "mask"].squeeze(-1)[0, :, 1].tolist() == [True] * 4 + [False]
    assert data["next", "agents", "done"].squeeze(-1)[0, :, 1].tolist()[:3] == [False, True, False]
    init = data["agents", "is_init"].squeeze(-1)[0, :, 1].tolist()
    assert init == [True, False, True, False, False]


def test_partial_reset_per_row():
    env = MultiAgentRecallEnv(batch_size=(2,), n_agents=2, lengths=[[2, 2], [3, 2]])
    data = env.rollout(6, break_when_any_done=False)
    assert data["next", "done"].squeeze(-1).tolist() == [
        [False, True] * 3,
        [False, False, True] * 2,
    ]
    # row 0 restarted: all its agents act again
    assert data["agents", "mask"][0, 2].all()


def test_partial_reset_keeps_other_rows():
    env = MultiAgentRecallEnv(batch_size=(2,), n_agents=2)
    td = env.step_mdp(env.step(env.rand_action(env.reset())))
    before = td["agents", "observation"][1].clone()
    td["_reset"] = torch.tensor([[True], [False]])
    out = env.reset(td)
    torch.testing.assert_close(out["agents", "observation"][1], before)
    assert env.t.tolist() == [0, 1]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_agents": 0}, "n_agents >= 1"),
        ({"num_cues": 1}, "num_cues >= 2"),
        ({"lengths": (1, 2, 3)}, "lengths >= 2"),
        ({"lengths": (2, 3)}, "one per agent"),
        ({"reenter": (5, 4)}, "agent index"),
        ({"reenter": (0, 2)}, "re-enter at step >= 4"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiAgentRecallEnv(batch_size=(2,), **kwargs)


def test_seeded_envs_repeat():
    outs = []
    for _ in range(2):
        env = MultiAgentRecallEnv(batch_size=(3,))
        env.set_seed(11)
        torch.manual_seed(0)
        outs.append(env.rollout(5, break_when_any_done=False))
    assert (outs[0] == outs[1]).all()
    assert isinstance(outs[0], TensorDict)
