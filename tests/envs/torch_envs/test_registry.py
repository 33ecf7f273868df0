"""TORCH_ENVS, has_torch_env and make_torch_env: every id builds, with the specs that
GymVecEnv gives for the same id (the base gymnasium id for the trainer's masked ones; for
MiniGrid's, the trainer's NetworkInputs view of them)."""

from __future__ import annotations

import pytest
import torch

from recurrl.envs import GymVecEnv, has_torch_env, make_torch_env
from recurrl.envs.torch_envs import TORCH_ENVS

#: the trainer's built-in masked ids and the gymnasium ids they mask
MASKED = {"CartPole-masked": "CartPole-v1", "Pendulum-masked": "Pendulum-v1"}
SPECS = ("observation_spec", "full_action_spec", "full_reward_spec", "done_spec", "state_spec")


def test_the_registry_lists_the_required_ids():
    popgym = [
        f"popgym-{task}{level}-v0"
        for task in ("RepeatPrevious", "RepeatFirst", "CountRecall")
        for level in ("Easy", "Medium", "Hard")
    ]
    memory = [
        f"MiniGrid-Memory{s}-v0" for s in ("S7", "S9", "S11", "S13", "S13Random", "S17Random")
    ]
    minigrid = [*memory, *(f"minigrid:{i}" for i in memory)]
    assert set(TORCH_ENVS) == {"CartPole-v1", "Pendulum-v1", *MASKED, *popgym, *minigrid}
    assert TORCH_ENVS["minigrid:MiniGrid-MemoryS7-v0"] is TORCH_ENVS["MiniGrid-MemoryS7-v0"]
    assert TORCH_ENVS["CartPole-masked"] is TORCH_ENVS["CartPole-v1"]
    assert TORCH_ENVS["Pendulum-masked"] is TORCH_ENVS["Pendulum-v1"]
    assert all(has_torch_env(i) for i in TORCH_ENVS)
    assert not has_torch_env("Acrobot-v1") and not has_torch_env("popgym-AutoencodeEasy-v0")


@pytest.mark.filterwarnings("ignore::UserWarning")  # popgym's checkers, MiniGrid's mission
@pytest.mark.parametrize("env_id", sorted(TORCH_ENVS))
def test_specs_equal_gym_vec_envs(env_id):
    if "MiniGrid" in env_id:  # the torch env renders its view table with minigrid itself
        pytest.importorskip("minigrid", reason="the minigrid extra is not installed")
    env = make_torch_env(env_id, 3, seed=0)
    if "MiniGrid" in env_id:  # a Dict observation with a mission text: the trainer's view
        from recurrl.trainers.encoders import inputs_vector_env

        name = env_id if ":" in env_id else f"minigrid:{env_id}"
        reference = GymVecEnv(inputs_vector_env(name, 3))
    else:
        reference = GymVecEnv(MASKED.get(env_id, env_id), num_envs=3)
    try:
        assert env.batch_size == reference.batch_size == torch.Size([3])
        for name in SPECS:
            assert getattr(env, name) == getattr(reference, name), (env_id, name)
        # and what both write has the same keys, shapes and dtypes
        a, b = env.reset(), reference.reset()
        keys = set(b.keys())
        assert set(a.keys()) == keys
        for key in keys:
            assert (a[key].shape, a[key].dtype) == (b[key].shape, b[key].dtype), key
        torch.manual_seed(0)
        a = env.rollout(3, break_when_any_done=False)
        b = reference.rollout(3, break_when_any_done=False)
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in b.keys(True, True):
            assert (a[key].shape, a[key].dtype) == (b[key].shape, b[key].dtype), key
    finally:
        reference.close()


def test_arguments_reach_the_env():
    env = make_torch_env("CartPole-v1", 2, seed=3, max_episode_steps=7)
    assert env.max_episode_steps == 7 and env.device == torch.device("cpu")
    data = env.rollout(7)
    assert data["next", "truncated"][:, -1].all() or data["next", "terminated"].any()
    twin = make_torch_env("CartPole-v1", 2, seed=3)
    assert torch.equal(twin.reset()["observation"], data["observation"][:, 0])
    assert twin.max_episode_steps == 500
    assert make_torch_env("popgym-CountRecallMedium-v0", 2).difficulty == "medium"


def test_unknown_id_names_the_available_ones():
    with pytest.raises(ValueError, match=r"no batched torch env for 'Acrobot-v1'.*CartPole-v1"):
        make_torch_env("Acrobot-v1", 2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_envs": 0}, "num_envs an int >= 1"),
        ({"num_envs": 2.0}, "num_envs an int >= 1"),
        ({"num_envs": 2, "max_episode_steps": 0}, "max_episode_steps an int >= 1"),
    ],
)
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_torch_env("CartPole-v1", **kwargs)


def test_invalid_difficulty():
    from recurrl.envs import RepeatFirstEnv

    with pytest.raises(ValueError, match=r"difficulty in \('easy', 'medium', 'hard'\)"):
        RepeatFirstEnv(2, "Easy")
