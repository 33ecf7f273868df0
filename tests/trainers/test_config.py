"""Config dataclasses: validation messages say what to change; every field is documented."""

from __future__ import annotations

import dataclasses
import math

import pytest

from recurrl.trainers.config import (
    RESUMABLE,
    SECTIONS,
    EnvConfig,
    ModelConfig,
    PPOConfig,
    RunConfig,
    TrainConfig,
    field_docs,
    resume_conflicts,
)

from ._helpers import parse_train


@pytest.mark.parametrize("cls", [EnvConfig, ModelConfig, PPOConfig, RunConfig])
def test_every_field_has_a_docstring(cls):
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        assert docs.get(f.name), f"{cls.__name__}.{f.name} has no docstring"


def test_frames_not_multiple_of_batch_gives_the_fix():
    with pytest.raises(ValueError, match=r"Fix: --frames 2000"):
        PPOConfig(frames=2100, frames_per_batch=1000)


def test_batch_not_multiple_of_num_envs():
    with pytest.raises(ValueError, match="not a multiple of num_envs=3"):
        TrainConfig(env=EnvConfig(num_envs=3), ppo=PPOConfig(frames=1000, frames_per_batch=1000))


def test_minibatches_must_split_rows_or_slices():
    with pytest.raises(ValueError, match="env rows"):
        TrainConfig(
            env=EnvConfig(num_envs=6),
            ppo=PPOConfig(frames=1200, frames_per_batch=600, num_minibatches=4),
        )
    with pytest.raises(ValueError, match="slice_len=7"):
        TrainConfig(ppo=PPOConfig(slice_len=7))
    cfg = TrainConfig(  # 20 rows of 50 steps cut into 25-step slices: 40 slices
        ppo=PPOConfig(slice_len=25, num_minibatches=8)
    )
    assert cfg.ppo.slice_len == 25


@pytest.mark.parametrize(
    ("num_envs", "expected"), [(None, 5), (20, 5), (8, 4), (4, 4), (6, 3), (2, 2), (25, 5)]
)
def test_num_minibatches_defaults_to_the_largest_divisor_of_the_rows_up_to_5(num_envs, expected):
    frames = 6000 if num_envs in (6, 25) else 1000  # a whole number of steps per env
    fpb = {6: 600, 25: 1000}.get(num_envs, 1000)
    cfg = TrainConfig(
        env=EnvConfig(num_envs=num_envs), ppo=PPOConfig(frames=frames, frames_per_batch=fpb)
    )
    assert cfg.ppo.num_minibatches == expected
    assert parse_train("--num-envs", "8").ppo.num_minibatches == 4  # not 20 envs' 5
    assert parse_train("--num-envs", "8", "--num-minibatches", "2").ppo.num_minibatches == 2
    # resolved with DQN too: a DQN run's config.json holds what a fresh config gives
    assert parse_train("--algo", "dqn").ppo.num_minibatches == 4  # its 8 envs


def test_discrete_algo_rejects_continuous_actions():
    with pytest.raises(ValueError, match="Discrete action space") as info:
        TrainConfig(algo="dqn", env=EnvConfig(env="Pendulum-v1"))
    assert "Fix: --algo ppo" in str(info.value) and "\n" not in str(info.value)


def test_ppo_accepts_continuous_actions():
    cfg = TrainConfig(env=EnvConfig(env="Pendulum-masked"), model=ModelConfig(action_std="state"))
    assert cfg.env.gym_id() == "Pendulum-v1" and cfg.env.mask() == [0, 1]
    with pytest.raises(ValueError, match="action_std must be 'parameter' or 'state'"):
        ModelConfig(action_std="learned")


MULTI_DISCRETE = "tests.trainers.multi_discrete_envs:RecurrlMultiDiscrete-v0"


