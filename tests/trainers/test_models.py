"""ObservationNorm, ActorCritic's observation scaling and the MultiDiscrete policy
(recurrl/trainers/models.py)."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from recurrl.functional.recurrent import recurrent_backend_names
from recurrl.modules import GRUModule, LRUModule, LSTMModule, MinGRUModule, memory_names
from recurrl.trainers import cli
from recurrl.trainers.config import EnvConfig, ModelConfig, TrainConfig
from recurrl.trainers.models import (
    FEED_FORWARD,
    ActorCritic,
    EpsilonGreedy,
    FactorizedCategorical,
    ObservationNorm,
    _trunk,
    actor_critic,
    make_env,
)

MULTI_DISCRETE_ENV = "tests.trainers.multi_discrete_envs:RecurrlMultiDiscrete-v0"


def test_observation_norm_is_the_identity_until_fitted_then_standardizes():
    norm = ObservationNorm(2, extra_scale=3.0)
    x = torch.tensor([[1.0, -2.0], [3.0, 6.0], [5.0, 14.0]])
    assert torch.equal(norm(x), 3.0 * x)
    norm.fit(x)
    out = norm(x)
    torch.testing.assert_close(out.mean(0), torch.zeros(2))
    torch.testing.assert_close(out.std(0), torch.full((2,), 3.0))
    constant = ObservationNorm(1)
    constant.fit(torch.ones(4, 1))  # zero std: clamped, no division by zero
    assert torch.isfinite(constant(torch.ones(2, 1))).all()


def test_epsilon_greedy_per_row_epsilons_act_row_by_row():
    q = torch.tensor([0.0, 1.0, 0.0]).expand(3, 3)  # greedy action 1 in every row
    greedy = EpsilonGreedy([0.0, 1.0, 0.5])
    torch.manual_seed(0)
    other = torch.stack([greedy(q) != 1 for _ in range(2000)]).float().mean(0)
    assert other[0] == 0.0  # epsilon 0: always greedy
    assert other.tolist()[1:] == pytest.approx([2 / 3, 1 / 3], abs=0.04)  # eps * 2/3 others
    assert greedy.epsilon == pytest.approx(0.5)  # the mean
    with pytest.raises(ValueError, match="3 per-row epsilons, but the batch has 2 row"):
        greedy(q[:2])
    with pytest.raises(ValueError, match=r"probability in \[0, 1\]"):
        EpsilonGreedy([0.1, 1.5])


def test_pinned_epsilon_is_out_of_the_state_dict_and_survives_loads():
    pinned = EpsilonGreedy(0.25, pinned=True)
    synced = EpsilonGreedy(0.9)
    assert "eps" not in pinned.state_dict()
    pinned.load_state_dict(synced.state_dict())  # a weight sync carrying another epsilon
    assert pinned.epsilon == 0.25
    synced.load_state_dict(pinned.state_dict())  # nothing to load: keeps its own
    assert synced.epsilon == pytest.approx(0.9)
    synced.load_state_dict({"eps": torch.tensor(0.1)})
    assert synced.epsilon == pytest.approx(0.1)  # unpinned: the weights carry it


def test_actor_critic_obs_norm_feeds_both_trunks_the_standardized_vector():
    torch.manual_seed(0)
    cfg = ModelConfig(memory="none", hidden_size=8)
    model = ActorCritic(cfg, 2, 2, obs_scale=1.0, obs_norm=True)
    assert model.obs_norm is not None
    obs = torch.randn(16, 2) * torch.tensor([0.1, 5.0]) + torch.tensor([1.0, -3.0])
    model.obs_norm.fit(obs)
    td = TensorDict(observation=obs, batch_size=[16])
    model.actor(td)
    model.critic(td)
    torch.testing.assert_close(td["scaled_observation"].mean(0), torch.zeros(2), atol=1e-5, rtol=0)
    torch.testing.assert_close(td["scaled_observation"].std(0), torch.ones(2))
    # saved with the model: a fresh model loading the state dict normalizes the same way
    fresh = ActorCritic(cfg, 2, 2, obs_scale=1.0, obs_norm=True)
    fresh.load_state_dict(model.state_dict())
    torch.testing.assert_close(fresh.obs_norm.loc, model.obs_norm.loc)
    plain = ActorCritic(cfg, 2, 2, obs_scale=10.0)
    assert plain.obs_norm is None
    td = TensorDict(observation=obs, batch_size=[16])
    plain.actor(td)
    torch.testing.assert_close(td["scaled_observation"], 10.0 * obs)


# ---------------------------------------------------------------- MultiDiscrete actions
NVEC = (3, 1, 4)


@pytest.mark.parametrize("memory", ["none", "gru"])
def test_actor_critic_multi_discrete_policy(memory):
    torch.manual_seed(0)
    model = ActorCritic(ModelConfig(memory=memory, hidden_size=8), 3, 8, action_nvec=NVEC)
    assert model.action_nvec == NVEC and not model.continuous
    td = TensorDict(observation=torch.randn(4, 3), is_init=torch.ones(4, 1, dtype=torch.bool))
    td.batch_size = [4]
    out = model.policy()(td.clone())
    assert out["logits"].shape == (4, 8) and out["action"].shape == (4, 3)
    assert out["sample_log_prob"].shape == (4,)
    recomputed = model.factorized_distribution(out["logits"]).log_prob(out["action"])
    torch.testing.assert_close(recomputed, out["sample_log_prob"])
    greedy = model.policy(deterministic=True)(td.clone())
    assert torch.equal(greedy["action"], FactorizedCategorical(greedy["logits"], NVEC).mode)


def test_actor_critic_multi_discrete_arguments_are_checked():
    cfg = ModelConfig(hidden_size=8)
    with pytest.raises(ValueError, match=r"summing to n_actions.*Fix: n_actions=sum"):
        ActorCritic(cfg, 3, 7, action_nvec=NVEC)
    with pytest.raises(ValueError, match="without action_bounds"):
        ActorCritic(cfg, 3, 2, action_nvec=(1, 1),
                    action_bounds=(torch.zeros(2), torch.ones(2)))  # fmt: skip
    with pytest.raises(ValueError, match="not MultiDiscrete"):
        ActorCritic(cfg, 3, 2).factorized_distribution(torch.zeros(1, 2))


def test_actor_critic_reads_the_nvec_of_a_multi_discrete_env():
    cfg = TrainConfig(env=EnvConfig(env=MULTI_DISCRETE_ENV), model=ModelConfig(memory="none"))
    env = make_env(cfg.env, num_envs=2, seed=0)
    try:
        assert env.action_spec.shape == (2, 2)
        model = actor_critic(cfg, env)
    finally:
        env.close()
    assert model.action_nvec == (3, 2)
    logits = model.actor(TensorDict(observation=torch.zeros(2, 5), batch_size=[2]))
    assert logits["logits"].shape == (2, 5)
    assert math.isclose(
        model.factorized_distribution(torch.zeros(5)).entropy().item(), math.log(6), rel_tol=1e-6
    )


def test_memory_choices_of_the_cli_are_the_registry():
    """--memory's choices and the builder read one list: the memory registry (and none)."""
    parser = cli.build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    memory = next(a for a in train._actions if "--memory" in a.option_strings)
    assert memory.choices == [*memory_names(), FEED_FORWARD]
    backend = next(a for a in train._actions if "--recurrent-backend" in a.option_strings)
    assert backend.choices == list(recurrent_backend_names())


