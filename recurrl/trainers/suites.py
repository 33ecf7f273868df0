"""Benchmark suites and per-family recipes: the one list of tasks and of their train options.

A :class:`Recipe` is what a family of tasks trains with: the ``recurrl train`` options of
each algorithm (popgym: ``--reward-scale 1 --obs-scale 1``), the range of an episode's
return (for a normalized score) and where both came from. ``recurrl train --env ID`` applies
the recipe of ``ID``'s family (:func:`recipe_for`) as its defaults, under the options the
user gives; the resolved values are saved in the run's ``config.json``.

A :class:`MemoryRecipe` is what a memory model trains with whatever the task (the
transformer's smaller policy steps): ``recurrl train --memory M`` applies it over the
family's recipe, under the options the user gives.

A :class:`Suite` is a named list of env ids with a frame budget per task: what ``recurrl
bench SUITE`` runs (:mod:`recurrl.trainers.bench`), each task with its family's recipe.
:func:`register_recipe` and :func:`register_suite` add entries (e.g. from a plugin).

Examples:
    >>> recipe_for("popgym-RepeatPreviousEasy-v0").name
    'popgym'
    >>> recipe_for("popgym-RepeatPreviousEasy-v0").train_options("ppo")
    ('--reward-scale', '1', '--obs-scale', '1')
    >>> recipe_for("minigrid:MiniGrid-MemoryS7-v0").name, recipe_for("CartPole-v1")
    ('minigrid', None)
    >>> len(SUITES["popgym-easy"].tasks), SUITES["popgym-easy"].frames
    (14, 100000)
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping

__all__ = [
    "MEMORY_RECIPES",
    "RECIPES",
    "SUITES",
    "MemoryRecipe",
    "Recipe",
    "Suite",
    "memory_recipe_for",
    "recipe_for",
    "register_memory_recipe",
    "register_recipe",
    "register_suite",
    "suite_frames",
]


#: options a run sets itself, never a recipe
_RUN_OWN = ("--env", "--memory", "--frames", "--seed", "--run-dir", "--resume")


def _check_options(owner: str, options: Mapping[str, tuple[str, ...]]) -> None:
    """Refuse recipe ``options`` that set what belongs to a run (:data:`_RUN_OWN`)."""
    for algo, argv in options.items():
        bad = [a for a in argv if a.split("=")[0] in _RUN_OWN]
        if bad:
            raise ValueError(
                f"{owner}: the {algo} options set {bad}, which a run sets itself. Fix: drop "
                f"them from the recipe."
            )


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The training defaults of a family of tasks.

    Args:
        name: the family's name (a key of :data:`RECIPES`).
        patterns: ``fnmatch`` patterns of the env ids it applies to, matched against the id
            and against its part after ``module:`` (``minigrid:MiniGrid-MemoryS7-v0``).
        options: algorithm (``"ppo"``, ``"dqn"``) -> ``recurrl train`` options, e.g.
            ``("--reward-scale", "1")``; an algorithm without an entry keeps its defaults.
            Never ``--env``, ``--memory``, ``--frames`` or ``--seed``: those belong to a run.
        returns: ``(low, high)``, the range of an episode's return, for the normalized score
            ``(return - low) / (high - low)``; None: no normalized score.
        source: where the options and the range come from (a doc, a measurement).
    """

    name: str
    patterns: tuple[str, ...]
    options: Mapping[str, tuple[str, ...]]
    returns: tuple[float, float] | None
    source: str

    def __post_init__(self) -> None:
        _check_options(f"Recipe {self.name!r}", self.options)
        if self.returns is not None and not self.returns[0] < self.returns[1]:
            raise ValueError(
                f"Recipe {self.name!r}: returns must be (low, high) with low < high, "
                f"received {self.returns}."
            )

    def matches(self, env_id: str) -> bool:
        """Whether ``env_id`` belongs to this family.

        Examples:
            >>> RECIPES["minigrid"].matches("MiniGrid-MemoryS9-v0")
            True
        """
        name = env_id.rpartition(":")[2]
        return any(fnmatch.fnmatchcase(i, p) for p in self.patterns for i in (env_id, name))

    def train_options(self, algo: str) -> tuple[str, ...]:
        """The ``recurrl train`` options of ``algo`` (empty: its defaults)."""
        return tuple(self.options.get(algo, ()))

    def score(self, value: float) -> float | None:
        """``value`` (a return) normalized by :attr:`returns`; None without a range.

        Examples:
            >>> RECIPES["popgym"].score(0.5)
            0.75
        """
        if self.returns is None:
            return None
        low, high = self.returns
        return (value - low) / (high - low)


