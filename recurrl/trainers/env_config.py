"""The env section of a run's configuration (:class:`EnvConfig`: ``--env``, ``--num-envs``,
``--engine``, ``--collector``, ...) and the built-in masked envs; re-exported by
:mod:`recurrl.trainers.config`, whose :class:`~recurrl.trainers.config.TrainConfig` holds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from recurrl.trainers._config_checks import finite, positive

__all__ = ["ENGINES", "MASKED_ENVS", "EnvConfig"]


#: ``EnvConfig.engine`` choices: what steps the envs
ENGINES = ("auto", "torch", "gymnasium", "gymnasium-vector", "envpool")
#: built-in partially observed envs: name -> (gymnasium id, observation entries kept)
MASKED_ENVS: dict[str, tuple[str, list[int]]] = {
    # cart position and pole angle; the two velocities are hidden (needs memory)
    "CartPole-masked": ("CartPole-v1", [0, 2]),
    # cos and sin of the angle; the angular velocity is hidden (continuous torque actions)
    "Pendulum-masked": ("Pendulum-v1", [0, 1]),
}


def _id_hint(name: str) -> str:
    """``"Fix: --env module:name. "`` when an installed module registers ``name`` on import.

    Candidate modules are named after the id's namespace or first word (``MiniGrid-...``
    -> ``minigrid``); one that is installed is imported to check that it registers the id.
    """
    import importlib
    import importlib.util

    import gymnasium

    first = name.split("/")[0] if "/" in name else name.split("-")[0]
    base = first.lower().replace(".", "_")
    for module in dict.fromkeys((base, f"{base}_py", f"{base}_envs")):
        if not module.isidentifier() or importlib.util.find_spec(module) is None:
            continue
        try:
            importlib.import_module(module)
        except Exception:  # a hint only: a module that fails to import gives none
            continue
        if name in gymnasium.registry:
            return (
                f"The installed module {module!r} registers it when imported. Fix: --env "
                f"{module}:{name}. "
            )
    return ""


@dataclass
class EnvConfig:
    """Which environment to train on, and how many copies step together."""

    env: str = "CartPole-masked"
    """Env id: any registered gymnasium id (e.g. CartPole-v1), module:EnvId for an env of
    another package (gymnasium's spelling: the module is imported first, which registers
    its ids; e.g. minigrid:MiniGrid-MemoryS7-v0), a popgym-* id (with the popgym extra
    installed), or the built-in CartPole-masked (CartPole-v1 with both velocities hidden)
    or Pendulum-masked (Pendulum-v1, continuous actions, its angular velocity hidden).
    Dict, Tuple and image observations are accepted (vectors concatenated, uint8 HxWxC
    images through a small CNN, text entries dropped); actions Discrete, or with ppo
    MultiDiscrete (one categorical per entry) or Box. Families have their own defaults (a
    recipe: popgym-* trains with --reward-scale 1 --obs-scale 1, MiniGrid-* with the fast
    MiniGrid recipe; the list: recurrl.trainers.suites.RECIPES), applied under the options
    given and saved in config.json."""
    num_envs: int | None = None
    """Envs stepped together (a gymnasium SyncVectorEnv); None: the algorithm's default, 20
    for ppo (batches of 20 rows of 50 steps: more episodes per batch made the PPO recipe hold
    on every seed) and 8 for dqn."""
    max_episode_steps: int | None = None
    """Episode length limit (truncation); None keeps the env's own limit."""
    engine: Literal["auto", "torch", "gymnasium", "gymnasium-vector", "envpool"] = "auto"
    """What steps the envs: torch (recurrl's batched torch implementation of the task: all
    envs in a few tensor ops per step, on --device; the ids of recurrl.envs.TORCH_ENVS:
    CartPole-masked, Pendulum-masked, CartPole-v1, Pendulum-v1, popgym's RepeatPrevious,
    RepeatFirst and CountRecall, and MiniGrid's Memory tasks, e.g.
    minigrid:MiniGrid-MemoryS7-v0), gymnasium (a gymnasium SyncVectorEnv: one Python call per
    env per step, on the CPU), gymnasium-vector (gymnasium's own batched implementation of
    the id, its vector_entry_point: CartPole), envpool (EnvPool's C++ threads; the envpool
    extra), or auto (torch where the id has one, else gymnasium). All compute the same
    dynamics (tested step for step); their random streams differ."""
    collector: Literal["local", "ray"] = "local"
    """Who steps the envs: local (this process) or ray (--workers Ray actors, each stepping
    its share of the num_envs envs; needs the ray extra, see the README's Scaling out)."""
    workers: int = 2
    """Remote collectors (Ray actors) with --collector ray."""
    envs_per_worker: int | None = None
    """Envs each Ray worker steps (num_envs = workers * envs_per_worker); None: num_envs /
    workers."""
    continuous_actions: bool = False
    """Multi-agent tasks of VMAS and PettingZoo (vmas:..., mpe2:...): build them with
    continuous actions (each agent's action a bounded vector; the policy a tanh-squashed
    Gaussian rescaled to the bounds) instead of discrete ones (VMAS's and MPE's
    continuous_actions argument). A task whose actions are only continuous trains so without
    it; single-agent envs take their action space from the env itself."""
    observation_keep: str | None = None
    """Multi-agent tasks: keep only these entries of each agent's observation vector, hiding
    the others (a partially observed task, as CartPole-masked is for one agent), written as
    indices and inclusive ranges, e.g. 2-13 (VMAS simple_spread without each agent's own
    velocity, entries 0-1). None keeps every entry."""
    observation_flicker: float | None = None
    """Multi-agent tasks: hide each agent's whole observation (zeros) with this probability,
    drawn anew for every agent at every step (a flickering, partially observed task: a policy
    must carry what it saw across the steps it sees nothing), after observation_keep. None
    (or 0) never hides."""

    def __post_init__(self) -> None:
        finite(self)
        positive("EnvConfig", workers=self.workers)
        if self.num_envs is not None:
            positive("EnvConfig", num_envs=self.num_envs)
        if self.max_episode_steps is not None:
            positive("EnvConfig", max_episode_steps=self.max_episode_steps)
        if self.envs_per_worker is not None:
            positive("EnvConfig", envs_per_worker=self.envs_per_worker)
        if self.collector == "ray" and self.num_envs is not None:
            self.worker_envs()  # validates the split (else once TrainConfig resolved num_envs)
        self.gym_id()  # validates the id
        self.resolved_engine()  # validates the engine
        if self.continuous_actions:
            from recurrl.envs.multiagent import is_multiagent_env_id

            if not is_multiagent_env_id(self.env):
                raise ValueError(
                    f"EnvConfig: continuous_actions applies to the multi-agent tasks of VMAS "
                    f"and PettingZoo (vmas:..., mpe2:..., pettingzoo...:...); {self.env!r} "
                    f"takes its action space from the env itself. Fix: drop "
                    f"--continuous-actions (a Box action space trains as continuous by itself)."
                )
        if self.observation_keep is not None:
            self.kept_entries()  # validates the spelling
            if not self.is_multiagent():
                raise ValueError(
                    f"EnvConfig: observation_keep applies to multi-agent tasks (vmas:..., "
                    f"mpe2:..., MultiAgentRecall-v0); {self.env!r} is not one. Fix: a "
                    f"built-in masked env ({', '.join(sorted(MASKED_ENVS))}), or "
                    f"recurrl.envs.transforms.MaskObservation on your own env."
                )

        if self.observation_flicker is not None:
            if not 0.0 <= self.observation_flicker < 1.0:
                raise ValueError(
                    f"EnvConfig: observation_flicker is the probability of hiding an agent's "
                    f"observation, in [0, 1), received {self.observation_flicker}. Fix: e.g. "
                    f"--observation-flicker 0.5."
                )
            if not self.is_multiagent():
                raise ValueError(
                    f"EnvConfig: observation_flicker applies to multi-agent tasks (vmas:..., "
                    f"mpe2:..., MultiAgentRecall-v0); {self.env!r} is not one. Fix: "
                    f"recurrl.envs.transforms.FlickerObservation on your own env."
                )

    def kept_entries(self) -> list[int] | None:
        """:attr:`observation_keep` as a list of indices (``None`` if unset).

        Examples:
            >>> EnvConfig(env="vmas:simple_spread", observation_keep="2-5,9").kept_entries()
            [2, 3, 4, 5, 9]
        """
        if self.observation_keep is None:
            return None
        text = self.observation_keep
        entries: list[int] = []
        try:
            for part in text.split(","):
                low, _, high = part.strip().partition("-")
                first, last = int(low), int(high) if high else int(low)
                if first < 0 or last < first:
                    raise ValueError
                entries.extend(range(first, last + 1))
        except ValueError:
            raise ValueError(
                f"EnvConfig: observation_keep must be indices >= 0 and ranges a-b (a <= b) "
                f"separated by commas, e.g. '2-13' or '0,2,4-6'; received {text!r}."
            ) from None
        if len(set(entries)) != len(entries):
            raise ValueError(
                f"EnvConfig: observation_keep names an entry twice ({text!r}); each entry "
                f"is kept once. Fix: list each index once."
            )
        return entries

    def resolved_engine(self) -> str:
        """``"torch"`` or ``"gymnasium"``: :attr:`engine`, with ``auto`` resolved for the id.

        Examples:
            >>> EnvConfig().resolved_engine(), EnvConfig(env="Acrobot-v1").resolved_engine()
            ('torch', 'gymnasium')
        """
        from recurrl.envs.torch_envs import TORCH_ENVS

        if self.engine not in ENGINES:
            raise ValueError(
                f"EnvConfig: engine must be one of {ENGINES}, received {self.engine!r}."
            )
        if self.is_multiagent():
            if self.engine != "auto":
                raise ValueError(
                    f"EnvConfig: {self.env!r} is a multi-agent task, which its own package "
                    f"steps; engine={self.engine!r} does not apply. Fix: --engine auto."
                )
            return "multiagent"
        if self.engine == "torch" and self.env not in TORCH_ENVS:
            raise ValueError(
                f"EnvConfig: engine='torch' needs an env with a batched torch implementation; "
                f"{self.env!r} has none (those that do: {sorted(TORCH_ENVS)}). Fix: --engine "
                f"auto (gymnasium for this id) or --engine gymnasium."
            )
        if self.engine == "gymnasium-vector":
            from recurrl.envs import vector_entry_point_ids

            ids = vector_entry_point_ids()
            if self.gym_id() not in ids:
                raise ValueError(
                    f"EnvConfig: engine='gymnasium-vector' needs an id with gymnasium's own "
                    f"batched implementation (a vector_entry_point); {self.env!r} has none "
                    f"(those that do: {ids}). Fix: --engine auto."
                )
        if self.engine == "auto":
            return "torch" if self.env in TORCH_ENVS else "gymnasium"
        return self.engine

    def is_multiagent(self) -> bool:
        """Whether :attr:`env` is a multi-agent task (``vmas:<scenario>``, ``mpe2:<task>``: the
        ids of :func:`recurrl.envs.multiagent.is_multiagent_env_id` and recurrl's own
        :data:`recurrl.trainers.multiagent.MULTIAGENT_TASKS`); its
        :meth:`resolved_engine` is then ``"multiagent"``.

        Examples:
            >>> EnvConfig().is_multiagent(), EnvConfig(env="MultiAgentRecall-v0").is_multiagent()
            (False, True)
        """
        from recurrl.trainers.multiagent import is_multiagent

        return is_multiagent(self)

    def worker_envs(self) -> int:
        """Envs per Ray worker: ``envs_per_worker``, or ``num_envs / workers``.

        Examples:
            >>> EnvConfig(num_envs=8, collector="ray", workers=4).worker_envs()
            2
        """
        per = self.envs_per_worker
        if per is None:
            if self.num_envs % self.workers:
                raise ValueError(
                    f"EnvConfig: num_envs={self.num_envs} does not split over workers="
                    f"{self.workers} Ray workers (each steps the same number of envs). Fix: "
                    f"--num-envs {max(1, self.num_envs // self.workers) * self.workers}, or "
                    f"--envs-per-worker K for num_envs = workers * K."
                )
            return self.num_envs // self.workers
        if per * self.workers != self.num_envs:
            raise ValueError(
                f"EnvConfig: workers={self.workers} x envs_per_worker={per} = "
                f"{self.workers * per} envs, but num_envs={self.num_envs}. Fix: --num-envs "
                f"{self.workers * per}, or drop --num-envs (it then follows --envs-per-worker)."
            )
        return per

    def gym_id(self) -> str:
        """The gymnasium id behind :attr:`env` (built-in masked envs resolve to their base)."""
        import gymnasium

        from recurrl.envs.gym import import_env_package, split_env_id

        gym_id = MASKED_ENVS[self.env][0] if self.env in MASKED_ENVS else self.env
        if self.is_multiagent():  # not a gymnasium id: its package must import
            from recurrl.trainers.multiagent import MULTIAGENT_TASKS

            if gym_id in MULTIAGENT_TASKS:
                if self.max_episode_steps is not None:
                    raise ValueError(
                        f"EnvConfig: {self.env!r} has episodes of a fixed length; "
                        f"max_episode_steps does not apply. Fix: drop --max-episode-steps."
                    )
                return gym_id
            import importlib

            from recurrl.envs.gym import split_env_id

            module = split_env_id(gym_id)[0]
            try:
                importlib.import_module(module)
            except ImportError as err:
                extra = "vmas" if module == "vmas" else "multiagent"
                raise ValueError(
                    f"EnvConfig: {self.env!r} needs the package {module!r}, which cannot be "
                    f"imported ({err}). Fix: pip install \"recurrl[{extra}]\"."
                ) from err
            return gym_id
        try:
            # popgym-* ids need `import popgym`, module:EnvId ids `import module`
            import_env_package(gym_id)
            module, name = split_env_id(gym_id)
        except (ModuleNotFoundError, ValueError) as err:
            raise ValueError(f"EnvConfig: {err}") from err
        try:
            gymnasium.spec(name)
        except gymnasium.error.Error as err:
            if module is not None:
                raise ValueError(
                    f"EnvConfig: the module {module!r} was imported but registers no env "
                    f"{name!r} ({err}). Fix: check the id's spelling and version."
                ) from err
            raise ValueError(
                f"EnvConfig: unknown env id {self.env!r} ({err}). {_id_hint(name)}Use a "
                f'registered gymnasium id (list them with `python -c "import gymnasium; '
                f'gymnasium.pprint_registry()"`), module:EnvId for an env of another package '
                f"(its module is imported first, which registers its ids; e.g. "
                f"minigrid:MiniGrid-MemoryS7-v0) or one of the built-in {sorted(MASKED_ENVS)}."
            ) from err
        return gym_id

    def mask(self) -> list[int] | None:
        """The observation entries a built-in masked env keeps, ``None`` for plain ids."""
        return MASKED_ENVS[self.env][1] if self.env in MASKED_ENVS else None
