"""Network inputs of the recipes: any supported observation as a flat vector and an image.

``recurrl train`` networks read two keys (:func:`~recurrl.trainers.models.make_env` writes
them):

- ``"observation"`` float32 ``[*B, F]``: every vector entry of the observation,
  flattened and concatenated (``Box`` of any rank and dtype as floats, ``Discrete`` and
  ``MultiDiscrete`` one-hot, ``MultiBinary`` as 0/1), in the order of the observation
  space's keys (gymnasium's ``Dict`` sorts them alphabetically unless given in order; a
  ``Tuple`` is read as a ``Dict`` whose keys are its positions 0, 1, ..., nested ones
  included);
- ``"pixels"`` uint8 ``[*B, H, W, C]``: the image entries (``uint8`` ``Box`` of rank 3,
  channels last, as MiniGrid and Atari give them), concatenated along the channels.

Entries of other spaces (``Text``, ``Graph``, ``Sequence``, ...) are dropped with a one-line
warning naming them. Flat envs (a rank-1 float ``Box``, a ``Discrete`` or ``MultiDiscrete``)
do not go through here: :func:`make_env` keeps them as they were.

The model side: an image encoder of :data:`IMAGE_ENCODERS` (:class:`ImageEncoder`, a small
CNN, or :class:`FlatImageEncoder`, one linear layer over the entries, for small symbolic
grids such as MiniGrid's) turns ``"pixels"`` into features that :func:`add_image_encoder`
concatenates with the vector before the recurrent trunk.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from tensordict.nn import TensorDictModule as Mod
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = [
    "IMAGE_ENCODERS",
    "OBS_KEY",
    "PIXELS_KEY",
    "FlatImageEncoder",
    "ImageEncoder",
    "InputEncoder",
    "NetworkInputs",
    "ObsInputs",
    "OneHotImageEncoder",
    "add_image_encoder",
    "image_encoder",
    "inputs_vector_env",
    "needs_network_inputs",
    "observation_inputs",
]

OBS_KEY = "observation"
PIXELS_KEY = "pixels"


@dataclass(frozen=True)
class ObsInputs:
    """What the networks read: the vector size and the image shape.

    Attributes:
        vector: ``F``, features of ``"observation"`` ``[*B, F]`` (0: there is none).
        image: ``(H, W, C)`` of ``"pixels"`` uint8 ``[*B, H, W, C]``; ``None``: no image.

    Examples:
        >>> ObsInputs.of(4)
        ObsInputs(vector=4, image=None)
    """

    vector: int
    image: tuple[int, int, int] | None = None

    @classmethod
    def of(cls, value: int | ObsInputs) -> ObsInputs:
        """An ``ObsInputs`` as is, or an int ``F``: a vector of ``F`` features only."""
        return value if isinstance(value, ObsInputs) else cls(int(value))


def observation_inputs(env: Any) -> ObsInputs:
    """The :class:`ObsInputs` of an env from :func:`~recurrl.trainers.models.make_env`.

    Examples:
        >>> from recurrl.envs import GymVecEnv
        >>> observation_inputs(GymVecEnv("CartPole-v1", num_envs=2))
        ObsInputs(vector=4, image=None)
    """
    spec = env.observation_spec
    vector, image = spec.get(OBS_KEY, None), spec.get(PIXELS_KEY, None)
    shape = None if image is None else tuple(int(s) for s in image.shape[-3:])
    return ObsInputs(0 if vector is None else int(vector.shape[-1]), shape)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- the env side
def _is_image(space: spaces.Space) -> bool:
    return isinstance(space, spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def needs_network_inputs(space: spaces.Space) -> bool:
    """Whether an observation space goes through :class:`NetworkInputs`: anything but a
    rank-1 float ``Box``, a ``Discrete`` or a rank-1 ``MultiDiscrete`` (which the recipes
    read directly).

    Examples:
        >>> needs_network_inputs(spaces.Box(-1.0, 1.0, (4,)))
        False
        >>> needs_network_inputs(spaces.Box(0, 255, (7, 7, 3), np.uint8))
        True
    """
    if isinstance(space, spaces.Box):
        return len(space.shape) != 1 or not np.issubdtype(space.dtype, np.floating)
    if isinstance(space, spaces.MultiDiscrete):
        return len(space.shape) != 1
    return not isinstance(space, spaces.Discrete)


Path = tuple[str | int, ...]  # the keys (Dict) and positions (Tuple) leading to an entry


def _leaves(space: spaces.Space, path: Path) -> list[tuple[Path, Any]]:
    """The entries of ``space`` (not a ``Dict`` or ``Tuple``), with their paths, in order."""
    if isinstance(space, spaces.Dict):
        return [leaf for key, sub in space.spaces.items() for leaf in _leaves(sub, (*path, key))]
    if isinstance(space, spaces.Tuple):
        return [leaf for i, sub in enumerate(space.spaces) for leaf in _leaves(sub, (*path, i))]
    return [(path, space)]


def _name(path: Path) -> str:
    """An entry's name in messages: ``"inner.depth"``, ``"1.0"``."""
    return ".".join(map(str, path))