@dataclasses.dataclass(frozen=True)
class Suite:
    """A named list of tasks (env ids) and the frame budget of each run.

    Args:
        name: the suite's name (a key of :data:`SUITES`, ``recurrl bench NAME``).
        tasks: env ids, each as ``recurrl train --env`` takes it.
        frames: frames of every run of the suite (``recurrl bench --frames`` overrides).
        description: one line for ``recurrl bench --help``.
        source: where the tasks and the budget come from.
        task_frames: the budgets of the tasks that differ from ``frames`` (task -> frames;
            ``recurrl bench --frames`` overrides them too).
    """

    name: str
    tasks: tuple[str, ...]
    frames: int
    description: str
    source: str
    task_frames: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.tasks or len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"Suite {self.name!r}: expected distinct tasks, got {self.tasks}.")
        for task, frames in {"(every task)": self.frames, **self.task_frames}.items():
            if frames < 1:
                raise ValueError(
                    f"Suite {self.name!r}: frames must be >= 1, got {frames} for {task}."
                )
        unknown = sorted(set(self.task_frames) - set(self.tasks))
        if unknown:
            raise ValueError(
                f"Suite {self.name!r}: task_frames names tasks that are not in the suite: "
                f"{unknown}. Fix: one of {list(self.tasks)}."
            )

    def frames_of(self, task: str) -> int:
        """The frame budget of a run on ``task``.

        Examples:
            >>> s = Suite("toy", ("A", "B"), 1000, "", "", task_frames={"B": 4000})
            >>> s.frames_of("A"), s.frames_of("B")
            (1000, 4000)
        """
        return self.task_frames.get(task, self.frames)

    def recipes(self) -> dict[str, Recipe | None]:
        """Task -> its family's recipe (None: ``recurrl train``'s defaults)."""
        return {task: recipe_for(task) for task in self.tasks}


#: family name -> recipe, in lookup order (the first that matches an id wins)
RECIPES: dict[str, Recipe] = {}
#: memory name -> its recipe (see :class:`MemoryRecipe`)
MEMORY_RECIPES: dict[str, MemoryRecipe] = {}
#: suite name -> suite
SUITES: dict[str, Suite] = {}


def register_recipe(recipe: Recipe) -> Recipe:
    """Add ``recipe`` to :data:`RECIPES` (a name already there is refused).

    Examples:
        >>> r = register_recipe(Recipe("toy", ("Toy-*",), {"ppo": ("--epochs", "2")},
        ...                            (0.0, 1.0), "a doctest"))
        >>> recipe_for("Toy-v0") is r
        True
        >>> del RECIPES["toy"]
    """
    if recipe.name in RECIPES:
        raise ValueError(f"register_recipe: {recipe.name!r} is already registered.")
    RECIPES[recipe.name] = recipe
    return recipe


@dataclasses.dataclass(frozen=True)
class MemoryRecipe:
    """The training defaults of a memory model (``--memory``), whatever the task.

    ``recurrl train --memory M`` takes them as defaults over those of the task family's
    :class:`Recipe` (an option both set takes the memory's value: it is about how the model
    trains, not the task's scales) and under the options given on the command line.

    Args:
        memory: a registered memory name (``recurrl.modules.registry``).
        options: algorithm -> ``recurrl train`` options; an algorithm without an entry keeps
            the other defaults. Never ``--env``, ``--memory``, ``--frames`` or ``--seed``.
        source: the measurement the options come from.

    Examples:
        >>> memory_recipe_for("transformer").train_options("ppo")
        ('--lr', '0.002', '--epochs', '4')
        >>> memory_recipe_for("gru") is None
        True
    """

    memory: str
    options: Mapping[str, tuple[str, ...]]
    source: str

    def __post_init__(self) -> None:
        _check_options(f"MemoryRecipe {self.memory!r}", self.options)

    def train_options(self, algo: str) -> tuple[str, ...]:
        """The ``recurrl train`` options of ``algo`` (empty: the other defaults)."""
        return tuple(self.options.get(algo, ()))


def register_memory_recipe(recipe: MemoryRecipe) -> MemoryRecipe:
    """Add ``recipe`` to :data:`MEMORY_RECIPES` (a memory that has one already is refused).

    Examples:
        >>> r = register_memory_recipe(MemoryRecipe("toy", {"ppo": ("--lr", "0.001")}, "doc"))
        >>> memory_recipe_for("toy") is r
        True
        >>> del MEMORY_RECIPES["toy"]
    """
    if recipe.memory in MEMORY_RECIPES:
        raise ValueError(f"register_memory_recipe: {recipe.memory!r} has a recipe already.")
    MEMORY_RECIPES[recipe.memory] = recipe
    return recipe


