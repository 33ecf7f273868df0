"""MiniGridMemoryEnv against minigrid: the same episodes, step for step, give the same views,
directions, rewards and flags; resets draw what minigrid draws; errors name the fix."""

from __future__ import annotations

import functools

import gymnasium
import numpy as np
import pytest
import torch

pytest.importorskip("minigrid")

from recurrl.envs import GymVecEnv
from recurrl.envs.torch_envs import TORCH_ENVS, make_torch_env
from recurrl.envs.torch_envs.minigrid_memory import MEMORY_IDS, MiniGridMemoryEnv
from recurrl.envs.utils import RESET_KEY
from recurrl.trainers.encoders import NetworkInputs, inputs_vector_env
from tests.collectors._contract import check_collector_contract
from tests.collectors.test_collector import make_policy

KEYS = ("observation", "pixels")


def _layout_of(env: gymnasium.Env, torch_env: MiniGridMemoryEnv) -> list[int]:
    """The torch env's ``state`` row of a minigrid ``MemoryEnv`` just reset."""
    base = env.unwrapped
    mid = base.height // 2
    end = base.success_pos[0] - 1  # the goal cells are one column past the hallway's end
    obj = 0 if base.grid.get(1, mid - 1).type == "key" else 1
    side = 0 if base.grid.get(end + 1, mid - 2).type == "ball" else 1
    (layout,) = [i for i, row in enumerate(torch_env._layouts.tolist()) if row == [end, obj, side]]
    x, y = (int(v) for v in base.agent_pos)
    assert (y, base.agent_dir) == (mid, 0)
    return [layout, x, y, 0]


def _play_both(env_id: str, episodes: int, seed: int, max_episode_steps: int | None = None):
    """Play ``episodes`` episodes of minigrid (one env, behind ``NetworkInputs``) and of the
    torch env (row 0 of 2, put into minigrid's state at every reset) with the same random
    actions, and compare every step. Returns the episodes' lengths and last rewards."""
    kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    ref = NetworkInputs(gymnasium.make(f"minigrid:{env_id}", **kwargs), warn=False)
    env = make_torch_env(env_id, 2, seed=seed, **kwargs)
    rng = np.random.default_rng(seed)
    # forward-heavy random actions, so that episodes reach the split and end there
    probs = np.array([0.15, 0.15, 0.5, 0.05, 0.05, 0.05, 0.05])
    ends = []
    for episode in range(episodes):
        obs, _ = ref.reset(seed=seed * 1000 + episode)
        root = env.reset()
        state = env.state.clone()
        state[0] = torch.tensor(_layout_of(ref, env))
        env.state = state
        root.update({"pixels": env._pixels(), "observation": env._eye[state[:, 3]]})
        for key in KEYS:
            np.testing.assert_array_equal(root[key][0].numpy(), obs[key], err_msg=key)
        for t in range(1000):
            action = int(rng.choice(7, p=probs))
            obs, reward, terminated, truncated, _ = ref.step(action)
            root["action"] = torch.tensor([action, 0])
            full = env.step(root)
            td = full["next"]
            for key in KEYS:
                np.testing.assert_array_equal(td[key][0].numpy(), obs[key], err_msg=f"{key} {t}")
            assert td["reward"][0].item() == np.float32(reward), t
            assert td["terminated"][0].item() == terminated, t
            assert td["truncated"][0].item() == truncated, t
            if terminated or truncated:
                ends.append((t + 1, float(reward), terminated))
                break
            root = env.step_mdp(full)
            if root["done"][1]:  # the other row ended: start it over
                root[RESET_KEY] = torch.tensor([[False], [True]])
                root.update(env.reset(root))
                del root[RESET_KEY]
    ref.close()
    return ends


@pytest.mark.parametrize("env_id", ["MiniGrid-MemoryS7-v0", "MiniGrid-MemoryS13Random-v0"])
@pytest.mark.slow  # thousands of steps of both engines
def test_episodes_match_minigrid(env_id):
    ends = _play_both(env_id, episodes=40, seed=3)
    assert len(ends) == 40
    wins = [r for _, r, term in ends if term and r > 0]
    losses = [r for _, r, term in ends if term and r == 0]
    assert wins and losses  # both goal cells were reached (and compared)


def test_episodes_match_minigrid_truncation_and_a_shorter_time_limit():
    ends = _play_both("MiniGrid-MemoryS7-v0", episodes=6, seed=0, max_episode_steps=12)
    assert any(length == 12 and not term for length, _, term in ends)
    assert all(length <= 12 for length, _, _ in ends)


def test_minigrids_own_time_limit_truncates_at_245_steps():
    env = make_torch_env("minigrid:MiniGrid-MemoryS7-v0", 2, seed=0, max_episode_steps=1000)
    assert env.max_steps == env.max_episode_steps == 245
    left = torch.zeros(2, dtype=torch.int64)  # turn left forever
    data = env.rollout(245, lambda td: td.set("action", left), tensordict=env.reset(),
                       auto_reset=False)  # fmt: skip
    assert data.batch_size == (2, 245)
    assert data["next", "truncated"][:, -1].all() and not data["next", "truncated"][:, :-1].any()
    assert not data["next", "terminated"].any() and not data["next", "reward"].any()