def test_ppo_accepts_multi_discrete_actions_and_dqn_refuses_them():
    assert TrainConfig(env=EnvConfig(env=MULTI_DISCRETE)).algo == "ppo"
    with pytest.raises(ValueError, match="needs a Discrete action space") as info:
        TrainConfig(algo="dqn", env=EnvConfig(env=MULTI_DISCRETE))
    message = str(info.value)
    assert "MultiDiscrete action (nvec [3, 2]" in message and "Fix: --algo ppo" in message
    assert "\n" not in message
    with pytest.raises(ValueError, match=r"continuous \(Box\) actions only"):
        TrainConfig(env=EnvConfig(env=MULTI_DISCRETE), model=ModelConfig(action_std="state"))
    grid = "tests.trainers.multi_discrete_envs:RecurrlMultiDiscreteGrid-v0"
    with pytest.raises(ValueError, match=r"must be flat.*shape \(2, 2\).*Fix: flatten") as info:
        TrainConfig(env=EnvConfig(env=grid))
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"MultiDiscrete action \(nvec \[\[3, 2\], \[2, 2\]\]:"):
        TrainConfig(algo="dqn", env=EnvConfig(env=grid))


def test_popgym_multi_discrete_envs_are_accepted_by_ppo_only():
    pytest.importorskip("popgym")
    for env_id in ("popgym-BattleshipEasy-v0", "popgym-MineSweeperEasy-v0"):
        TrainConfig(env=EnvConfig(env=env_id))
        with pytest.raises(ValueError, match="Fix: --algo ppo") as info:
            TrainConfig(algo="dqn", env=EnvConfig(env=env_id))
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: ModelConfig(memory="tcn"), "memory must be"),
        (lambda: ModelConfig(hidden_size=0), "hidden_size"),
        (lambda: EnvConfig(num_envs=0), "num_envs"),
        (lambda: PPOConfig(gamma=1.5), "gamma"),
        (lambda: PPOConfig(obs_scale=0.0), "obs_scale must be > 0"),
        (lambda: PPOConfig(entropy_coef=-0.01), "entropy_coef must be a number >= 0"),
        (lambda: PPOConfig(entropy_coef_end=-1.0), "entropy_coef_end must be a number >= 0"),
        (lambda: PPOConfig(clip_epsilon_end=0.0), "clip_epsilon_end must be a number > 0"),
        (lambda: PPOConfig(clip_value=0.0), "clip_value must be a number > 0"),
        (lambda: RunConfig(device="gpu0"), "invalid device"),
        (lambda: RunConfig(eval_episodes=-1), "eval_episodes must be >= 0"),
        (lambda: TrainConfig(algo="sac"), "unknown algo"),
    ],
)
def test_invalid_values(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_dict_round_trip():
    cfg = TrainConfig(model=ModelConfig(memory="gru"), run=RunConfig(seed=3))
    data = cfg.to_dict()
    assert set(data) == {"algo", *SECTIONS}
    assert TrainConfig.from_dict(data) == cfg
    with pytest.raises(ValueError, match="unknown entry"):
        TrainConfig.from_dict({**data, "extra": 1})


FLOAT_FIELDS = [
    (cls, f.name)
    for cls in SECTIONS.values()
    for f in dataclasses.fields(cls)
    if isinstance(f.default, float) or "float" in str(f.type)
]


@pytest.mark.parametrize(("cls", "name"), FLOAT_FIELDS, ids=lambda x: getattr(x, "__name__", x))
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_every_float_field_rejects_nan_and_inf(cls, name, value):
    # NaN slips through every range check (all its comparisons are False)
    with pytest.raises(ValueError, match=rf"{name} must be a finite number.*Fix: --"):
        cls(**{name: value})


def test_float_fields_are_found():
    assert {("PPOConfig", "lr"), ("DQNConfig", "tau"), ("PPOConfig", "clip_epsilon_end")} <= {
        (cls.__name__, name) for cls, name in FLOAT_FIELDS
    }


def test_resumable_fields_exist_and_conflicts_name_the_others():
    names = {f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    assert names >= RESUMABLE
    saved = TrainConfig().to_dict()
    given = TrainConfig(
        model=ModelConfig(hidden_size=16), ppo=PPOConfig(frames=60_000, lr=1e-3),
        run=RunConfig(quiet=True, run_dir="moved", eval_episodes=0),
    ).to_dict()  # fmt: skip
    assert resume_conflicts(saved, given) == [
        ("model.hidden_size", 64, 16),
        ("ppo.lr", 5e-3, 1e-3),
    ]
    assert resume_conflicts(saved, {**saved, "algo": "dqn"}) == [("algo", "ppo", "dqn")]


def test_recurrent_backend_is_checked_and_may_change_on_resume():
    assert ModelConfig().recurrent_backend == "auto"
    assert ModelConfig(recurrent_backend="scan").recurrent_backend == "scan"
    expected = r"recurrent_backend must be one of \('pad', 'scan', 'triton', 'assoc', 'cpp',"
    with pytest.raises(ValueError, match=expected):
        ModelConfig(recurrent_backend="cudnn")
    with pytest.raises(ValueError, match="Fix: --recurrent-backend auto, or --memory mingru / lru"):
        ModelConfig(memory="lstm", recurrent_backend="assoc")
    assert "model.recurrent_backend" in RESUMABLE  # every backend computes the same
    saved = TrainConfig().to_dict()
    given = TrainConfig(model=ModelConfig(recurrent_backend="scan")).to_dict()
    assert resume_conflicts(saved, given) == []
    # a config.json written before the option existed loads as what it ran: pad
    del saved["model"]["recurrent_backend"]
    assert TrainConfig.from_dict(saved, saved=True).model.recurrent_backend == "pad"
    assert "recurrent_backend" not in saved["model"]  # the caller's dict is left as it was
    assert TrainConfig.from_dict(saved).model.recurrent_backend == "auto"  # not a saved run


@pytest.mark.parametrize(("algo", "n"), [("ppo", 1024), ("dqn", 512)])
def test_num_envs_alone_sets_the_batch(algo, n):
    """--num-envs N alone: N rows of steps_per_env steps, frames rounded up to whole batches."""
    cfg = TrainConfig(algo=algo, env=EnvConfig(num_envs=n))
    section = getattr(cfg, algo)
    fpb = n * section.steps_per_env
    assert section.frames_per_batch == fpb
    assert section.frames % fpb == 0
    assert section.frames == -(-type(section)().frames // fpb) * fpb
    # the defaults are unchanged: 20 x 50 for ppo, 8 x 50 for dqn
    assert TrainConfig().ppo.frames_per_batch == 1000
    assert TrainConfig(algo="dqn").dqn.frames_per_batch == 400
    # an explicit frames_per_batch keeps the strict checks
    with pytest.raises(ValueError, match=f"not a multiple of num_envs={n}"):
        TrainConfig(algo=algo, env=EnvConfig(num_envs=n), **{algo: type(section)(
            frames=51_000, frames_per_batch=1000)})


def test_steps_per_env_sets_the_row_length():
    cfg = TrainConfig(env=EnvConfig(num_envs=64), ppo=PPOConfig(steps_per_env=25, frames=6400))
    assert (cfg.ppo.frames_per_batch, cfg.ppo.frames) == (1600, 6400)
    with pytest.raises(ValueError, match="steps_per_env"):
        PPOConfig(steps_per_env=0)


def test_image_encoder_is_checked_and_fixed_for_a_run():
    assert ModelConfig().image_encoder == "cnn"
    assert ModelConfig(image_encoder="flat").image_encoder == "flat"
    with pytest.raises(ValueError, match=r"image_encoder must be one of.*Fix: --image-encoder"):
        ModelConfig(image_encoder="resnet")
    # it shapes the model's weights: a resume may not change it
    assert "model.image_encoder" not in RESUMABLE
    saved = TrainConfig().to_dict()
    given = TrainConfig(model=ModelConfig(image_encoder="flat")).to_dict()
    assert resume_conflicts(saved, given) == [("model.image_encoder", "cnn", "flat")]
    del saved["model"]["image_encoder"]  # a config.json written before the option: the CNN
    assert TrainConfig.from_dict(saved, saved=True).model.image_encoder == "cnn"