def memory_recipe_for(memory: str) -> MemoryRecipe | None:
    """The recipe of memory model ``memory``, or None (the other defaults)."""
    return MEMORY_RECIPES.get(memory)


def register_suite(suite: Suite) -> Suite:
    """Add ``suite`` to :data:`SUITES` (a name already there is refused).

    Examples:
        >>> s = register_suite(Suite("toy", ("CartPole-masked",), 2000, "one task", "a test"))
        >>> SUITES["toy"].frames
        2000
        >>> del SUITES["toy"]
    """
    if suite.name in SUITES:
        raise ValueError(f"register_suite: {suite.name!r} is already registered.")
    SUITES[suite.name] = suite
    return suite


def recipe_for(env_id: str) -> Recipe | None:
    """The recipe of ``env_id``'s family (the first of :data:`RECIPES` that matches), or
    None (the ``recurrl train`` defaults, tuned on CartPole-masked)."""
    return next((r for r in RECIPES.values() if r.matches(env_id)), None)


#: a run succeeds when its final greedy return's normalized score reaches this: 90% of the
#: family's return range (450 on CartPole-masked, 0.8 on popgym, 0.9 on MiniGrid)
SUCCESS = 0.9


def success_threshold(task: str) -> float | None:
    """The greedy return at which a run on ``task`` counts as a success: :data:`SUCCESS` of
    its family's return range, or None where the family has no fixed range (VMAS) or no
    recipe (then no success rate is given unless asked for with a threshold).

    Examples:
        >>> success_threshold("CartPole-masked"), success_threshold("vmas:simple_spread")
        (450.0, None)
    """
    recipe = recipe_for(task)
    if recipe is None or recipe.returns is None:
        return None
    low, high = recipe.returns
    return low + SUCCESS * (high - low)


def suite_frames(task: str) -> int | None:
    """The frame budget of the first registered suite that holds ``task``, or None.

    Examples:
        >>> suite_frames("popgym-AutoencodeHard-v0"), suite_frames("CartPole-v1")
        (100000, None)
    """
    return next((s.frames_of(task) for s in SUITES.values() if task in s.tasks), None)


# --- the families -------------------------------------------------------------------------
register_recipe(Recipe(
    "popgym", ("popgym-*",),
    {"ppo": ("--reward-scale", "1", "--obs-scale", "1"), "dqn": ("--reward-scale", "1")},
    returns=(-1.0, 1.0),
    source="benchmarks/learning/popgym_table.py and popgym_envs.py (PPO; the DQN runs of "
    "benchmarks/learning/README.md, 'Recurrent DQN on two popgym tasks'): popgym's per-step "
    "rewards are already small (1/48, 1/200, ...), so the default --reward-scale 0.1 would "
    "shrink the value targets further, and its observations (one-hot cards, values in "
    "[-1, 1]) need no CartPole-masked x10 --obs-scale (DQN's default is 1 already). Returns: "
    "popgym scales each task's rewards so an episode's return lies in [-1, 1] (README, "
    "'popgym table', Scale).",
))  # fmt: skip
register_recipe(Recipe(
    "minigrid", ("MiniGrid-*",),
    {"ppo": ("--image-encoder", "onehot", "--reward-scale", "1", "--num-envs", "256",
             "--steps-per-env", "100", "--epochs", "4", "--num-minibatches", "8",
             "--entropy-coef", "0.02", "--entropy-coef-end", "0.005",
             "--clip-epsilon-end", "0.05", "--max-grad-norm", "0.5")},
    returns=(0.0, 1.0),
    source="docs/guides/fast_recipes.md, section MiniGrid (its command minus --memory gru), "
    "chosen on MiniGrid-MemoryS7 with a GRU at 2M frames, seeds 0-4 (greedy means over 100 "
    "episodes): the one-hot encoder of the symbolic view; rewards at most 1 left unscaled; "
    "rows of 100 steps (256 envs: the same 25,600-frame batches as 512 x 50; they solved "
    "seeds the 50-step rows did not); 4 epochs of 8 "
    "minibatches; an entropy bonus from 0.02 to 0.005 and a clip range from 0.2 to 0.05 "
    "over the run (late updates that no longer collapse the policy); gradients clipped at "
    "norm 0.5 (a large update at 5.0 undid a solved seed). Returns: MiniGrid pays "
    "1 - 0.9 t / max_steps on success, else 0.",
))  # fmt: skip
register_recipe(Recipe(
    "vmas", ("vmas:*",), {"ppo": ("--max-episode-steps", "100")}, returns=None,
    source="VMAS scenarios end an episode only where the scenario says so (balance when the "
    "package falls, navigation never): a policy that keeps the team going ran one episode "
    "without end, and the greedy evaluation waited for it; 100 steps is the horizon of the "
    "VMAS commands in docs/guides/multiagent.md. Returns: no fixed range.",
))  # fmt: skip
register_recipe(Recipe(
    "cartpole-masked", ("CartPole-masked",), {}, returns=(0.0, 500.0),
    source="recurrl train's defaults were tuned on it (PPOConfig's docstring); returns: 1 "
    "per step, at most 500 steps.",
))  # fmt: skip
register_recipe(Recipe(
    "pendulum-masked", ("Pendulum-masked",), {}, returns=(-200 * 16.2736044, 0.0),
    source="recurrl train's defaults; returns: Pendulum-v1's per-step reward in [-16.27, 0] "
    "over its 200 steps (the normalized score is popgym's PositionOnlyPendulum scale, "
    "mapped to [0, 1]).",
))  # fmt: skip