@pytest.mark.parametrize(
    ("memory", "cls", "states"),
    [
        ("lstm", LSTMModule, ["actor_h", "actor_c"]),
        ("gru", GRUModule, ["actor_h"]),
        ("mingru", MinGRUModule, ["actor_h"]),
        ("lru", LRUModule, ["actor_y", "actor_h"]),
    ],
)
def test_trunk_builds_the_memory_module_with_its_state_keys(memory, cls, states):
    cfg = ModelConfig(memory=memory, hidden_size=8, num_layers=2, recurrent_backend="scan")
    trunk = _trunk(cfg, 3, "actor")
    assert type(trunk) is cls
    assert trunk.in_keys == ["observation", *states, "is_init"]
    assert trunk.out_keys == ["actor_features", *(("next", key) for key in states)]
    assert (trunk.rnn.hidden_size, trunk.rnn.num_layers) == (8, 2)
    assert trunk.recurrent_backend == "scan"


def test_trunk_refuses_an_unknown_memory_naming_the_choices():
    cfg = ModelConfig(hidden_size=8)
    cfg.memory = "no_such_memory"  # type: ignore[assignment]  # past the config's own check
    with pytest.raises(ValueError, match=r"'mingru', 'lru', .*'none', received 'no_such_memory'"):
        _trunk(cfg, 3, "actor")


# ---------------------------------------------------------------------- env engines
def _base(env):
    while hasattr(env, "base_env"):
        env = env.base_env
    return env