def _vector_bounds(space: spaces.Space) -> tuple[np.ndarray, np.ndarray] | None:
    """Flat float bounds of a vector entry; ``None`` for a space that is not one."""
    if isinstance(space, spaces.Box):
        low, high = space.low.astype(np.float32), space.high.astype(np.float32)
        return low.reshape(-1), high.reshape(-1)
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
        size = _one_hot_size(space) if not isinstance(space, spaces.MultiBinary) else space.n
        size = int(np.prod(size))
        return np.zeros(size, np.float32), np.ones(size, np.float32)
    return None


def _one_hot_size(space: spaces.Discrete | spaces.MultiDiscrete) -> int:
    return int(space.n) if isinstance(space, spaces.Discrete) else int(space.nvec.sum())


def _vector(space: spaces.Space, value: Any) -> np.ndarray:
    """One vector entry as a flat float32 array."""
    if isinstance(space, spaces.Discrete):
        out = np.zeros(int(space.n), np.float32)
        out[int(value) - int(space.start)] = 1.0
        return out
    if isinstance(space, spaces.MultiDiscrete):
        nvec = space.nvec.reshape(-1)
        index = (np.asarray(value) - space.start).reshape(-1) + np.cumsum(nvec) - nvec
        out = np.zeros(int(nvec.sum()), np.float32)
        out[index] = 1.0
        return out
    return np.asarray(value, dtype=np.float32).reshape(-1)