# --- the suites -----------------------------------------------------------------------------
#: popgym 1.0.7's 14 families (``popgym.envs.ALL_EASY`` and its Medium / Hard siblings), in
#: that dict's order; written out so that a suite is known without popgym installed
#: (tests/trainers/test_suites.py checks the list against popgym where it is installed)
POPGYM_FAMILIES = (
    "Autoencode", "RepeatPrevious", "RepeatFirst", "CountRecall", "PositionOnlyCartPole",
    "PositionOnlyPendulum", "VelocityOnlyCartpole", "NoisyPositionOnlyCartPole",
    "NoisyPositionOnlyPendulum", "MultiarmedBandit", "HigherLower", "Battleship",
    "Concentration", "MineSweeper",
)  # fmt: skip
_POPGYM_BUDGET = (
    "100k frames per run: the budget of benchmarks/learning/popgym_table.py (measured on the "
    "Easy tasks, 25-60 s per run on one core), about 1% of the POPGym paper's 15M"
)
#: Easy tasks whose memory shows only with more frames (chosen on seeds 0-4, 2026-12-08:
#: at 100k frames the GRU's interval touched feed-forward's on MultiarmedBandit; at 400k it
#: is apart, benchmarks/learning/README.md, popgym-easy)
_POPGYM_EASY_BUDGETS = {"popgym-MultiarmedBanditEasy-v0": 400_000}
for _level in ("Easy", "Medium", "Hard"):
    register_suite(Suite(
        f"popgym-{_level.lower()}",
        tuple(f"popgym-{family}{_level}-v0" for family in POPGYM_FAMILIES),
        frames=100_000,
        description=f"popgym's 14 {_level} tasks (pip install \"recurrl[popgym]\")",
        source=f"popgym.envs.ALL_{_level.upper()} (popgym 1.0.7); {_POPGYM_BUDGET}"
        + ("; MultiarmedBandit 400k (its memory shows only then)" if _level == "Easy"
           else " (not measured on this level)"),
        task_frames=_POPGYM_EASY_BUDGETS if _level == "Easy" else {},
    ))  # fmt: skip
#: the Memory rooms recurrl's torch env steps (MiniGridMemoryEnv)
MINIGRID_MEMORY = ("S7", "S9", "S11", "S13", "S13Random", "S17Random")
register_suite(Suite(
    "minigrid-memory",
    tuple(f"minigrid:MiniGrid-Memory{size}-v0" for size in MINIGRID_MEMORY),
    frames=1_996_800,
    description="MiniGrid's Memory rooms, the ones recurrl steps as a torch env (pip install "
    '"recurrl[minigrid]")',
    source="the Memory tasks of MiniGridMemoryEnv (docs/guides/fast_recipes.md, MiniGrid); "
    "at most 2M frames: 78 of the MiniGrid recipe's 25,600-frame batches (2M itself would be "
    "rounded up to 79, 2,022,400 frames)",
))  # fmt: skip


# --- the memory models -------------------------------------------------------------------
register_memory_recipe(MemoryRecipe(
    "transformer", {"ppo": ("--lr", "0.002", "--epochs", "4")},
    source="docs/guides/recurrent_mode.md, 'Attention as memory', Learning: with the LSTM's "
    "8 epochs at lr 0.005 the attention trunk's training return rose and collapsed on "
    "CartPole-masked; lr 0.002 with 4 epochs was chosen there on seeds 0-2 (10 of 10 reported "
    "seeds >= 450 at 100k frames) and on popgym-RepeatFirstEasy seeds 0-2 (benchmarks/learning/"
    "README.md, popgym).",
))  # fmt: skip
