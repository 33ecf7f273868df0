"""GymEnv: a gymnasium environment behind the recurrl EnvBase interface.

The space <-> spec and numpy <-> tensor conversions are module-level functions that
accept leading batch dims, so a vectorized wrapper can reuse them unchanged.
"""

from __future__ import annotations

import importlib
import pickle
import sys
from typing import Any, ClassVar

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from recurrl.envs._policy_arg import _EnvMeta
from recurrl.envs.common import EnvBase
from recurrl.envs.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    OneHot,
    TensorSpec,
    Unbounded,
)
from recurrl.envs.utils import tensordict_of_checked

__all__ = ["ENV_ID_PACKAGES", "GymEnv", "import_env_package", "space_to_spec", "split_env_id"]

_RESERVED_KEYS = {"action", "reward", "done", "terminated", "truncated", "next", "_reset"}


#: env id prefix -> (module whose import registers those ids, pip requirement providing it)
ENV_ID_PACKAGES: dict[str, tuple[str, str]] = {
    "popgym-": ("popgym", "recurrl[popgym]"),
}


def split_env_id(env_id: str) -> tuple[str | None, str]:
    """``"module:EnvId"`` -> ``("module", "EnvId")``; a plain id -> ``(None, id)``.

    ``module:EnvId`` is gymnasium's own spelling for an env of a package that registers its
    ids on import (``gymnasium.make("minigrid:MiniGrid-MemoryS7-v0")`` imports ``minigrid``
    first); ``gymnasium.spec`` and the registry know only the part after the colon.

    Raises:
        ValueError: more than one colon, or an empty or non-identifier module part.

    Examples:
        >>> split_env_id("minigrid:MiniGrid-MemoryS7-v0")
        ('minigrid', 'MiniGrid-MemoryS7-v0')
        >>> split_env_id("CartPole-v1")
        (None, 'CartPole-v1')
    """
    if ":" not in env_id:
        return None, env_id
    module, _, name = env_id.partition(":")
    valid = all(part.isidentifier() for part in module.split("."))
    if not valid or not name or ":" in name:
        raise ValueError(
            f"env id {env_id!r}: expected 'module:EnvId' (one colon, an importable module "
            f"name before it, a registered id after it), e.g. "
            f"'minigrid:MiniGrid-MemoryS7-v0'."
        )
    return module, name


def import_env_package(env_id: str) -> None:
    """Import the package that registers ``env_id`` with gymnasium, if it is not imported.

    Ids of other packages exist only once their package is imported. ``"module:EnvId"``
    (gymnasium's spelling) imports ``module``; for the prefixes of
    :data:`ENV_ID_PACKAGES` (e.g. ``popgym-``) this is done on first use. Other ids are
    left alone.

    Raises:
        ModuleNotFoundError: the package is not installed (the message names what to
            install: the extra, or ``pip install <module>``).
        ValueError: a malformed ``module:EnvId`` (see :func:`split_env_id`).

    Examples:
        >>> import_env_package("CartPole-v1")  # a gymnasium id: nothing to import
        >>> import_env_package("gymnasium.envs.classic_control:CartPole-v1")
    """
    module, name = split_env_id(env_id)
    if module is not None:
        what = f"env id {env_id!r} needs the module {module!r}"
        top = module.split(".")[0]
        _import(module, what, f"pip install {top} (or the package providing it)")
        return
    for prefix, (package, requirement) in ENV_ID_PACKAGES.items():
        if name.startswith(prefix):
            what = f"env id {env_id!r} comes from the package {package!r}"
            _import(package, what, f'pip install "{requirement}"')


def _import(module: str, what: str, fix: str) -> None:
    """Import ``module`` (once); not installed -> ``ModuleNotFoundError`` with the pip hint."""
    if module in sys.modules:
        return
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        missing = err.name
        if missing is None:
            raise
        if not (module == missing or module.startswith(missing + ".")):
            # the module is there but one of its own dependencies is not
            top = missing.split(".")[0]
            raise ModuleNotFoundError(
                f"{what}, whose import failed: {err}. Fix: pip install {top} (or the "
                f"package providing it).",
                name=missing,
            ) from err
        raise ModuleNotFoundError(
            f"{what}, which is not installed. Fix: {fix}", name=module
        ) from err