class NetworkInputs(gymnasium.ObservationWrapper):
    """A gymnasium wrapper: any observation as ``{"observation": [F], "pixels": [H, W, C]}``.

    See the module doc for what goes where; each key is present only when some entry feeds
    it. A ``Tuple`` is read as a ``Dict`` keyed by the positions (entries named ``"0"``,
    ``"1"``, ... in messages); any other non-``Dict`` observation is one entry named
    ``observation``.

    Args:
        env: the gymnasium env.
        warn: warn (one line) about the entries left out.

    Raises:
        ValueError: no entry is a vector or an image, or images of different sizes.

    Attributes:
        dropped: the entries left out, as ``"name (SpaceType)"``.

    Examples:
        >>> env = gymnasium.make("CartPole-v1")
        >>> env.unwrapped.observation_space = spaces.Dict(
        ...     pos=spaces.Box(-1.0, 1.0, (2,)), cue=spaces.Discrete(3), note=spaces.Text(8))
        >>> env = NetworkInputs(env, warn=False)
        >>> env.observation_space["observation"].shape, env.dropped
        ((5,), ['note (Text)'])
        >>> env.observation({"cue": 1, "note": "hi", "pos": np.array([0.5, -0.5])})
        {'observation': array([ 0.5, -0.5,  0. ,  1. ,  0. ], dtype=float32)}
        >>> env = gymnasium.make("CartPole-v1")  # a Tuple, as popgym's Autoencode gives
        >>> env.unwrapped.observation_space = spaces.Tuple((spaces.Discrete(2), spaces.Discrete(4)))
        >>> NetworkInputs(env).observation((1, 3))
        {'observation': array([0., 1., 0., 0., 0., 1.], dtype=float32)}
    """

    def __init__(self, env: gymnasium.Env, *, warn: bool = True) -> None:
        super().__init__(env)
        self._flat = not isinstance(env.observation_space, (spaces.Dict, spaces.Tuple))
        leaves = _leaves(env.observation_space, (OBS_KEY,) if self._flat else ())
        self._images = [(path, sub) for path, sub in leaves if _is_image(sub)]
        self._vectors = [
            (path, sub, bounds)
            for path, sub in leaves
            if not _is_image(sub) and (bounds := _vector_bounds(sub)) is not None
        ]
        used = {path for path, _ in self._images} | {path for path, _, _ in self._vectors}
        dropped = [f"{_name(p)} ({type(s).__name__})" for p, s in leaves if p not in used]
        name = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
        if not used:
            raise ValueError(
                f"NetworkInputs: no observation entry of {name!r} is a vector or an image; "
                f"received {env.observation_space}. Supported: Box (uint8 HxWxC images, other "
                f"Boxes as vectors), Discrete, MultiDiscrete, MultiBinary, and Dicts and "
                f"Tuples of them."
            )
        if dropped and warn:
            warnings.warn(
                f"{name}: observation entries {dropped} are neither vectors nor images and "
                f"are left out of the network inputs.",
                stacklevel=2,
            )
        out: dict[str, spaces.Space] = {}
        if self._vectors:
            low = np.concatenate([b[0] for _, _, b in self._vectors])
            high = np.concatenate([b[1] for _, _, b in self._vectors])
            out[OBS_KEY] = spaces.Box(low, high, dtype=np.float32)
        if self._images:
            sizes = {sub.shape[:2] for _, sub in self._images}
            if len(sizes) > 1:
                shapes = {_name(p): s.shape for p, s in self._images}
                raise ValueError(
                    f"NetworkInputs: the images of {name!r} differ in height and width "
                    f"({shapes}); they are stacked along the channels, so they must match. "
                    f"Fix: resize them with a gymnasium wrapper and register the wrapped env."
                )
            (h, w), c = sizes.pop(), sum(sub.shape[2] for _, sub in self._images)
            out[PIXELS_KEY] = spaces.Box(0, 255, (h, w, c), dtype=np.uint8)
        self.observation_space = spaces.Dict(out)
        self.dropped = dropped

    def observation(self, observation: Any) -> dict[str, np.ndarray]:
        def get(path: Path) -> Any:
            if self._flat:
                return observation
            value = observation
            for key in path:
                value = value[key]
            return value

        out = {}
        if self._vectors:
            out[OBS_KEY] = np.concatenate([_vector(sub, get(p)) for p, sub, _ in self._vectors])
        if self._images:
            images = [np.asarray(get(p), dtype=np.uint8) for p, _ in self._images]
            out[PIXELS_KEY] = images[0] if len(images) == 1 else np.concatenate(images, -1)
        return out


def _make_inputs_env(env_id: str, make_kwargs: dict[str, Any], warn: bool) -> gymnasium.Env:
    return NetworkInputs(gymnasium.make(env_id, **make_kwargs), warn=warn)


def inputs_vector_env(
    env_id: str, num_envs: int, make_kwargs: dict[str, Any] | None = None
) -> gymnasium.vector.SyncVectorEnv:
    """``num_envs`` copies of ``env_id`` behind :class:`NetworkInputs`, as a gymnasium
    ``SyncVectorEnv`` that :class:`~recurrl.envs.GymVecEnv` takes (autoreset disabled: recurrl
    resets finished envs itself). Only the first copy warns about dropped entries.

    Examples:
        >>> from recurrl.envs import GymVecEnv
        >>> env = GymVecEnv(inputs_vector_env("CartPole-v1", 3))
        >>> env.reset()["observation"].shape
        torch.Size([3, 4])
    """
    kwargs = dict(make_kwargs or {})
    fns = [functools.partial(_make_inputs_env, env_id, kwargs, i == 0) for i in range(num_envs)]
    return gymnasium.vector.SyncVectorEnv(
        fns, autoreset_mode=gymnasium.vector.AutoresetMode.DISABLED
    )


# ---------------------------------------------------------------------- the model side
def _image_shape(who: str, shape: Sequence[int]) -> tuple[int, int, int]:
    """``shape`` as ``(H, W, C)`` ints, each >= 1; else a ValueError naming ``who``."""
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"{who}: expected shape (H, W, C), received {tuple(shape)}.")
    h, w, c = (int(s) for s in shape)
    return h, w, c


def _check_images(who: str, shape: tuple[int, ...], pixels: torch.Tensor) -> None:
    """A ValueError naming ``who`` unless ``pixels`` is ``[*B, *shape]``."""
    if tuple(pixels.shape[-3:]) != shape:
        raise ValueError(
            f"{who}: expected images [*B, {', '.join(map(str, shape))}] (H, W, C), received "
            f"{list(pixels.shape)}."
        )


