"""ObservationNorm: an affine map of observations, with statistics from the env itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import NestedKey

from recurrl.envs.specs import Bounded, TensorSpec, Unbounded
from recurrl.envs.transforms._per_key import PerKeyObservationTransform, as_keys
from recurrl.envs.transforms.transform import Compose, Transform, TransformedEnv

__all__ = ["ObservationNorm"]

_STATS = ("loc", "scale")


def _dims(dims: int | Sequence[int], ndim: int, what: str) -> list[int]:
    """``dims`` as sorted negative dims of a tensor with ``ndim`` dims."""
    dims = [dims] if isinstance(dims, int) else list(dims)
    out = []
    for d in dims:
        if not -ndim <= d < ndim:
            raise ValueError(
                f"ObservationNorm.init_stats: {what} {d} is out of range for the collected "
                f"data of {ndim} dims."
            )
        out.append(d - ndim if d >= 0 else d)
    return sorted(set(out))


class ObservationNorm(PerKeyObservationTransform):
    """Normalize observations: ``obs * scale + loc``, or ``(obs - loc) / scale``.

    With ``standard_normal=False`` (default) the map is ``obs * scale + loc``; with
    ``standard_normal=True`` it is ``(obs - loc) / scale`` (standardization), as in the
    reference. ``loc`` and ``scale`` are given, or computed from the env by
    :meth:`init_stats` (mean and standard deviation of random rollouts), so that the
    normalized observations have about zero mean and unit variance either way. Until then
    the transform raises on use (``RuntimeError``), and the observation spec is
    ``Unbounded``; once the statistics exist, a ``Bounded`` input spec has its bounds mapped.

    Args:
        loc: location (a number or a tensor broadcastable to the observation), or ``None``
            (with ``scale=None``) for :meth:`init_stats`.
        scale: scale (``> 0``), or ``None`` (with ``loc=None``).
        in_keys: the observations to normalize (required, as in the reference).
        out_keys: where to write them. Default ``in_keys``.
        in_keys_inv: not supported (only ``None``): recurrl transforms do not rewrite the
            actions the policy writes.
        out_keys_inv: as ``in_keys_inv``.
        standard_normal: ``(obs - loc) / scale`` instead of ``obs * scale + loc``.
        eps: smallest ``scale`` (and standard deviation) used by :meth:`init_stats`.
            Default: the machine epsilon of a floating ``scale`` tensor, else ``1e-6``.

    Examples:
        >>> import torch
        >>> from recurrl.envs import GymEnv, TransformedEnv
        >>> env = TransformedEnv(GymEnv("CartPole-v1", seed=0),
        ...                      ObservationNorm(loc=1.0, scale=2.0, in_keys=["observation"]))
        >>> raw = GymEnv("CartPole-v1", seed=0).reset()["observation"]
        >>> torch.allclose(env.reset()["observation"], raw * 2.0 + 1.0)
        True

        The statistics from the env (here 200 random steps), per feature:

        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> norm = ObservationNorm(in_keys=["observation"], standard_normal=True)
        >>> env = TransformedEnv(GymEnv("CartPole-v1", seed=0), norm)
        >>> norm.init_stats(200)
        >>> norm.loc.shape, norm.scale.shape
        (torch.Size([4]), torch.Size([4]))
    """

    def __init__(
        self,
        loc: float | torch.Tensor | None = None,
        scale: float | torch.Tensor | None = None,
        in_keys: NestedKey | Sequence[NestedKey] | None = None,
        out_keys: NestedKey | Sequence[NestedKey] | None = None,
        in_keys_inv: Sequence[NestedKey] | None = None,
        out_keys_inv: Sequence[NestedKey] | None = None,
        standard_normal: bool = False,
        eps: float | None = None,
    ) -> None:
        if in_keys is None:
            raise ValueError(
                "ObservationNorm: in_keys is required (the observations to normalize), as in "
                "the reference. Fix: ObservationNorm(..., in_keys=['observation'])."
            )
        if in_keys_inv or out_keys_inv:
            raise ValueError(
                "ObservationNorm: in_keys_inv / out_keys_inv (normalizing inputs the policy "
                "writes) are not supported; received "
                f"in_keys_inv={in_keys_inv}, out_keys_inv={out_keys_inv}."
            )
        if (loc is None) != (scale is None):
            raise ValueError(
                "ObservationNorm: expected loc and scale both given or both None (None: "
                f"computed by init_stats()), received loc={loc!r}, scale={scale!r}."
            )
        super().__init__(as_keys(in_keys, ()), out_keys)
        if eps is None:
            floating = isinstance(scale, torch.Tensor) and scale.dtype.is_floating_point
            eps = torch.finfo(scale.dtype).eps if floating else 1e-6
        self.eps = float(eps)
        self.register_buffer("standard_normal", torch.as_tensor(bool(standard_normal)))
        for name, value in zip(_STATS, (loc, scale), strict=True):
            if value is not None and not isinstance(value, torch.Tensor):
                value = torch.tensor(value, dtype=torch.get_default_dtype())
            self.register_buffer(name, value)
        if scale is not None and not bool((self.scale > 0).all()):
            raise ValueError(
                f"ObservationNorm: expected scale > 0, received {scale!r}. A negative or zero "
                f"scale would flip or erase the observation."
            )

    @property
    def initialized(self) -> bool:
        """Whether ``loc`` and ``scale`` exist (given, loaded or computed)."""
        return self.loc is not None

    def _apply_transform(self, observation: torch.Tensor) -> torch.Tensor:
        if not self.initialized:
            raise RuntimeError(
                f"ObservationNorm: loc/scale of {self.in_keys} are not set yet. Fix: pass loc= "
                f"and scale=, call transform.init_stats(num_iter) once the transform is in "
                f"its env, or load_state_dict() a saved one."
            )
        loc = self.loc.to(observation.device)
        scale = self.scale.to(observation.device)
        if bool(self.standard_normal):
            return (observation - loc) / scale
        return observation * scale + loc

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        if not self.initialized or not isinstance(spec, Bounded):
            # bounds unknown until the statistics exist; the shape and dtype do not change
            return Unbounded(spec.shape, device=spec.device, dtype=spec.dtype)
        low, high = self._apply_transform(spec.low), self._apply_transform(spec.high)
        if low.shape != spec.shape:
            raise ValueError(
                f"ObservationNorm: loc/scale of shape {list(self.loc.shape)} change the "
                f"observation's shape {list(spec.shape)} to {list(low.shape)}; they must "
                f"broadcast to it."
            )
        low, high = torch.minimum(low, high), torch.maximum(low, high)
        return Bounded(low, high, shape=spec.shape, device=spec.device, dtype=spec.dtype)

    def init_stats(
        self,
        num_iter: int,
        reduce_dim: int | Sequence[int] = 0,
        cat_dim: int | None = None,
        key: NestedKey | None = None,
        keep_dims: Sequence[int] | None = None,
    ) -> None:
        """Set ``loc`` and ``scale`` from random rollouts of the env up to this transform.

        As the reference does: the env made of the base env and the transforms *before* this
        one (not this one, nor those after it) runs random-action rollouts
        (``rollout(max_steps=num_iter)``, each stopping at the first done) until at least
        ``num_iter`` steps are collected; the observations ``key`` of the steps are
        concatenated along ``cat_dim``, and their mean and standard deviation over
        ``reduce_dim`` become ``loc`` / ``scale`` (``standard_normal=True``), or ``-mean /
        std`` / ``1 / std`` (``False``), so that the output is standardized in both cases.
        The reduced dims are dropped, except those in ``keep_dims`` (kept with size 1). The
        base env is left mid-episode: reset it afterwards.

        Args:
            num_iter: number of steps to collect (at least).
            reduce_dim: dim(s) of the collected ``[steps, *obs]`` data to reduce over.
            cat_dim: dim along which the rollouts are concatenated; must be one of
                ``reduce_dim``. Default: ``reduce_dim`` when it is one int.
            key: the observation to read. Default: ``in_keys[0]`` (required with several).
            keep_dims: reduced dims kept with size 1 in ``loc`` / ``scale``.

        Raises:
            RuntimeError: the statistics exist already, or an ``ObservationNorm`` before
                this one has none yet.
            ValueError: no parent env, or inconsistent dims.
        """
        if cat_dim is None:
            if not isinstance(reduce_dim, int):
                raise ValueError(
                    "ObservationNorm.init_stats: cat_dim is required when reduce_dim is not "
                    f"one int (received reduce_dim={reduce_dim!r})."
                )
            cat_dim = reduce_dim
        reduce_list = [reduce_dim] if isinstance(reduce_dim, int) else list(reduce_dim)
        if cat_dim not in reduce_list:
            raise ValueError(
                f"ObservationNorm.init_stats: cat_dim={cat_dim} must be one of reduce_dim="
                f"{reduce_dim!r} (the rollouts are concatenated along a reduced dim)."
            )
        if self.initialized:
            raise RuntimeError(
                "ObservationNorm.init_stats: loc/scale are set already. Fix: build a new "
                "ObservationNorm (loc=None, scale=None) to recompute them."
            )
        if key is None:
            if len(self.in_keys) > 1:
                raise ValueError(
                    f"ObservationNorm.init_stats: the transform has several in_keys "
                    f"{self.in_keys}; pass key= (the one to compute the statistics of)."
                )
            key = self.in_keys[0]
        env = self._env_before()
        collected, parts = 0, []
        while collected < num_iter:
            data = env.rollout(max_steps=num_iter)
            collected += data.numel()
            parts.append(data.get(key))
        data = torch.cat(parts, cat_dim)
        reduce = _dims(reduce_list, data.dim(), "reduce_dim")
        keep = [] if keep_dims is None else _dims(keep_dims, data.dim(), "keep_dims")
        if any(d not in reduce for d in keep):
            raise ValueError(
                f"ObservationNorm.init_stats: keep_dims={keep_dims!r} must be among "
                f"reduce_dim={reduce_dim!r}."
            )
        loc = data.mean(reduce, keepdim=True)
        scale = data.std(reduce, keepdim=True)
        squeeze = tuple(d for d in reduce if d not in keep)
        loc, scale = loc.squeeze(squeeze), scale.squeeze(squeeze)
        if not bool(self.standard_normal):
            scale = 1 / scale.clamp_min(self.eps)
            loc = -loc * scale
        if not (torch.isfinite(loc).all() and torch.isfinite(scale).all()):
            raise RuntimeError(
                f"ObservationNorm.init_stats: non-finite statistics of {key!r} (loc {loc}, "
                f"scale {scale}); the collected observations hold inf or nan."
            )
        self.loc = loc.contiguous()
        self.scale = scale.clamp_min(self.eps).contiguous()
        parent = self.parent
        if parent is not None:
            parent._invalidate_specs()  # the observation spec gets its bounds now

    def _env_before(self) -> TransformedEnv:
        """The base env with clones of the transforms before this one (its own env)."""
        parent = self._require_parent("init_stats (it runs the env)")
        before: list[Transform] = []
        for t in _leaves(parent.transform):
            if t is self:
                break
            if isinstance(t, ObservationNorm) and not t.initialized:
                raise RuntimeError(
                    "ObservationNorm.init_stats: an ObservationNorm before this one has no "
                    "loc/scale yet. Fix: call init_stats() on the earlier one first."
                )
            before.append(t)
        return TransformedEnv(parent.base_env, Compose(*(t.clone() for t in before)))

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # an ObservationNorm built for init_stats() (loc=None) takes saved statistics
        for name in _STATS:
            if self._buffers.get(name) is None and prefix + name in state_dict:
                self._buffers[name] = state_dict[prefix + name].detach().clone()
        super()._load_from_state_dict(state_dict, prefix, *args)
        if self.parent is not None:
            self.parent._invalidate_specs()

    def extra_repr(self) -> str:
        stats = ""
        if self.initialized and self.loc.numel() == 1 and self.scale.numel() == 1:
            stats = f"loc={float(self.loc):.4f}, scale={float(self.scale):.4f}, "
        return f"{stats}in_keys={self.in_keys}, standard_normal={bool(self.standard_normal)}"


def _leaves(transform: Transform) -> list[Transform]:
    if isinstance(transform, Compose):
        return [leaf for t in transform.transforms for leaf in _leaves(t)]
    return [transform]