def _torch_dtype(np_dtype: Any) -> torch.dtype:
    np_dtype = np.dtype(np_dtype)
    if np_dtype == np.float64:
        return torch.float32  # float64 Box spaces are converted to float32
    return torch.from_numpy(np.zeros(0, dtype=np_dtype)).dtype


def space_to_spec(
    space: spaces.Space,
    *,
    batch_size: tuple[int, ...] | torch.Size = (),
    categorical_action_encoding: bool = True,
    device: torch.device | str = "cpu",
) -> TensorSpec:
    """Convert a gymnasium space to a spec of shape ``[*batch_size, *space.shape]``.

    ``Box`` -> :class:`Unbounded` (all bounds infinite) or :class:`Bounded` (float64 becomes
    float32); ``Discrete`` -> :class:`Categorical` (shape ``[*B]``), or :class:`OneHot` with
    ``categorical_action_encoding=False``; ``MultiDiscrete`` -> :class:`MultiCategorical`;
    ``MultiBinary`` -> :class:`Binary`; ``Dict`` -> nested :class:`Composite`. A non-zero
    ``start`` of (Multi)Discrete spaces is subtracted: specs always count from 0.

    Examples:
        >>> space_to_spec(spaces.Box(-1.0, 1.0, (3,)))
        Bounded(shape=(3,), dtype=torch.float32, device=cpu, low.min()=-1.0, high.max()=1.0)
        >>> space_to_spec(spaces.Discrete(4), categorical_action_encoding=False).shape
        torch.Size([4])
    """
    batch = tuple(batch_size)
    if isinstance(space, spaces.Box):
        dtype = _torch_dtype(space.dtype)
        low = torch.as_tensor(np.asarray(space.low, dtype=np.float64), dtype=torch.float64)
        high = torch.as_tensor(np.asarray(space.high, dtype=np.float64), dtype=torch.float64)
        shape = (*batch, *space.shape)
        if not (torch.isfinite(low).any() or torch.isfinite(high).any()):
            return Unbounded(shape, device=device, dtype=dtype)
        return Bounded(low.to(dtype), high.to(dtype), shape=shape, device=device, dtype=dtype)
    if isinstance(space, spaces.Discrete):
        if categorical_action_encoding:
            return Categorical(int(space.n), shape=batch, device=device)
        return OneHot(int(space.n), shape=(*batch, int(space.n)), device=device)
    if isinstance(space, spaces.MultiDiscrete):
        nvec = torch.as_tensor(np.asarray(space.nvec, dtype=np.int64))
        return MultiCategorical(nvec, shape=(*batch, *nvec.shape), device=device)
    if isinstance(space, spaces.MultiBinary):
        return Binary(shape=(*batch, *space.shape), device=device, dtype=torch.int8)
    if isinstance(space, spaces.Dict):
        out = Composite(shape=batch, device=device)
        for key, sub in space.spaces.items():
            out[key] = space_to_spec(
                sub,
                batch_size=batch,
                categorical_action_encoding=categorical_action_encoding,
                device=device,
            )
        return out
    raise NotImplementedError(
        f"space_to_spec: gymnasium space {type(space).__name__} is not supported; supported: "
        f"Box, Discrete, MultiDiscrete, MultiBinary, Dict. Fix: flatten it with "
        f"gymnasium.wrappers.FlattenObservation."
    )


_NUMPY_DTYPES = {
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.int64: np.dtype(np.int64),
    torch.int32: np.dtype(np.int32),
    torch.uint8: np.dtype(np.uint8),
    torch.bool: np.dtype(np.bool_),
}