@pytest.mark.parametrize(
    ("env_id", "engine", "expected"),
    [
        ("CartPole-masked", "auto", "CartPoleEnv"),
        ("Pendulum-masked", "auto", "PendulumEnv"),
        ("popgym-RepeatPreviousEasy-v0", "auto", "RepeatPreviousEnv"),
        ("CartPole-masked", "gymnasium", "GymVecEnv"),
        ("CartPole-masked", "gymnasium-vector", "GymVecEnv"),
        ("Acrobot-v1", "auto", "GymVecEnv"),
    ],
)
def test_make_env_picks_the_batched_torch_env_where_the_id_has_one(env_id, engine, expected):
    env = make_env(EnvConfig(env=env_id, engine=engine, num_envs=3), seed=0)
    try:
        assert type(_base(env)).__name__ == expected
        assert env.batch_size == torch.Size([3])
    finally:
        env.close()


def test_both_engines_give_the_recipes_the_same_keys_and_specs():
    torch_env = make_env(EnvConfig(engine="torch", num_envs=2), seed=0)
    gym_env = make_env(EnvConfig(engine="gymnasium", num_envs=2), seed=0)
    try:
        assert torch_env.observation_spec == gym_env.observation_spec  # masked: [2, 2]
        assert torch_env.action_spec == gym_env.action_spec
        a, b = torch_env.reset(), gym_env.reset()
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        assert a["observation"].shape == b["observation"].shape == (2, 2)
    finally:
        torch_env.close()
        gym_env.close()


def test_the_torch_engine_needs_an_id_it_implements():
    with pytest.raises(ValueError, match=r"engine='torch'.*Acrobot-v1.*Fix: --engine auto"):
        EnvConfig(env="Acrobot-v1", engine="torch")


def test_a_config_saved_before_engines_existed_keeps_gymnasium():
    data = TrainConfig().to_dict()
    del data["env"]["engine"]
    assert TrainConfig.from_dict(data, saved=True).env.engine == "gymnasium"
    assert TrainConfig.from_dict(data).env.engine == "auto"


def test_the_gymnasium_vector_engine_steps_gymnasiums_own_batched_cartpole():
    env = make_env(EnvConfig(engine="gymnasium-vector", num_envs=3), seed=0)
    try:
        assert _base(env).vectorization == "vector_entry_point"
        data = env.rollout(30, break_when_any_done=False)
        assert data["next", "observation"].shape == (3, 30, 2)  # masked
    finally:
        env.close()


def test_the_gymnasium_vector_engine_needs_an_id_with_a_vector_entry_point():
    with pytest.raises(ValueError, match=r"engine='gymnasium-vector'.*Acrobot-v1"):
        EnvConfig(env="Acrobot-v1", engine="gymnasium-vector")


def test_the_envpool_engine_builds_an_envpool_env():
    pytest.importorskip("envpool", reason="the envpool extra is not installed")
    env = make_env(EnvConfig(engine="envpool", num_envs=2), seed=0)
    try:
        assert type(_base(env)).__name__ == "EnvPoolEnv"
        assert env.rollout(5)["next", "observation"].shape == (2, 5, 2)
    finally:
        env.close()


MEMORY_S7 = "minigrid:MiniGrid-MemoryS7-v0"


@pytest.mark.filterwarnings("ignore:.*mission.*:UserWarning")  # NetworkInputs drops the text
def test_minigrid_memory_runs_on_the_torch_engine_with_the_gymnasium_engines_inputs():
    """``auto`` picks the batched torch env for MiniGrid's Memory ids; both engines give the
    recipes the same keys and specs, so the same networks (a run may change engine on
    resume)."""
    pytest.importorskip("minigrid")
    cfg = TrainConfig.from_dict(
        {"env": {"env": MEMORY_S7, "num_envs": 4}, "model": {"image_encoder": "flat"}}
    )
    fast = make_env(cfg.env, seed=0)
    slow = make_env(EnvConfig(env=MEMORY_S7, engine="gymnasium", num_envs=4), seed=0)
    try:
        assert type(_base(fast)).__name__ == "MiniGridMemoryEnv"
        assert type(_base(slow)).__name__ == "GymVecEnv"
        assert fast.observation_spec == slow.observation_spec
        assert fast.action_spec == slow.action_spec
        a, b = fast.reset(), slow.reset()
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        assert {"is_init", "pixels", "observation"} <= set(a.keys())
        shapes = [
            {k: v.shape for k, v in actor_critic(cfg, env).state_dict().items()}
            for env in (fast, slow)
        ]
        assert shapes[0] == shapes[1]
    finally:
        fast.close()
        slow.close()
