"""The suites and recipes registry, and the per-env defaults `recurrl train` takes from it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from recurrl.trainers import suites
from recurrl.trainers.cli import _say_recipe, build_parser
from recurrl.trainers.suites import (
    MEMORY_RECIPES,
    RECIPES,
    SUITES,
    MemoryRecipe,
    Recipe,
    Suite,
    recipe_for,
    register_memory_recipe,
    register_recipe,
    register_suite,
    suite_frames,
)

from ._helpers import parse_train

POPGYM = "popgym-RepeatPreviousEasy-v0"


def test_popgym_suites_hold_popgyms_fourteen_families_per_level():
    for level in ("easy", "medium", "hard"):
        tasks = SUITES[f"popgym-{level}"].tasks
        assert len(tasks) == 14 and all(t.endswith(f"{level.title()}-v0") for t in tasks)
    assert "popgym-VelocityOnlyCartpoleEasy-v0" in SUITES["popgym-easy"].tasks  # popgym's case
    assert SUITES["popgym-easy"].frames == 100_000 and suite_frames(POPGYM) == 100_000
    # the one Easy task whose memory shows only with more frames (the learning results)
    easy = SUITES["popgym-easy"]
    assert {t: easy.frames_of(t) for t in easy.tasks if easy.frames_of(t) != 100_000} == {
        "popgym-MultiarmedBanditEasy-v0": 400_000
    }
    assert SUITES["popgym-medium"].frames_of("popgym-MultiarmedBanditMedium-v0") == 100_000
    assert all(recipe_for(t).name == "popgym" for t in SUITES["popgym-hard"].tasks)


def test_popgym_suites_are_popgyms_own_lists_and_resolve():
    envs = pytest.importorskip("popgym.envs")
    gymnasium = pytest.importorskip("gymnasium")
    for level, table in (("easy", envs.ALL_EASY), ("medium", envs.ALL_MEDIUM),
                         ("hard", envs.ALL_HARD)):  # fmt: skip
        assert list(SUITES[f"popgym-{level}"].tasks) == [v["id"] for v in table.values()]
    for task in SUITES["popgym-easy"].tasks:
        env = gymnasium.make(task)
        env.close()


def test_minigrid_memory_suite_ids_resolve():
    pytest.importorskip("minigrid")
    import gymnasium

    for task in SUITES["minigrid-memory"].tasks:
        assert gymnasium.spec(task.partition(":")[2]).id == task.partition(":")[2]
        assert recipe_for(task).name == "minigrid"


def test_recipes_and_suites_refuse_bad_entries():
    with pytest.raises(ValueError, match=r"set \['--memory'\].*Fix: drop"):
        Recipe("x", ("X-*",), {"ppo": ("--memory", "gru")}, None, "test")
    with pytest.raises(ValueError, match="low < high"):
        Recipe("x", ("X-*",), {}, (1.0, 1.0), "test")
    with pytest.raises(ValueError, match="already registered"):
        register_recipe(RECIPES["popgym"])
    with pytest.raises(ValueError, match="already registered"):
        register_suite(SUITES["popgym-easy"])
    with pytest.raises(ValueError, match="distinct tasks"):
        Suite("x", ("A", "A"), 10, "", "")
    with pytest.raises(ValueError, match=r"frames must be >= 1, got 0 for B"):
        Suite("x", ("A", "B"), 10, "", "", task_frames={"B": 0})
    with pytest.raises(ValueError, match=r"not in the suite: \['C'\]\. Fix: one of"):
        Suite("x", ("A", "B"), 10, "", "", task_frames={"C": 100})


def test_a_task_can_have_its_own_budget_in_a_suite(monkeypatch):
    toy = Suite("toy-budgets", ("CartPole-masked", "Pendulum-masked"), 2000, "two tasks", "a test",
                task_frames={"Pendulum-masked": 8000})  # fmt: skip
    monkeypatch.setitem(SUITES, toy.name, toy)
    assert [toy.frames_of(t) for t in toy.tasks] == [2000, 8000]
    assert suite_frames("Pendulum-masked") == 8000  # the budget a task has in its suite
    from recurrl.trainers.bench import _frames, _suite_help

    args = build_parser().parse_args(["bench", toy.name])
    assert [_frames(args, toy, t) for t in toy.tasks] == [2000, 8000]
    args = build_parser().parse_args(["bench", toy.name, "--frames", "500"])
    assert [_frames(args, toy, t) for t in toy.tasks] == [500, 500]  # --frames wins everywhere
    assert "2,000 frames per run (Pendulum-masked: 8,000)" in _suite_help()


def test_the_defaults_differ_by_env_family():
    cart = parse_train()
    assert (cart.ppo.reward_scale, cart.ppo.obs_scale, cart.env.num_envs) == (0.1, 10.0, 20)
    pop = parse_train("--env", POPGYM)
    assert (pop.ppo.reward_scale, pop.ppo.obs_scale, pop.env.num_envs) == (1.0, 1.0, 20)
    # DQN: the recipe's dqn options only (its obs_scale default is 1 already)
    dqn = parse_train("--algo", "dqn", "--env", POPGYM)
    assert (dqn.dqn.reward_scale, dqn.dqn.obs_scale, dqn.env.num_envs) == (1.0, 1.0, 8)


def test_the_minigrid_recipe():
    pytest.importorskip("minigrid")
    cfg = parse_train("--env", "minigrid:MiniGrid-MemoryS7-v0")
    got = (cfg.model.image_encoder, cfg.ppo.reward_scale, cfg.env.num_envs,
           cfg.ppo.steps_per_env, cfg.ppo.epochs, cfg.ppo.num_minibatches,
           cfg.ppo.entropy_coef, cfg.ppo.entropy_coef_end, cfg.ppo.clip_epsilon_end,
           cfg.ppo.max_grad_norm, cfg.model.memory)  # fmt: skip
    # the memory stays the user's choice
    assert got == ("onehot", 1.0, 256, 100, 4, 8, 0.02, 0.005, 0.05, 0.5, "lstm")
    # the suite's budget is whole batches of the recipe, at most 2M frames
    frames = SUITES["minigrid-memory"].frames
    batch = cfg.env.num_envs * cfg.ppo.steps_per_env
    assert frames % batch == 0 and frames <= 2_000_000 < frames + batch


def test_the_vmas_recipe_gives_its_scenarios_a_horizon():
    """VMAS scenarios have no horizon of their own (a balance policy that never drops the
    package ran one episode without end): the recipe sets 100 steps; a value given wins."""
    pytest.importorskip("vmas")
    assert recipe_for("vmas:balance").name == "vmas"
    assert parse_train("--env", "vmas:navigation").env.max_episode_steps == 100
    assert (
        parse_train("--env", "vmas:balance", "--max-episode-steps", "30").env.max_episode_steps
        == 30
    )


def test_user_options_win_over_the_recipe():
    cfg = parse_train("--env", POPGYM, "--reward-scale", "0.5")
    assert (cfg.ppo.reward_scale, cfg.ppo.obs_scale) == (0.5, 1.0)
    cfg = parse_train("--env", POPGYM, "--obs-scale", "10", "--reward-scale", "0.1")
    assert (cfg.ppo.reward_scale, cfg.ppo.obs_scale) == (0.1, 10.0)


def test_a_resumed_run_keeps_its_saved_values_when_the_recipe_changes(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    saved = parse_train("--env", POPGYM, "--run-dir", str(run_dir))
    (run_dir / "config.json").write_text(json.dumps(saved.to_dict()))
    changed = dataclasses.replace(RECIPES["popgym"], options={"ppo": ("--reward-scale", "3")})
    monkeypatch.setitem(suites.RECIPES, "popgym", changed)
    assert parse_train("--env", POPGYM).ppo.reward_scale == 3.0  # a new run: the new recipe
    resumed = parse_train("--resume", str(run_dir), "--frames", "100000")
    assert (resumed.ppo.reward_scale, resumed.ppo.obs_scale) == (1.0, 1.0)  # as saved
    # a run saved before recipes existed (the CartPole-masked defaults) resumes unchanged too
    old = parse_train("--env", POPGYM, "--reward-scale", "0.1", "--obs-scale", "10")
    (run_dir / "config.json").write_text(json.dumps(old.to_dict()))
    assert parse_train("--resume", str(run_dir)).ppo.reward_scale == 0.1


def test_a_new_run_names_the_recipe_it_takes(capsys):
    args = build_parser().parse_args(["train", "--env", POPGYM, "--obs-scale", "2"])
    _say_recipe(args, parse_train("--env", POPGYM, "--obs-scale", "2"))
    err = capsys.readouterr().err
    assert "popgym recipe" in err and "--reward-scale 1.0" in err and "--obs-scale" not in err
    args = build_parser().parse_args(["train"])
    _say_recipe(args, parse_train())
    assert capsys.readouterr().err == ""  # CartPole-masked: the defaults themselves


def test_env_help_says_families_have_defaults():
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    env = next(a for a in train._actions if "--env" in a.option_strings)
    assert "recipe" in env.help and "RECIPES" in env.help


# ------------------------------------------------------------------ memory recipes
def test_the_transformer_trains_with_its_own_recipe_over_the_familys():
    cart = parse_train("--memory", "transformer")
    assert (cart.ppo.lr, cart.ppo.epochs, cart.ppo.reward_scale) == (0.002, 4, 0.1)
    pop = parse_train("--env", POPGYM, "--memory", "transformer")  # both recipes apply
    assert (pop.ppo.lr, pop.ppo.epochs, pop.ppo.reward_scale, pop.ppo.obs_scale) == (
        0.002, 4, 1.0, 1.0,
    )  # fmt: skip
    mine = parse_train("--memory", "transformer", "--lr", "0.01")  # the user's option wins
    assert (mine.ppo.lr, mine.ppo.epochs) == (0.01, 4)
    gru = parse_train("--memory", "gru")  # no recipe: the defaults
    assert (gru.ppo.lr, gru.ppo.epochs) == (0.005, 8)
    dqn = parse_train("--algo", "dqn", "--memory", "transformer")  # no dqn entry
    assert dqn.dqn.lr == parse_train("--algo", "dqn").dqn.lr


def test_the_memory_recipe_wins_where_both_set_an_option(monkeypatch):
    monkeypatch.setitem(MEMORY_RECIPES, "gru", MemoryRecipe("gru", {"ppo": ("--obs-scale", "3")},
                                                            "test"))  # fmt: skip
    cfg = parse_train("--env", POPGYM, "--memory", "gru")
    assert (cfg.ppo.obs_scale, cfg.ppo.reward_scale) == (3.0, 1.0)
    assert parse_train("--env", POPGYM, "--memory", "gru", "--obs-scale", "5").ppo.obs_scale == 5


def test_a_new_run_names_the_memory_recipe_it_takes(capsys):
    argv = ["--env", POPGYM, "--memory", "transformer", "--epochs", "2"]
    _say_recipe(build_parser().parse_args(["train", *argv]), parse_train(*argv))
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "popgym recipe" in lines[0], lines
    assert lines[1].startswith("recurrl train: --memory transformer takes the transformer "
                               "memory recipe's defaults: --lr 0.002 (")  # fmt: skip


def test_memory_recipes_refuse_bad_entries_and_bad_options(monkeypatch):
    with pytest.raises(ValueError, match=r"set \['--frames'\].*Fix: drop"):
        MemoryRecipe("x", {"ppo": ("--frames", "10")}, "test")
    with pytest.raises(ValueError, match="has a recipe already"):
        register_memory_recipe(MEMORY_RECIPES["transformer"])
    monkeypatch.setitem(MEMORY_RECIPES, "gru", MemoryRecipe("gru", {"ppo": ("--nope",)}, "t"))
    from recurrl.trainers.errors import UsageError

    with pytest.raises(UsageError, match="the gru memory recipe's options --nope are not valid"):
        parse_train("--memory", "gru")