def numpy_to_tensor(value: Any, space: spaces.Space, spec: TensorSpec) -> Any:
    """Convert one gymnasium value (leading batch dims allowed) to a tensor of ``spec``.

    ``Dict`` spaces give a dict of converted entries.
    """
    if isinstance(space, spaces.Dict):
        assert isinstance(spec, Composite)
        return {k: numpy_to_tensor(value[k], sub, spec[k]) for k, sub in space.spaces.items()}
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
        index = torch.as_tensor(np.asarray(value, dtype=np.int64) - np.asarray(space.start))
        if isinstance(spec, OneHot):
            return spec._encode(index.to(spec.device))
        return index.to(device=spec.device, dtype=spec.dtype)
    array = np.asarray(value)
    if (
        array.dtype == _NUMPY_DTYPES.get(spec.dtype)
        and spec.device is not None
        and spec.device.type == "cpu"
        and array.flags.writeable
    ):
        tensor = torch.from_numpy(array)  # the same tensor as_tensor gives, for less
    else:
        tensor = torch.as_tensor(array, dtype=spec.dtype, device=spec.device)
    shape = spec.shape
    return tensor if tensor.shape == shape else tensor.reshape(shape)  # reshape costs us


def tensor_to_numpy(action: torch.Tensor, space: spaces.Space, spec: TensorSpec) -> Any:
    """Convert an action tensor of ``spec`` to what ``space`` (gymnasium) expects.

    ``Categorical`` takes an integer index, ``OneHot`` a one-hot vector (its argmax is used).
    A single ``Discrete`` action becomes a Python ``int``.
    """
    if action.shape != spec.shape:
        raise ValueError(
            f"GymEnv: the action has shape {tuple(action.shape)}, expected {tuple(spec.shape)} "
            f"(action_spec {type(spec).__name__})."
        )
    if action.ndim == 0 and isinstance(space, spaces.Discrete) and not isinstance(spec, OneHot):
        return int(action) + int(space.start)  # one env's index: no numpy round trip
    action = action.detach()
    if isinstance(spec, OneHot):
        action = action.to(torch.float32).argmax(-1)
    if isinstance(space, spaces.Discrete):
        index = action.cpu().numpy().astype(np.int64)  # a new array: gymnasium may keep it
        start = int(space.start)
        if start:
            index += start
        return int(index) if index.ndim == 0 else index
    if isinstance(space, spaces.MultiDiscrete):
        return (action.cpu().numpy().astype(np.int64) + space.start).astype(space.dtype)
    if isinstance(space, (spaces.Box, spaces.MultiBinary)):
        return action.cpu().numpy().astype(space.dtype)
    raise NotImplementedError(
        f"GymEnv: action space {type(space).__name__} is not supported; supported: Box, "
        f"Discrete, MultiDiscrete, MultiBinary."
    )


def _make(env: str | gymnasium.Env, make_kwargs: dict[str, Any]) -> gymnasium.Env:
    if isinstance(env, str):
        import_env_package(env)
        try:
            return gymnasium.make(env, **make_kwargs)
        except gymnasium.error.UnregisteredEnv as err:
            raise ValueError(
                f"GymEnv: gymnasium env id {env!r} was not found ({err}). List the registered "
                f"ids with gymnasium.pprint_registry() or sorted(gymnasium.registry); envs of "
                f"other packages are registered when their package is imported."
            ) from err
    if isinstance(env, gymnasium.Env):
        if make_kwargs:
            raise TypeError(
                f"GymEnv: keyword arguments {sorted(make_kwargs)} go to gymnasium.make and "
                f"need an env id, received an env instance."
            )
        return env
    raise TypeError(
        f"GymEnv: expected a gymnasium env id (str) or a gymnasium.Env instance, received "
        f"{type(env).__name__}. For a batch of envs use GymVecEnv(id, num_envs=N)."
    )


def _make_with_pixels(
    env: str | gymnasium.Env, make_kwargs: dict[str, Any], pixels_only: bool
) -> gymnasium.Env:
    """The env with its rendered frame as a ``"pixels"`` entry of a ``Dict`` observation.

    The state observation is kept under ``"observation"`` (the key GymEnv gives a
    non-``Dict`` observation) unless ``pixels_only``.
    """
    if isinstance(env, str):
        mode = make_kwargs.setdefault("render_mode", "rgb_array")
        if mode != "rgb_array":
            raise ValueError(
                f"GymEnv(from_pixels=True): the frames come from env.render() with "
                f"render_mode='rgb_array', received render_mode={mode!r}. Fix: drop "
                f"render_mode (or pass 'rgb_array')."
            )
    made = _make(env, make_kwargs)
    if made.render_mode != "rgb_array":
        raise ValueError(
            f"GymEnv(from_pixels=True): the env instance renders with render_mode="
            f"{made.render_mode!r}; pixel observations need 'rgb_array'. Fix: "
            f"gymnasium.make(id, render_mode='rgb_array'), or pass the id."
        )
    space = made.observation_space
    if isinstance(space, spaces.Dict) and "pixels" in space.spaces:
        raise ValueError(
            "GymEnv(from_pixels=True): the env's Dict observation already has a 'pixels' "
            "entry. Fix: use it as it is (from_pixels=False)."
        )
    wrappers = gymnasium.wrappers
    pixels = wrappers.AddRenderObservation(
        made, render_only=False, render_key="pixels", obs_key="observation"
    )
    return wrappers.FilterObservation(pixels, ["pixels"]) if pixels_only else pixels