class ImageEncoder(nn.Module):
    """``uint8 [*B, H, W, C] -> float [*B, out_features]``: a small CNN.

    Pixels are scaled to ``[0, 1]`` and the channels moved first; three 3x3 convolutions
    (``channels`` out, padding 1, ReLU) with stride 2 while the smaller side is >= 16 (so a
    7x7 MiniGrid view keeps its cells, an 84x84 frame shrinks to 11x11), then flatten and a
    linear layer with ReLU. Any leading dims ``*B`` (``[N]`` one step, ``[N, T]``
    sequences) are folded into the convolution batch and restored.

    Examples:
        >>> enc = ImageEncoder((7, 7, 3), 32)
        >>> enc(torch.zeros(4, 7, 7, 3, dtype=torch.uint8)).shape
        torch.Size([4, 32])
        >>> enc(torch.zeros(2, 5, 7, 7, 3, dtype=torch.uint8)).shape
        torch.Size([2, 5, 32])
    """

    def __init__(
        self, shape: Sequence[int], out_features: int, channels: Sequence[int] = (16, 32, 32)
    ) -> None:
        super().__init__()
        self.shape = _image_shape("ImageEncoder", shape)
        h, w, c = self.shape
        layers: list[nn.Module] = []
        side = min(h, w)
        for out in channels:
            stride = 2 if side >= 16 else 1
            layers += [nn.Conv2d(c, out, 3, stride=stride, padding=1), nn.ReLU()]
            c, side = out, (side - 1) // stride + 1
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, self.shape[2], h, w)).shape[-1]
        self.head = nn.Sequential(nn.Linear(flat, out_features), nn.ReLU())
        self.out_features = out_features
        # Orthogonal weights with the ReLU gain and zero biases (as PPO's CNNs are usually
        # initialized): torch's default init shrinks the signal at every layer, so a cue of
        # a few pixels reached the trunk as differences of ~1e-3 and a recurrent policy that
        # must remember it did not learn to.
        for layer in self.modules():
            if isinstance(layer, (nn.Conv2d, nn.Linear)):
                nn.init.orthogonal_(layer.weight, nn.init.calculate_gain("relu"))
                nn.init.zeros_(layer.bias)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        _check_images("ImageEncoder", self.shape, pixels)
        batch = pixels.shape[:-3]
        x = pixels.reshape(-1, *self.shape).permute(0, 3, 1, 2).float() / 255.0
        return self.head(self.convs(x)).reshape(*batch, self.out_features)


class FlatImageEncoder(nn.Module):
    """``uint8 [*B, H, W, C] -> float [*B, out_features]``: every entry as a number, one
    linear layer and a ReLU.

    Made for small symbolic grids, where an entry is an index (MiniGrid's 7x7 view holds an
    object, a colour and a state index per cell, all < 11): the entries are read as they
    are, unscaled, so that two objects whose indices differ by one move a feature by a
    weight, not by a weight / 255. A fraction of the CNN's cost (one ``[H*W*C, E]`` matmul
    per frame instead of three convolutions over every cell); camera images want
    :class:`ImageEncoder`. Orthogonal weights with the ReLU gain, zero biases (as the CNN).

    Examples:
        >>> enc = FlatImageEncoder((7, 7, 3), 32)
        >>> enc(torch.zeros(4, 7, 7, 3, dtype=torch.uint8)).shape
        torch.Size([4, 32])
        >>> enc(torch.zeros(2, 5, 7, 7, 3, dtype=torch.uint8)).shape
        torch.Size([2, 5, 32])
    """

    def __init__(self, shape: Sequence[int], out_features: int) -> None:
        super().__init__()
        self.shape = _image_shape("FlatImageEncoder", shape)
        self.out_features = out_features
        self.linear = nn.Linear(int(np.prod(self.shape)), out_features)
        nn.init.orthogonal_(self.linear.weight, nn.init.calculate_gain("relu"))
        nn.init.zeros_(self.linear.bias)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        _check_images("FlatImageEncoder", self.shape, pixels)
        x = pixels.reshape(*pixels.shape[:-3], -1).to(self.linear.weight.dtype)
        return torch.relu(self.linear(x))