def test_the_success_reward_scales_with_the_steps_taken():
    """Start in the doorway facing east (column 4 of S7): forward, then the turn towards the
    match and forward again ends the episode at step 3 with minigrid's 1 - 0.9 * 3 / 245."""
    env = MiniGridMemoryEnv(1, seed=0)
    root = env.reset()
    layout = 0  # end 4, key in the room, [ball, key] at the split: the key is south
    env.state = torch.tensor([[layout, 4, 3, 0]])
    for action in (2, 1, 2):  # forward to (5, 3), turn right (south), forward to (5, 4)
        root["action"] = torch.tensor([action])
        td = env.step(root)
        root = env.step_mdp(td)
    assert td["next", "terminated"].item()
    assert td["next", "reward"].item() == np.float32(1 - 0.9 * 3 / 245)


def test_resets_draw_every_layout_and_start_uniformly():
    env = MiniGridMemoryEnv(20_000, seed=0)
    env.reset()
    layout, x, y, d = env.state.unbind(-1)
    assert (y == 3).all() and (d == 0).all()
    for values, count in ((layout, 4), (x - 1, 4)):
        freq = torch.bincount(values, minlength=count).float() / values.numel()
        assert torch.allclose(freq, torch.full((count,), 1 / count), atol=0.02), freq
    random = MiniGridMemoryEnv(20_000, size=13, random_length=True, seed=0)
    random.reset()
    ends = random._layouts[random.state[:, 0], 0]
    assert set(ends.tolist()) == set(range(4, 11))
    # the start column is uniform in [1, end] for each hallway length
    starts = random.state[:, 1][ends == 7]
    assert set(starts.tolist()) == set(range(1, 8))


def test_the_views_are_minigrids_for_every_cell_and_direction():
    """Every (layout, free cell, direction) of S7 (all are reachable) is minigrid's view."""
    from minigrid.envs import MemoryEnv

    env = MiniGridMemoryEnv(1, seed=0)
    ref = MemoryEnv(size=7)
    seen = set()
    for seed in range(40):
        ref.reset(seed=seed)
        layout = _layout_of(ref, env)[0]
        if layout in seen:
            continue
        seen.add(layout)
        cells = [(x, y) for x in range(7) for y in range(7) if env._free[layout, x, y]]
        assert len(cells) == 12  # the room (8), its doorway, the split (3)
        for (x, y), d in ((cell, d) for cell in cells for d in range(4)):
            ref.agent_pos, ref.agent_dir = (x, y), d
            env.state = torch.tensor([[layout, x, y, d]])
            np.testing.assert_array_equal(env._pixels()[0].numpy(), ref.gen_obs()["image"])
    assert seen == {0, 1, 2, 3}


def test_specs_and_keys_equal_the_trainers_gymnasium_env():
    env = make_torch_env("minigrid:MiniGrid-MemoryS7-v0", 3, seed=0)
    reference = GymVecEnv(inputs_vector_env("minigrid:MiniGrid-MemoryS7-v0", 3))
    try:
        for name in ("observation_spec", "full_action_spec", "full_reward_spec", "done_spec"):
            assert getattr(env, name) == getattr(reference, name), name
        torch.manual_seed(0)
        a = env.rollout(3, break_when_any_done=False)
        b = reference.rollout(3, break_when_any_done=False)
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in b.keys(True, True):
            assert (a[key].shape, a[key].dtype) == (b[key].shape, b[key].dtype), key
    finally:
        reference.close()


def test_the_registry_spells_every_memory_id_both_ways():
    for name, (size, random_length) in MEMORY_IDS.items():
        gymnasium.spec(f"{name}")  # minigrid registers it (imported above)
        for env_id in (name, f"minigrid:{name}"):
            factory = TORCH_ENVS[env_id]
            assert isinstance(factory, functools.partial)
            assert factory.keywords == {"size": size, "random_length": random_length}


def test_collector_contract():
    """Episodes end inside the batches (a short time limit and the goal cells): ids,
    ``is_init``, the carried hidden state and recurrent-mode replay keep the contract."""
    env = make_torch_env("minigrid:MiniGrid-MemoryS7-v0", 4, seed=0, max_episode_steps=9)
    lstm, policy = make_policy(obs_dim=4, n_actions=7)
    check_collector_contract(env, lstm, policy, steps=24, batches=4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"size": 8}, r"size an odd int >= 7.*received 8"),
        ({"size": 5}, r"size an odd int >= 7.*received 5"),
        ({"size": 7.0}, r"size an odd int >= 7.*received 7.0"),
        ({"max_episode_steps": 0}, r"max_episode_steps an int >= 1"),
    ],
)
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MiniGridMemoryEnv(2, **kwargs)


def test_without_minigrid_the_error_says_what_to_install(monkeypatch):
    import builtins

    from recurrl.envs.torch_envs import minigrid_memory

    real_import = builtins.__import__

    def no_minigrid(name, *args, **kwargs):
        if name.startswith("minigrid"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_minigrid)
    with pytest.raises(ImportError, match=r'Fix: pip install "recurrl\[minigrid\]"'):
        minigrid_memory._require_minigrid()
