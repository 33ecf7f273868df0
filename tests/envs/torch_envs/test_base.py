"""The contract every batched torch env keeps (TorchEnv): specs, partial resets of the
masked envs only, seeding, refusing to step a finished env, CPU/CUDA agreement."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from recurrl.envs import check_env_specs, make_torch_env
from recurrl.envs.torch_envs import TORCH_ENVS
from recurrl.envs.utils import RESET_KEY

# one id per env: the trainer's -masked ids and the module:EnvId spellings repeat a factory;
# MiniGrid's envs render their views with minigrid (an optional extra)
IDS = [
    i
    for i in sorted(TORCH_ENVS)
    if not i.endswith("-masked")
    and ":" not in i
    and ("MiniGrid" not in i or importlib.util.find_spec("minigrid") is not None)
]
#: the tensors that hold an env's state, by task (copied between envs in the tests)
STATE = ("state", "decks", "counts", "steps", "_needs_reset")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _actions(env, steps: int, seed: int = 0) -> list[torch.Tensor]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return [env.action_spec.rand().to(env.device) for _ in range(steps)]


def _play(env, actions) -> list:
    """``step_and_maybe_reset`` with the given actions; the steps taken."""
    root, out = env.reset(), []
    for action in actions:
        root["action"] = action
        td, root = env.step_and_maybe_reset(root)
        out.append(td)
    return out


def _assert_same_steps(a: list, b: list, atol: float = 0.0) -> None:
    for x, y in zip(a, b, strict=True):
        assert set(x.keys(True, True)) == set(y.keys(True, True))
        for key in y.keys(True, True):
            torch.testing.assert_close(x[key].cpu(), y[key].cpu(), rtol=0, atol=atol, msg=key)


@pytest.mark.parametrize("env_id", IDS)
def test_check_env_specs(env_id):
    check_env_specs(make_torch_env(env_id, 3, seed=0), seed=0, steps=60)


@pytest.mark.parametrize("env_id", IDS)
def test_same_seed_same_trajectories_other_seed_others(env_id):
    actions = _actions(make_torch_env(env_id, 4), 120)
    first = _play(make_torch_env(env_id, 4, seed=7), actions)
    _assert_same_steps(_play(make_torch_env(env_id, 4, seed=7), actions), first)
    reseeded = make_torch_env(env_id, 4, seed=1)
    reseeded.set_seed(7)
    _assert_same_steps(_play(reseeded, actions), first)
    other = _play(make_torch_env(env_id, 4, seed=8), actions)
    observed = make_torch_env(env_id, 1).observation_spec.keys()  # MiniGrid's: and "pixels"
    assert not all(torch.equal(other[0][key], first[0][key]) for key in observed)


@pytest.mark.parametrize("env_id", IDS)
def test_partial_reset_resets_only_the_masked_envs(env_id):
    """After a reset of env 1 alone, envs 0 and 2 step on exactly as a twin that was not
    reset; env 1 starts over (step count 0, its first observation)."""
    env, twin = make_torch_env(env_id, 3, seed=0), make_torch_env(env_id, 3, seed=0)
    actions = _actions(env, 10)
    if env_id.startswith("CartPole"):  # left, right, ...: no episode ends in 10 steps
        actions = [torch.full((3,), t % 2) for t in range(10)]
    root, twin_root = env.reset(), twin.reset()
    for action in actions[:4]:
        root["action"] = twin_root["action"] = action
        root = env.step_mdp(env.step(root))
        twin_root = twin.step_mdp(twin.step(twin_root))
    root[RESET_KEY] = torch.tensor([[False], [True], [False]])
    fresh = env.reset(root)
    assert fresh.get(RESET_KEY, None) is None
    assert env.steps.tolist() == [4, 0, 4]
    kept = torch.tensor([True, False, True])
    for key in ("observation", "done", "terminated", "truncated"):
        assert torch.equal(fresh[key][kept], twin_root[key][kept]), key
    root.update(fresh)
    del root[RESET_KEY]
    for action in actions[4:]:
        root["action"] = twin_root["action"] = action
        td, twin_td = env.step(root), twin.step(twin_root)
        for key in ("observation", "reward", "done"):
            assert torch.equal(td["next", key][kept], twin_td["next", key][kept]), key
        root, twin_root = env.step_mdp(td), twin.step_mdp(twin_td)
    assert env.steps.tolist() == [10, 6, 10]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "popgym-RepeatFirstEasy-v0"])
def test_stepping_a_finished_env_without_reset_raises(env_id):
    env = make_torch_env(env_id, 2, seed=0, max_episode_steps=3)
    with pytest.raises(RuntimeError, match=r"env\(s\) \[0, 1\] are done \(or were never reset\)"):
        env.step(env.rand_action())
    root = env.reset()
    for _ in range(3):
        root = env.step_mdp(env.step(env.rand_action(root)))
    assert root["done"].all()
    with pytest.raises(RuntimeError, match=r"env\(s\) \[0, 1\] are done.*Fix: reset them"):
        env.step(env.rand_action(root))
    root[RESET_KEY] = torch.tensor([[True], [False]])
    root.update(env.reset(root))
    with pytest.raises(RuntimeError, match=r"env\(s\) \[1\] are done"):
        env.step(env.rand_action(root))


@pytest.mark.parametrize("env_id", IDS)
def test_rollout_without_break_runs_through_episode_ends(env_id):
    env = make_torch_env(env_id, 2, seed=0, max_episode_steps=9)
    torch.manual_seed(0)
    data = env.rollout(30, break_when_any_done=False)
    done = data["next", "done"].squeeze(-1)
    assert data.batch_size == (2, 30) and done.sum() >= 2 * 3
    starts = torch.zeros_like(done)
    starts[:, 1:] = done[:, :-1]
    steps = torch.zeros_like(done, dtype=torch.int64)  # steps since the episode start
    for t in range(1, 30):
        steps[:, t] = torch.where(starts[:, t], 0, steps[:, t - 1] + 1)
    assert (steps < 9).all()  # a reset after every end, at the latest at the time limit


def _copy_state(src, dst) -> None:
    for name in STATE:
        value = getattr(src, name, None)
        if isinstance(value, list):
            setattr(dst, name, [v.to(dst.device) for v in value])
        elif value is not None:
            setattr(dst, name, value.to(dst.device))


@cuda
@pytest.mark.parametrize("env_id", IDS)
def test_cuda_matches_cpu(env_id):
    """The same state and actions give the same steps on CUDA as on CPU (resets aside:
    the generators differ by device); everything the CUDA env writes lives there."""
    cpu = make_torch_env(env_id, 64, seed=0, max_episode_steps=1000)
    gpu = make_torch_env(env_id, 64, seed=0, device="cuda", max_episode_steps=1000)
    check_env_specs(gpu, seed=0, steps=20)
    root, gpu_root = cpu.reset(), gpu.reset()
    _copy_state(cpu, gpu)
    gpu_root = root.to("cuda")
    for action in _actions(cpu, 40):
        root["action"], gpu_root["action"] = action, action.cuda()
        td, gpu_td = cpu.step(root), gpu.step(gpu_root)
        if td["next", "done"].any():
            break
        assert all(v.is_cuda for v in gpu_td.values(True, True))
        _assert_same_steps([gpu_td], [td], atol=1e-5)
        root, gpu_root = cpu.step_mdp(td), gpu.step_mdp(gpu_td)


@cuda
@pytest.mark.parametrize("env_id", ["CartPole-v1", "popgym-CountRecallHard-v0"])
def test_cuda_partial_resets_and_seeding(env_id):
    envs = [make_torch_env(env_id, 256, seed=3, device="cuda") for _ in range(2)]
    actions = _actions(envs[0], 300)
    _assert_same_steps(_play(envs[0], actions), _play(envs[1], actions))


@pytest.mark.parametrize("env_id", ["CartPole-v1", "popgym-RepeatPreviousEasy-v0"])
def test_an_action_of_another_shape_is_refused(env_id):
    """``[N, 1]`` against a ``[N]`` spec would broadcast envs against each other."""
    env = make_torch_env(env_id, 3, seed=0)
    root = env.reset()
    root["action"] = torch.zeros(3, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"expected an action of shape \(3,\).*received \(3, 1\)"):
        env.step(root)


def test_policy_argument_adds_the_recurrent_transforms():
    from recurrl.envs import CartPoleEnv
    from tests.collectors.test_collector import make_policy

    _, policy = make_policy(obs_dim=4)
    env = CartPoleEnv(2, seed=0, policy=policy)
    assert type(env).__name__ == "TransformedEnv" and type(env.base_env).__name__ == "CartPoleEnv"
    assert {"is_init", "rs_h", "rs_c"} <= set(env.reset().keys())


def test_a_task_missing_a_hook_is_named():
    from recurrl.envs.torch_envs._base import TorchEnv

    class Half(TorchEnv):
        pass

    env = Half(2, seed=0)
    with pytest.raises(NotImplementedError, match=r"Half does not implement _reset_envs"):
        env.reset()
    with pytest.raises(NotImplementedError, match=r"Half does not implement _advance"):
        env._advance(torch.zeros(2))