class OneHotImageEncoder(nn.Module):
    """``uint8 [*B, H, W, C] -> float [*B, out_features]``: every entry as a category, one
    learned vector per (entry, value), summed, plus a bias and a ReLU.

    Made for small symbolic grids whose entries are indices (MiniGrid's 7x7 view: an object,
    a colour and a state index per cell). It is a linear layer over the one-hot encoding of
    every entry (``H*W*C*num_values`` inputs), computed as a sum of ``H*W*C`` looked-up rows
    (``embedding_bag``; on a CPU the backward is a matmul per value present, half the time of
    ``embedding_bag``'s own). Forward and backward take about 23 ms for 3,200 frames of a
    7x7x3 view into 64 features on one CPU thread, against 3 ms for
    :class:`FlatImageEncoder` and 54 ms through ``embedding_bag``'s backward
    (``python benchmarks/grid_encoders.py``). Unlike the flat encoder, values are
    not ordered: a key (index 5) and a ball (index 6) are as far apart as a key and a wall,
    which is what a policy that must tell objects apart needs. Every entry must be an integer
    in ``[0, num_values)``; a larger one raises (``num_values=16`` holds MiniGrid's 11
    objects, 6 colours and 3 states). Rows are drawn from N(0, 1 / entries) (each output a
    sum of ``H*W*C`` rows starts at about unit scale), zero bias.

    Examples:
        >>> enc = OneHotImageEncoder((7, 7, 3), 32)
        >>> enc(torch.zeros(4, 7, 7, 3, dtype=torch.uint8)).shape
        torch.Size([4, 32])
        >>> enc(torch.zeros(2, 5, 7, 7, 3, dtype=torch.uint8)).shape
        torch.Size([2, 5, 32])
    """

    def __init__(self, shape: Sequence[int], out_features: int, num_values: int = 16) -> None:
        super().__init__()
        if num_values < 2:
            raise ValueError(f"OneHotImageEncoder: num_values must be >= 2, received {num_values}.")
        self.shape = _image_shape("OneHotImageEncoder", shape)
        self.out_features = out_features
        self.num_values = int(num_values)
        entries = int(np.prod(self.shape))
        self.table = nn.Parameter(torch.randn(entries * self.num_values, out_features))
        with torch.no_grad():
            self.table.mul_(entries**-0.5)
        self.bias = nn.Parameter(torch.zeros(out_features))
        # the row of entry i's value v is i * num_values + v
        self.register_buffer("offsets", torch.arange(entries) * self.num_values, persistent=False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        _check_images("OneHotImageEncoder", self.shape, pixels)
        if pixels.is_floating_point():
            raise ValueError(
                f"OneHotImageEncoder: expected integer entries (indices), received "
                f"{pixels.dtype}. Fix: --image-encoder flat or cnn for images of numbers."
            )
        batch = pixels.shape[:-3]
        index = pixels.reshape(-1, self.offsets.numel()).long()
        if index.numel() and not torch.compiler.is_compiling():  # (export traces it)
            low, high = (int(v) for v in torch.aminmax(index))  # one read back per call
            bad = high >= self.num_values or low < 0
        else:
            bad = False
        if bad:
            raise ValueError(
                f"OneHotImageEncoder: every entry must lie in [0, {self.num_values}), "
                f"received values in [{low}, {high}]. Fix: a larger "
                f"num_values, or --image-encoder flat / cnn for images that are not indices."
            )
        cpu_grad = self.table.device.type == "cpu" and self.table.requires_grad
        if cpu_grad and torch.is_grad_enabled() and not torch.compiler.is_compiling():
            out = _OneHotSum.apply(index, self.offsets, self.table, self.num_values)
        else:
            out = F.embedding_bag(index + self.offsets, self.table, mode="sum")
        return torch.relu(out + self.bias).reshape(*batch, self.out_features)


class _OneHotSum(torch.autograd.Function):
    """``embedding_bag(index + offsets, table, mode="sum")`` with a faster CPU backward: the
    gradient of the rows of value ``v`` is ``(index == v)^T @ grad`` (one ``[E, N] x [N, F]``
    matmul per value present), less than half the time of ``embedding_bag``'s own backward
    on a CPU (``python benchmarks/grid_encoders.py``: 23 ms against 54 ms, forward included)
    and no ``N x E x num_values`` one-hot in memory. The same gradient up to the order of
    the sums (float rounding)."""

    @staticmethod
    def forward(ctx, index: Tensor, offsets: Tensor, table: Tensor, num_values: int) -> Tensor:
        ctx.save_for_backward(index)
        ctx.num_values = num_values
        return F.embedding_bag(index + offsets, table, mode="sum")

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[None, None, Tensor, None]:
        (index,) = ctx.saved_tensors
        entries = index.shape[1]
        out = grad.new_zeros(entries, ctx.num_values, grad.shape[1])
        for value in range(int(index.max()) + 1 if index.numel() else 0):
            out[:, value] = (index == value).to(grad.dtype).T @ grad
        return None, None, out.reshape(entries * ctx.num_values, -1), None


#: ``ModelConfig.image_encoder`` -> the module that turns ``"pixels"`` into features, built as
#: ``cls(shape, out_features)``: the one list of the image encoders' names
IMAGE_ENCODERS: dict[str, type[nn.Module]] = {
    "cnn": ImageEncoder,
    "flat": FlatImageEncoder,
    "onehot": OneHotImageEncoder,
}


def image_encoder(kind: str, shape: Sequence[int], out_features: int) -> nn.Module:
    """The image encoder :data:`IMAGE_ENCODERS` names ``kind``, for ``shape`` ``(H, W, C)``.

    Examples:
        >>> type(image_encoder("flat", (7, 7, 3), 8)).__name__
        'FlatImageEncoder'
        >>> image_encoder("vit", (7, 7, 3), 8)
        Traceback (most recent call last):
        ...
        ValueError: image_encoder: expected one of ['cnn', 'flat', 'onehot'], received 'vit'...
    """
    if kind not in IMAGE_ENCODERS:
        raise ValueError(
            f"image_encoder: expected one of {list(IMAGE_ENCODERS)}, received {kind!r}. Fix: "
            f"--image-encoder cnn (the default) or another of those names."
        )
    return IMAGE_ENCODERS[kind](shape, out_features)


class InputEncoder(nn.Module):
    """``(vector [*B, F], pixels [*B, H, W, C]) -> [*B, F + E]``: the vector, then the
    image features (``E = out_features``) of the ``kind`` of :data:`IMAGE_ENCODERS`
    (default: :class:`ImageEncoder`).

    Examples:
        >>> enc = InputEncoder((7, 7, 3), 16)
        >>> enc(torch.ones(3, 4), torch.zeros(3, 7, 7, 3, dtype=torch.uint8)).shape
        torch.Size([3, 20])
    """

    def __init__(self, shape: Sequence[int], out_features: int, kind: str = "cnn") -> None:
        super().__init__()
        self.image = image_encoder(kind, shape, out_features)

    def forward(self, vector: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        return torch.cat([vector, self.image(pixels).to(vector.dtype)], dim=-1)


def add_image_encoder(
    pre: list[nn.Module],
    inputs: ObsInputs,
    vector_key: str,
    out_key: str,
    features: int,
    kind: str = "cnn",
) -> tuple[list[nn.Module], str, int]:
    """Append the image encoder to the modules ``pre`` that run before a trunk.

    Args:
        pre: TensorDict modules that run first (e.g. the observation scaling).
        inputs: the env's :class:`ObsInputs`.
        vector_key: where the (scaled) vector is.
        out_key: where to write the trunk input when there is an image.
        features: ``E``, image features of the encoder.
        kind: the image encoder, a name of :data:`IMAGE_ENCODERS` (``"cnn"``, ``"flat"``).

    Returns:
        ``(modules, key, size)``: what runs before the trunk, the key the trunk reads and
        its size. Without an image: ``pre``, ``vector_key`` and ``F``. With one: ``pre`` plus
        a module writing ``out_key`` ``[*B, F + E]`` (:class:`InputEncoder`; with no vector,
        ``[*B, E]`` from the :class:`ImageEncoder` alone).

    Examples:
        >>> mods, key, size = add_image_encoder([], ObsInputs(4, (7, 7, 3)), "observation",
        ...                                     "encoded", 8)
        >>> key, size, mods[0].in_keys
        ('encoded', 12, ['observation', 'pixels'])
    """
    if inputs.image is None:
        if not inputs.vector:
            raise ValueError("add_image_encoder: the inputs have neither a vector nor an image.")
        return pre, vector_key, inputs.vector
    if inputs.vector:
        encoder = InputEncoder(inputs.image, features, kind)
        module = Mod(encoder, [vector_key, PIXELS_KEY], [out_key])
    else:
        module = Mod(image_encoder(kind, inputs.image, features), [PIXELS_KEY], [out_key])
    return [*pre, module], out_key, inputs.vector + features
