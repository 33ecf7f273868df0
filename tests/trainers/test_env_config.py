"""The env section of a run's config: ids, engines, masked envs, multi-agent tasks."""

from __future__ import annotations

import pytest

from recurrl.trainers.config import EnvConfig as Reexported
from recurrl.trainers.env_config import EnvConfig


def test_the_config_module_reexports_the_env_section():
    assert Reexported is EnvConfig


def test_unknown_env_id_says_how_to_list_ids():
    with pytest.raises(ValueError, match="pprint_registry") as info:
        EnvConfig(env="NoSuchEnv-v0")
    assert "CartPole-masked" in str(info.value)


def test_builtin_masked_env_resolves_to_cartpole():
    cfg = EnvConfig()
    assert (cfg.gym_id(), cfg.mask()) == ("CartPole-v1", [0, 2])
    assert EnvConfig(env="CartPole-v1").mask() is None


def test_minigrid_memory_ids_resolve_to_the_torch_engine():
    pytest.importorskip("minigrid")
    for env_id in ("minigrid:MiniGrid-MemoryS7-v0", "minigrid:MiniGrid-MemoryS17Random-v0"):
        assert EnvConfig(env=env_id).resolved_engine() == "torch"
        assert EnvConfig(env=env_id, engine="gymnasium").resolved_engine() == "gymnasium"
    # the other MiniGrid tasks have no torch implementation
    assert EnvConfig(env="minigrid:MiniGrid-Empty-5x5-v0").resolved_engine() == "gymnasium"
    with pytest.raises(ValueError, match=r"engine='torch'.*MiniGrid-Empty-5x5-v0.*Fix"):
        EnvConfig(env="minigrid:MiniGrid-Empty-5x5-v0", engine="torch")


def test_multiagent_ids_resolve_to_their_own_engine_and_refuse_the_others():
    cfg = EnvConfig(env="MultiAgentRecall-v0")
    assert cfg.is_multiagent() and cfg.resolved_engine() == "multiagent"
    assert cfg.gym_id() == "MultiAgentRecall-v0" and not EnvConfig().is_multiagent()
    with pytest.raises(ValueError, match=r"multi-agent task.*Fix: --engine auto"):
        EnvConfig(env="MultiAgentRecall-v0", engine="torch")
    with pytest.raises(ValueError, match="fixed length"):
        EnvConfig(env="MultiAgentRecall-v0", max_episode_steps=5)


def test_a_multiagent_id_whose_package_is_missing_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "vmas", None)  # `import vmas` now raises ImportError
    with pytest.raises(ValueError, match=r'pip install "recurrl\[vmas\]"'):
        EnvConfig(env="vmas:balance")