class _GymEnvMeta(_EnvMeta):
    """Metaclass of :class:`GymEnv`: ``GymEnv(id, num_envs=N)`` as an alias of the batched env.

    The reference library's spelling ``GymEnv(id, num_envs=N, ...)`` (and ``GymEnv(vector_env,
    ...)``) is forwarded unchanged to the batched class, ``GymVecEnv(id, num_envs=N, ...)``.
    That class declares itself (``class GymVecEnv(GymEnv, batched=True)``), so this module
    never imports it, and ``GymEnv.__init__`` builds one env only. Only ``GymEnv`` itself
    forwards: a subclass is built as it is.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is GymEnv:
            vector_given = bool(args) and isinstance(args[0], gymnasium.vector.VectorEnv)
            if kwargs.get("num_envs") is not None or vector_given:
                if kwargs.get("from_pixels"):
                    raise ValueError(
                        "GymEnv(..., num_envs=N, from_pixels=True): pixel observations are "
                        "built for one env (gymnasium's AddRenderObservation has no vector "
                        "version). Fix: SerialEnv / ParallelEnv of N GymEnv(id, "
                        "from_pixels=True) envs."
                    )
                batched = GymEnv._batched_class
                if batched is None:
                    raise RuntimeError(
                        "GymEnv(..., num_envs=N): no batched class is declared; import "
                        "recurrl.envs (which defines GymVecEnv) and use GymVecEnv(id, "
                        "num_envs=N)."
                    )
                return batched(*args, **kwargs)
        return super().__call__(*args, **kwargs)


class GymEnv(EnvBase, metaclass=_GymEnvMeta):
    """A single gymnasium env (``batch_size=[]``) as a recurrl env.

    The observation goes under ``"observation"``; a ``Dict`` observation space gives one
    key per entry (nested Dicts give nested keys). Float64 ``Box`` spaces are converted to
    float32 specs and tensors. ``reward`` is ``[1]`` float32 and ``done`` / ``terminated``
    / ``truncated`` ``[1]`` bool (``truncated`` comes from gymnasium's time limits).
    Gymnasium's ``info`` dict is not recorded.

    Seeding: ``seed`` (or :meth:`set_seed`) is passed to gymnasium at the next reset.
    Random actions (``rollout`` without a policy) use torch's global RNG.

    Args:
        env_name_or_instance: a registered env id (made with ``gymnasium.make``) or a
            ``gymnasium.Env`` instance.
        device: device of the tensors written.
        categorical_action_encoding: ``Discrete`` spaces become :class:`Categorical`
            integer indices (True) or :class:`OneHot` vectors (False).
        seed: optional seed for the first reset.
        from_pixels: add the rendered frame as a ``"pixels"`` observation, uint8
            ``[H, W, 3]`` (``Bounded`` in ``[0, 255]``), from ``env.render()`` after every
            reset and step (gymnasium's ``AddRenderObservation``). The env is made with
            ``render_mode="rgb_array"`` (an env instance must have it). Default False.
        pixels_only: with ``from_pixels``, keep only ``"pixels"`` (True, the default, as
            the reference) or also the state observation under ``"observation"`` (False; a
            ``Dict`` observation space keeps its keys).
        num_envs: not an argument of this class: ``GymEnv(id, num_envs=N, ...)`` (the
            reference library's spelling) and ``GymEnv(vector_env, ...)`` are documented
            aliases of :class:`~recurrl.envs.GymVecEnv` ``(id, num_envs=N, ...)`` and
            return a ``GymVecEnv`` (batch ``[N]``). ``num_envs=None`` builds one env.
        policy: a policy whose needs the env should meet (taken by every env class, see
            :class:`~recurrl.envs.EnvBase`): with recurrent modules inside, the constructor
            returns a :class:`~recurrl.envs.TransformedEnv` around this env with an
            ``InitTracker`` and a primer for their state keys; otherwise the env itself.
        **make_kwargs: passed to ``gymnasium.make`` (e.g. ``render_mode``).

    Examples:
        >>> env = GymEnv("CartPole-v1", seed=0)
        >>> env.action_spec
        Categorical(shape=(), dtype=torch.int64, device=cpu, n=2)
        >>> td = env.reset()
        >>> td["observation"].shape, td["done"]
        (torch.Size([4]), tensor([False]))
        >>> data = env.rollout(5, break_when_any_done=False)
        >>> data.batch_size, data["next", "reward"].dtype
        (torch.Size([5]), torch.float32)

        A recurrent policy brings the transforms it needs (``is_init`` and its state keys):

        >>> from tensordict.nn import TensorDictModule as Mod, TensorDictSequential as Seq
        >>> from recurrl.modules import GRUModule
        >>> gru = GRUModule(4, 8, in_keys=["observation", "rs"], out_keys=["h", ("next", "rs")])
        >>> policy = Seq(gru, Mod(lambda h: h.argmax(-1) % 2, in_keys=["h"], out_keys=["action"]))
        >>> env = GymEnv("CartPole-v1", policy=policy)
        >>> type(env).__name__, type(env.base_env).__name__
        ('TransformedEnv', 'GymEnv')
        >>> sorted(env.reset().keys())
        ['done', 'is_init', 'observation', 'rs', 'terminated', 'truncated']

        Pixel observations, with the state kept next to them:

        >>> env = GymEnv("CartPole-v1", from_pixels=True, pixels_only=False)
        >>> td = env.reset()
        >>> td["pixels"].shape, td["pixels"].dtype, td["observation"].shape
        (torch.Size([400, 600, 3]), torch.uint8, torch.Size([4]))
        >>> env.close()

        The reference library's spelling of a batch of envs is an alias of ``GymVecEnv``:

        >>> env = GymEnv("CartPole-v1", num_envs=2)
        >>> type(env).__name__, env.batch_size
        ('GymVecEnv', torch.Size([2]))
        >>> env.close()
    """

    #: The class ``GymEnv(id, num_envs=N)`` builds: the subclass declared with
    #: ``batched=True`` (:class:`~recurrl.envs.GymVecEnv`).
    _batched_class: ClassVar[type[GymEnv] | None] = None
    #: whether a ``"pixels"`` observation is rendered (see ``from_pixels``)
    from_pixels: bool = False
    #: whether ``"pixels"`` is the only observation
    pixels_only: bool = False

    def __init_subclass__(cls, batched: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if batched:
            GymEnv._batched_class = cls

    def __init__(
        self,
        env_name_or_instance: str | gymnasium.Env,
        *,
        device: torch.device | str = "cpu",
        categorical_action_encoding: bool = True,
        seed: int | None = None,
        from_pixels: bool = False,
        pixels_only: bool = True,
        **make_kwargs: Any,
    ) -> None:
        if "num_envs" in make_kwargs and make_kwargs["num_envs"] is None:
            del make_kwargs["num_envs"]  # num_envs=None: one env
        vector_only = {"num_envs", "vectorization", "vector_kwargs", "step_timeout"}
        vector_only &= set(make_kwargs)
        if vector_only:
            raise TypeError(
                f"{type(self).__name__}: {sorted(vector_only)} need num_envs=N: they are "
                f"arguments of a batch of envs, and this class builds one env. Fix: "
                f"GymVecEnv(id, num_envs=N, ...)."
            )
        if from_pixels:
            env = _make_with_pixels(env_name_or_instance, make_kwargs, pixels_only)
        else:
            env = _make(env_name_or_instance, make_kwargs)
        super().__init__(device=device, batch_size=())
        self.from_pixels, self.pixels_only = bool(from_pixels), bool(pixels_only and from_pixels)
        self._env = env
        self._setup(env.observation_space, env.action_space, categorical_action_encoding, seed)

    def _setup(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        categorical_action_encoding: bool,
        seed: int | None,
    ) -> None:
        """Set the specs from the spaces of one env, expanded to ``env.batch_size``."""
        self._observation_space, self._action_space = observation_space, action_space
        self.categorical_action_encoding = categorical_action_encoding
        convert = {
            "batch_size": self.batch_size,
            "categorical_action_encoding": categorical_action_encoding,
            "device": self.device,
        }
        obs_spec = space_to_spec(observation_space, **convert)
        if isinstance(observation_space, spaces.Dict):
            assert isinstance(obs_spec, Composite)
            clash = _RESERVED_KEYS & set(obs_spec.keys())
            if clash:
                raise ValueError(
                    f"GymEnv: the Dict observation space uses reserved key(s) {sorted(clash)}; "
                    f"rename them with a gymnasium wrapper."
                )
            self.observation_spec = obs_spec
        else:
            self.observation_spec = Composite(observation=obs_spec, shape=self.batch_size)
        self.action_spec = space_to_spec(action_space, **convert)
        self.reward_spec = Unbounded((*self.batch_size, 1), device=self.device)
        self._pending_seed: int | None = None
        if seed is not None:
            self.set_seed(seed)

    @property
    def env(self) -> gymnasium.Env:
        """The wrapped gymnasium env."""
        return self._env

    def _observation_entries(self, obs: Any) -> dict[str, Any]:
        fast = self._obs_fast()
        if (
            fast is not None
            and type(obs) is np.ndarray
            and obs.dtype == fast[0]
            and obs.flags.writeable
        ):
            # numpy_to_tensor's own conversion of such an array, without its dispatch on
            # the space (several isinstance checks against gymnasium's abstract classes)
            tensor = torch.from_numpy(obs)
            return {"observation": tensor if tensor.shape == fast[1] else tensor.reshape(fast[1])}
        if isinstance(self._observation_space, spaces.Dict):
            return numpy_to_tensor(obs, self._observation_space, self.observation_spec)
        spec = self._obs_leaf_spec()
        return {"observation": numpy_to_tensor(obs, self._observation_space, spec)}

    def _obs_fast(self) -> tuple[np.dtype, torch.Size] | None:
        """``(numpy dtype, spec shape)`` when :func:`numpy_to_tensor` converts an observation
        array of that dtype with ``from_numpy`` (a Box or MultiBinary space, a CPU spec of
        that dtype), else ``None``; cached per specs version and observation space."""
        version, space = self._specs_version(), self._observation_space
        cached = self.__dict__.get("_obs_fast_cache")
        if cached is None or cached[0] != version or cached[1] is not space:
            fast = None
            if isinstance(space, (spaces.Box, spaces.MultiBinary)):
                spec = self._obs_leaf_spec()
                dtype = _NUMPY_DTYPES.get(spec.dtype)
                device = spec.device
                if dtype is not None and device is not None and device.type == "cpu":
                    fast = (dtype, spec.shape)
            cached = (version, space, fast)
            self.__dict__["_obs_fast_cache"] = cached
        return cached[2]

    def _obs_leaf_spec(self) -> TensorSpec:
        # Looked up once per specs version: this runs at every step.
        version = self._specs_version()
        cached = self.__dict__.get("_obs_spec_cache")
        if cached is None or cached[0] != version:
            cached = (version, self.observation_spec["observation"])
            self.__dict__["_obs_spec_cache"] = cached
        return cached[1]

    def _flags(self, terminated: Any, truncated: Any) -> tuple[torch.Tensor, ...]:
        """``terminated``, ``truncated`` and ``done`` (their or), each bool ``[*B, 1]``.

        Shaped in numpy (a few tenths of a µs an operation) and wrapped with ``from_numpy``:
        a torch reshape and unbind cost several µs per step. ``np.array`` copies, so the
        tensors never share memory with gymnasium's buffers.
        """
        shape = (*self.batch_size, 1)
        term = np.array(terminated, dtype=np.bool_).reshape(shape)
        trunc = np.array(truncated, dtype=np.bool_).reshape(shape)
        flags = (torch.from_numpy(term), torch.from_numpy(trunc))
        flags += (torch.from_numpy(np.logical_or(term, trunc)),)
        if self.device.type != "cpu":
            return tuple(f.to(self.device) for f in flags)
        return flags

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        obs, _info = self._env.reset(seed=self._take_seed(), **kwargs)
        return self._reset_td(obs)

    def _take_seed(self) -> int | None:
        """The seed for this reset (then forgotten). Assigned only when set: an attribute
        assignment on an ``nn.Module`` costs more than the check."""
        seed = self._pending_seed
        if seed is not None:
            self._pending_seed = None
        return seed

    def _reset_td(self, obs: Any) -> TensorDict:
        """The reset observation, with the done keys False (filled here rather than by
        :class:`EnvBase` from the specs: the same values, cheaper)."""
        entries = self._observation_entries(obs)
        if self._standard_done():
            shape = (*self.batch_size, 1)
            if self.device.type == "cpu":  # numpy zeros and from_numpy: the cheapest form
                flags = [torch.from_numpy(np.zeros(shape, np.bool_)) for _ in range(3)]
            else:
                flags = torch.zeros((3, *shape), dtype=torch.bool, device=self.device).unbind(0)
            entries["terminated"], entries["truncated"], entries["done"] = flags
        return tensordict_of_checked(entries, self.batch_size, self.device)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensor_to_numpy(tensordict.get("action"), self._action_space, self.action_spec)
        obs, reward, terminated, truncated, _info = self._env.step(action)
        return self._step_td(obs, reward, terminated, truncated)

    def _step_td(self, obs: Any, reward: Any, terminated: Any, truncated: Any) -> TensorDict:
        entries = self._observation_entries(obs)
        reward_np = np.asarray(reward, dtype=np.float32)
        batch = self.batch_size
        if reward_np.size == batch.numel() and reward_np.flags.writeable:
            # shaped in numpy: the same tensor as as_tensor + reshape, for a third of the cost
            reward_t = torch.from_numpy(reward_np.reshape(*batch, 1))
        else:  # a wrong number of rewards raises torch's reshape error, as before
            reward_t = torch.as_tensor(reward_np)
            reward_t = reward_t.reshape(*batch, 1)
        if self.device.type != "cpu":
            reward_t = reward_t.to(self.device)
        entries["reward"] = reward_t
        entries["terminated"], entries["truncated"], entries["done"] = self._flags(
            terminated, truncated
        )
        return tensordict_of_checked(entries, self.batch_size, self.device)

    def simulator_state(self) -> bytes:
        """The gymnasium env pickled, with the wrapper's pending flags, for exact checkpoints.

        The env's ``state_dict()`` cannot hold a simulator; this can, for envs that pickle (a
        subprocess vector env does not: ``pickle`` raises).
        """
        state = {
            "env": self._env,
            "needs_reset": getattr(self, "_needs_reset", None),
            "pending_seed": self._pending_seed,
        }
        return pickle.dumps(state)

    def load_simulator_state(self, blob: bytes) -> None:
        """Swap in a simulator saved by :meth:`simulator_state` (the current one is closed).

        ``blob`` is a pickle: unpickling runs whatever code its author chose. Pass only bytes
        you wrote yourself or trust (``recurrl train --resume`` calls this only with
        ``--trust-checkpoint``).
        """
        state = pickle.loads(blob)  # trusted: callers pass only blobs the user vouched for
        self._env.close()
        self._env = state["env"]
        if state["needs_reset"] is not None:
            self._needs_reset = state["needs_reset"]
        self._pending_seed = state["pending_seed"]

    def _set_seed(self, seed: int | None) -> None:
        self._pending_seed = seed
        self._env.action_space.seed(seed)
        self._env.observation_space.seed(seed)

    def _close(self) -> None:
        self._env.close()

    def extra_repr(self) -> str:
        spec = self._env.spec
        name = spec.id if spec is not None else type(self._env.unwrapped).__name__
        return f"env={name!r}, {super().extra_repr()}"
