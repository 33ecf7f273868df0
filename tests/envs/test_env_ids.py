"""``module:EnvId`` env ids (gymnasium's spelling): the module is imported first."""

import sys

import pytest

from recurrl.envs import GymEnv
from recurrl.envs.gym import import_env_package, split_env_id

CARTPOLE = "gymnasium.envs.classic_control:CartPole-v1"


def test_split_env_id():
    assert split_env_id("minigrid:MiniGrid-MemoryS7-v0") == ("minigrid", "MiniGrid-MemoryS7-v0")
    assert split_env_id("a.b:ns/Task-v2") == ("a.b", "ns/Task-v2")
    assert split_env_id("CartPole-v1") == (None, "CartPole-v1")
    for bad in (":Task-v0", "mod:", "a:b:Task-v0", "not-a-module:Task-v0"):
        with pytest.raises(ValueError, match="expected 'module:EnvId'"):
            split_env_id(bad)


def test_module_is_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)  # any stdlib module
    import_env_package("colorsys:Anything-v0")
    assert "colorsys" in sys.modules


def test_missing_module_names_pip_install():
    with pytest.raises(ModuleNotFoundError, match="pip install recurrl_no_such_pkg") as info:
        import_env_package("recurrl_no_such_pkg.sub:Task-v0")
    assert "'recurrl_no_such_pkg.sub'" in str(info.value)
    with pytest.raises(ModuleNotFoundError, match="pip install recurrl_no_such_pkg"):
        GymEnv("recurrl_no_such_pkg:Task-v0", num_envs=2)


@pytest.mark.parametrize("num_envs", [None, 2])
def test_gym_env_accepts_module_ids(num_envs):
    env = GymEnv(CARTPOLE, num_envs=num_envs, seed=0)
    data = env.rollout(3)
    assert data["observation"].shape[-1] == 4
    assert data.batch_size == ((3,) if num_envs is None else (2, 3))
    env.close()


def test_missing_dependency_of_the_module_is_named(tmp_path, monkeypatch):
    (tmp_path / "recurrl_needs_dep.py").write_text("import recurrl_missing_dep\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="whose import failed") as info:
        import_env_package("recurrl_needs_dep:Task-v0")
    assert "Fix: pip install recurrl_missing_dep" in str(info.value)
