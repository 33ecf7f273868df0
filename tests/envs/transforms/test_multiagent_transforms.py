"""InitTracker, TensorDictPrimer and step_mdp on agent groups ([*B, n_agents] sub-TensorDicts)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from recurrl.envs import (
    InitTracker,
    TensorDictPrimer,
    TransformedEnv,
    Unbounded,
    check_env_specs,
    step_mdp,
)
from recurrl.testing import CountingEnv, MultiAgentRecallEnv

STATE = ("agents", "rs_h")


def _env(**kwargs) -> TransformedEnv:
    base = MultiAgentRecallEnv(batch_size=(2,), n_agents=3, **kwargs)
    env = TransformedEnv(base, InitTracker())
    env.append_transform(TensorDictPrimer({STATE: Unbounded((3, 1, 4))}, expand_specs=True))
    return env


def test_specs_declare_the_per_agent_keys():
    env = _env()
    spec = env.observation_spec
    assert spec["agents", "is_init"].shape == (2, 3, 1)
    assert spec[STATE].shape == (2, 3, 1, 4)
    assert spec["is_init"].shape == (2, 1)
    check_env_specs(env, seed=0, steps=10)


def test_init_tracker_marks_every_agent_of_a_reset_row():
    env = _env(lengths=[[2, 2, 2], [4, 3, 2]])
    td = env.reset()
    assert td["agents", "is_init"].all()
    for _ in range(2):
        td = env.step_mdp(env.step(env.rand_action(td)))
    assert not td["agents", "is_init"].any()
    td["_reset"] = torch.tensor([[True], [False]])
    out = env.reset(td)
    assert out["agents", "is_init"].squeeze(-1).tolist() == [[True] * 3, [False] * 3]
    assert out["is_init"].squeeze(-1).tolist() == [True, False]


def test_init_tracker_marks_an_agent_that_enters_or_restarts_at_once():
    env = TransformedEnv(
        MultiAgentRecallEnv(batch_size=(1,), n_agents=2, lengths=(6, 2), reenter=(1, 4)),
        InitTracker(),
    )
    data = env.rollout(6)
    init = data["agents", "is_init"][0, :, 1, 0].tolist()
    assert init == [True, False, False, False, True, False]
    assert not data["agents", "is_init"][0, 1:, 0].any()
    env = TransformedEnv(
        MultiAgentRecallEnv(batch_size=(1,), n_agents=2, lengths=(6, 2), reenter=(1, 2)),
        InitTracker(),
    )
    data = env.rollout(6)  # agent 1 done at step 1 and acting again at step 2
    init = data["agents", "is_init"][0, :, 1, 0].tolist()
    assert init == [True, False, True, False, False, False]


def test_primer_zero_fills_reset_rows_only():
    env = _env()
    td = env.reset()
    assert td[STATE].shape == (2, 3, 1, 4) and (td[STATE] == 0).all()
    td = env.rand_action(td)
    td[("next", *STATE)] = torch.ones(2, 3, 1, 4)
    td = env.step_mdp(env.step(td))
    td["_reset"] = torch.tensor([[False], [True]])
    out = env.reset(td)
    assert (out[STATE][0] == 1).all() and (out[STATE][1] == 0).all()


def test_primer_stores_the_initial_state_of_a_restarting_agent_only():
    env = _env(lengths=(5, 4, 2), reenter=(2, 3))
    td = env.reset()
    for t in range(4):
        td = env.rand_action(td)
        written = torch.full((2, 3, 1, 4), float(t + 1))
        td[("next", *STATE)] = written
        td = env.step(td)
        if t == 3:  # agent 2 re-entered: its stored state is zeros, the others' kept
            assert td["agents", "is_init"].squeeze(-1).tolist() == [[False, False, True]] * 2
            assert (td[STATE][:, 2] == 0).all() and (td[STATE][:, :2] == 3).all()
            assert (td[("next", *STATE)] == written).all()  # the module's output stays
            assert (written[:, 2] == 4).all()  # the previous step's tensor was not written to
        td = env.step_mdp(td)


def test_step_mdp_keeps_the_group_batch_dims():
    td = TensorDict(
        {
            "agents": TensorDict({"action": torch.zeros(2, 3)}, [2, 3]),
            "next": {"agents": TensorDict({"observation": torch.ones(2, 3, 4)}, [2, 3])},
        },
        [2],
    )
    out = step_mdp(td, keys=[("agents", "observation")], action_keys=[("agents", "action")])
    assert out["agents"].batch_size == (2, 3)
    assert ("agents", "action") not in out.keys(True)


def test_single_agent_envs_get_no_group_keys():
    env = TransformedEnv(CountingEnv(batch_size=(2,)), InitTracker())
    td = env.step(env.rand_action(env.reset()))
    assert set(td["next"].keys()) == {"observation", "reward", "done", "terminated",
                                      "truncated", "is_init"}  # fmt: skip


def test_missing_mask_in_the_step_input_is_named():
    env = _env()
    td = env.rand_action(env.reset())
    del td["agents", "mask"]
    with pytest.raises(KeyError, match="mask"):
        env.step(td)
