import pytest
import torch

from recurrl.envs import Compose, InitTracker, RewardSum, TeamReward, TransformedEnv
from recurrl.testing import MultiAgentRecallEnv


def _env(**kwargs):
    base = MultiAgentRecallEnv(n_agents=3, batch_size=[4], lengths=(4, 3, 2))
    base.set_seed(0)
    return TransformedEnv(base, Compose(InitTracker(), TeamReward(**kwargs), RewardSum()))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_team_reward_reduces_the_agents_rewards_and_sums_into_the_episode_return(reduction):
    env = _env(reduction=reduction)
    assert env.reward_spec.shape == torch.Size([4, 1])
    data = env.rollout(8, break_when_any_done=False)
    agents = data["next", "agents", "reward"]
    expected = agents.mean(-2) if reduction == "mean" else agents.sum(-2)
    torch.testing.assert_close(data["next", "reward"], expected)
    # the episode return of a row is the sum of its team rewards since its reset
    done = data["next", "done"].squeeze(-1)
    row = 0
    end = int(done[row].nonzero()[0])
    torch.testing.assert_close(
        data["next", "episode_reward"][row, end], data["next", "reward"][row, : end + 1].sum(0)
    )


def test_team_reward_refuses_bad_arguments():
    with pytest.raises(ValueError, match="reduction"):
        TeamReward(reduction="max")
    with pytest.raises(ValueError, match="inside the group"):
        TeamReward(out_key=("agents", "team"))
    base = MultiAgentRecallEnv(n_agents=2, batch_size=[2])
    with pytest.raises(KeyError, match="TeamReward"):
        _ = TransformedEnv(base, TeamReward(group="robots")).reward_spec
