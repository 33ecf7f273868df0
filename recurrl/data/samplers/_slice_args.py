"""The arguments of the slice samplers (:class:`SliceOptions`), their checks and key handling.

:class:`~recurrl.data.samplers.SliceSampler`,
:class:`~recurrl.data.samplers.SliceSamplerWithoutReplacement` and
:class:`~recurrl.data.samplers.PrioritizedSliceSampler` take these arguments (the last two
without some of them), each sampler holding one checked :class:`SliceOptions`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field
from typing import Literal

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

__all__ = ["DONE_KEY", "SliceOptions"]

DONE_KEY = ("next", "done")


def _key(key: NestedKey) -> NestedKey:
    """Normalise a nested key: ``("a",)`` -> ``"a"``, lists -> tuples."""
    if isinstance(key, str):
        return key
    key = tuple(key)
    return key[0] if len(key) == 1 else key


def _positive(owner: str, name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or value <= 0):
        raise ValueError(f"{owner}: expected {name} to be a positive int, received {value!r}.")


def _is_key(key) -> bool:
    """Whether ``key`` is a nested key: a string or a non-empty tuple of strings."""
    if isinstance(key, str):
        return True
    return isinstance(key, tuple) and len(key) > 0 and all(isinstance(k, str) for k in key)


def _check_key(owner: str, name: str, key) -> NestedKey | None:
    """Validate an optional nested-key argument and normalise it."""
    if key is None:
        return None
    if isinstance(key, list):
        key = tuple(key)
    if not _is_key(key):
        raise ValueError(
            f"{owner}: expected {name} to be a key (a string or a tuple of strings) or "
            f"None, received {key!r}; fix: e.g. {name}='is_init' or {name}=('next', 'done')."
        )
    return _key(key)


def _parse_end_keys(owner: str, end_keys, end_key) -> tuple[NestedKey, ...] | None:
    """Validate ``end_keys`` (several end flags, OR-ed); exclusive with ``end_key``."""
    if end_keys is None:
        return None
    if end_key is not None:
        raise ValueError(
            f"{owner}: end_key={end_key!r} and end_keys={end_keys!r} both set the end "
            "flags, but they are exclusive; fix: pass one key as end_key, or several keys "
            "(OR-ed together) as end_keys, e.g. end_keys=[('next', 'done'), "
            "('next', 'truncated')]."
        )
    if isinstance(end_keys, str) or (
        isinstance(end_keys, tuple) and all(isinstance(k, str) for k in end_keys)
    ):
        raise ValueError(
            f"{owner}: expected end_keys to be a list of keys, received {end_keys!r}, "
            "which reads as a single (nested) key; fix: end_key="
            f"{end_keys!r} for one key, or a list such as end_keys=[('next', 'done'), "
            "('next', 'truncated')]."
        )
    if not isinstance(end_keys, (list, tuple)) or not end_keys:
        raise ValueError(
            f"{owner}: expected end_keys to be a non-empty list of keys, received "
            f"{end_keys!r}; fix: e.g. end_keys=[('next', 'done'), ('next', 'truncated')]."
        )
    keys = []
    for key in end_keys:
        key = tuple(key) if isinstance(key, list) else key
        if not _is_key(key):
            raise ValueError(
                f"{owner}: expected every entry of end_keys to be a key (a string or a "
                f"tuple of strings), received {key!r} in end_keys={end_keys!r}; fix: e.g. "
                "end_keys=[('next', 'done'), ('next', 'truncated')]."
            )
        key = _key(key)
        if key not in keys:
            keys.append(key)
    return tuple(keys)


def _parse_span(owner: str, span) -> tuple[int | None, int | None] | None:
    """``span`` -> ``(left, right)``: per side, how many steps a slice cut by the trajectory
    start (left) / end (right) may lack (``None``: the side does not span; ``-1``: all but
    one). ``None`` when neither side spans."""

    def side(value) -> int | None:
        if isinstance(value, bool):
            return -1 if value else None
        if isinstance(value, int) and value >= 0:
            return value or None
        raise ValueError(
            f"{owner}: expected span to be a bool, a non-negative int or a pair of them, "
            f"received span={span!r}; fix: e.g. span=True, span=2 or span=(True, False)."
        )

    pair = tuple(span) if isinstance(span, (tuple, list)) else (span, span)
    if len(pair) != 2:
        side(object())  # raises the error above
    left, right = side(pair[0]), side(pair[1])
    return None if left is None and right is None else (left, right)


def _given_boundaries(owner: str, ends, trajectories, end_key, traj_key,
                      end_keys=None) -> tuple[str, Tensor] | None:  # fmt: skip
    """Validate ``ends=`` / ``trajectories=``; return ``(mode, [n] tensor)`` or ``None``."""
    if ends is None and trajectories is None:
        return None
    if ends is not None and trajectories is not None:
        raise ValueError(
            f"{owner}: expected at most one of ends / trajectories, received both; fix: "
            "pass the trajectory ids (trajectories=) or the end flags (ends=)."
        )
    if end_key is not None or traj_key is not None or end_keys is not None:
        raise ValueError(
            f"{owner}: ends= / trajectories= give the boundaries directly, so end_key="
            f"{end_key!r} / end_keys={end_keys!r} / traj_key={traj_key!r} would be ignored; "
            "fix: drop the keys."
        )
    mode, value = ("end", ends) if ends is not None else ("traj", trajectories)
    name = "ends" if mode == "end" else "trajectories"
    if not isinstance(value, Tensor) or value.dim() != 1:
        raise ValueError(
            f"{owner}: expected {name} to be a 1-D tensor over the stored steps, received "
            f"{type(value).__name__}{tuple(getattr(value, 'shape', ()))}; fix: pass one value "
            "per storage position."
        )
    if mode == "end" and value.dtype != torch.bool:
        raise ValueError(
            f"{owner}: expected ends to be a bool tensor, received dtype {value.dtype}; "
            "fix: pass ends.bool()."
        )
    if mode == "traj" and (value.dtype.is_floating_point or value.dtype == torch.bool):
        raise ValueError(
            f"{owner}: expected trajectories to be an integer tensor, received dtype "
            f"{value.dtype}; fix: pass trajectories.long()."
        )
    return mode, value.detach().cpu()


def _check_fragmented(owner: str, step_key, end_key, end_keys, ends, trajectories) -> None:
    """``fragmented=True`` rebuilds trajectories from ids and step numbers only."""
    if step_key is None:
        raise ValueError(
            f"{owner}: fragmented=True orders every trajectory's steps by their step "
            "number, read from step_key, but step_key=None; fix: pass the key holding the "
            "per-trajectory step count, e.g. step_key='step_count' (StepCounter's key)."
        )
    if ends is not None or trajectories is not None:
        raise ValueError(
            f"{owner}: fragmented=True rebuilds trajectories from the stored ids and step "
            "numbers, so ends= / trajectories= (boundaries in storage order) cannot be used; "
            "fix: store the ids and steps and pass traj_key= / step_key=, or drop fragmented."
        )
    if end_key is not None or end_keys is not None:
        raise ValueError(
            f"{owner}: fragmented=True reads trajectory ids and step numbers only, so "
            f"end_key={end_key!r} / end_keys={end_keys!r} would be ignored; fix: drop them "
            "(a gap in the step numbers already ends a run)."
        )


def _integer_leaf(data: TensorDictBase, key: NestedKey, name: str, n: int) -> Tensor:
    """``[n]`` int64 values of a scalar-per-step integer entry (fragmented mode)."""
    value = data.get(key)
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise ValueError(
            f"SliceSampler(fragmented=True): expected {name}={key!r} to hold integers, "
            f"received dtype {value.dtype}; fix: store it as an integer tensor."
        )
    if value.numel() != n:
        raise ValueError(
            f"SliceSampler(fragmented=True): expected {name}={key!r} to hold one value per "
            f"step ({n}), received shape {tuple(value.shape)}; fix: store a scalar per step."
        )
    return value.reshape(n).to("cpu", torch.int64)


START_MODES = ("any", "trajectory", "stride")


def _parse_start(owner: str, start, start_stride) -> tuple[str, int | None]:
    """Validate ``start`` (where slices may begin) and ``start_stride`` (its period)."""
    if start not in START_MODES:
        raise ValueError(
            f"{owner}: expected start to be one of {START_MODES}, received {start!r}; fix: "
            "start='any' (anywhere in a trajectory), 'trajectory' (only at its first step) or "
            "'stride' (every start_stride steps from its first step)."
        )
    if start_stride is not None and start != "stride":
        raise ValueError(
            f"{owner}: start_stride={start_stride!r} sets the period of start='stride', "
            f"but start={start!r}; fix: pass start='stride', or drop start_stride."
        )
    if start_stride is not None and (
        isinstance(start_stride, bool) or not isinstance(start_stride, int) or start_stride <= 0
    ):
        raise ValueError(
            f"{owner}: expected start_stride to be a positive int (or None: slice_len // 2, "
            f"R2D2's overlapping sequences), received {start_stride!r}; fix: e.g. "
            "start_stride=40 for slice_len=80."
        )
    return start, start_stride


@dataclass(frozen=True, kw_only=True)
class SliceOptions:
    """The arguments of the slice samplers, checked: how trajectories are found and how
    slices are cut from them, drawn and marked (the sections of :class:`SliceSampler` tell
    the rules in full).

    Fields hold the values as given, keys in canonical form (``("a",)`` is ``"a"``, lists
    are tuples) and ``end_keys`` as a tuple; ``sides`` (from ``span``) and ``given`` (from
    ``ends`` / ``trajectories``) are derived.

    Args:
        num_slices: number of slices per batch. Exactly one of ``num_slices`` /
            ``slice_len`` is given; the other is ``batch_size // given``.
        slice_len: steps per slice.
        end_key: boolean ``[*B, 1]`` key ending trajectories. Default ``("next", "done")``.
            Exclusive with ``end_keys``.
        end_keys: a list of boolean ``[*B, 1]`` keys, OR-ed: a step ends a trajectory when
            any of them is True (e.g. ``[("next", "done"), ("next", "truncated")]`` for data
            whose truncations are not copied into ``done``). Keys the data lacks are
            skipped; at least one must be stored. Exclusive with ``end_key``; reported as
            given in ``end_keys`` (``end_key`` stays None).
        traj_key: int ``[*B]`` trajectory id key. Default: ``("collector", "traj_ids")``,
            else ``"episode"``, when the data has it. With ``end_key`` also given, ids are
            preferred and end flags the fallback (**Trajectories** in :class:`SliceSampler`).
        step_key: int ``[*B]`` key counting each trajectory's steps (default
            ``"step_count"``, :class:`StepCounter`'s key); read only with ``fragmented=True``
            (as in the reference), otherwise just reported.
        fragmented: rebuild trajectories from ``(traj_key, step_key)`` instead of storage
            order: the stored steps are sorted by (id, step) and a run of one id whose step
            numbers count up by one is a segment, wherever its steps lie (interleaved
            writers, rows of different batches). A missing step splits a run; a repeated
            (id, step) pair is an error. Needs trajectory ids (given or detected) and
            refuses ``end_key`` / ``end_keys`` / ``ends`` / ``trajectories``. Runs are
            rebuilt (a sort, ``O(n log n)``) at the first sample after each write.
        ends: ``[len(storage)]`` bool end flags, one per stored position (instead of a key).
        trajectories: ``[len(storage)]`` int ids, one per stored position (instead of a key).
        cache_values: accepted for API compatibility; boundaries are always cached.
        truncated_key: key set True at slice ends (``None``: do not mark).
        init_key: key set True at slice starts, OR-ed with the stored flags, when the
            storage holds it (the key ``InitTracker`` writes; ``None``: do not mark). Marks
            only, never boundaries (as in the reference). Must differ from ``truncated_key``
            and ``("next", "done")``.
        strict_length: True (default): whole slices of ``slice_len`` steps only; False:
            also the whole of every segment shorter than ``slice_len`` (output ragged). See
            **Slices** in :class:`SliceSampler`.
        compile: accepted and ignored: sampling is index arithmetic over a few cached host
            arrays (one entry per segment), with nothing to compile.
        span: windows of ``slice_len`` steps may also hang over the trajectory start (left)
            and/or end (right), keeping only their steps inside it (output ragged).
            ``True``: at least one step kept; an int ``i``: at least ``slice_len - i``; a
            pair sets (left, right) separately. Default ``False``. See **Slices** in
            :class:`SliceSampler`.
        use_gpu: accepted and ignored, as ``compile``: there is nothing to offload.
        pad_output: return exactly ``[num_slices * slice_len]`` steps, each slice padded to
            ``slice_len`` and ``("collector", "mask")`` True on real steps; needs
            ``strict_length=False`` (whole slices need no padding). See **Padding** in
            :class:`SliceSampler`.
        replacement: True (default): slice starts drawn independently; False: each valid
            start at most once per epoch, as :class:`SliceSamplerWithoutReplacement`
            (``drop_last``, ``shuffle``).
        drop_last: (sampling without replacement only) if True, a call that would get
            fewer than ``num_slices`` starts begins a new epoch instead; if False (default)
            it returns the remaining, smaller batch.
        shuffle: (sampling without replacement only) if True (default) an epoch visits the
            valid starts in random order; if False in storage order (oldest segment first).
        generator: random generator (default: torch's global one). Its state is part of
            the sampler's ``state_dict``, so a reloaded buffer draws the same samples.
        min_slice_len: fewest steps a slice may have, ``1 <= min_slice_len <= slice_len``
            (``None``: ``slice_len``, whole slices only); below ``slice_len`` it needs
            ``strict_length=False``. Exclusive with ``span`` (``min_slice_len=m`` is
            ``span=(False, slice_len - m)``). See **Slices** in :class:`SliceSampler`.
        start: ``"any"`` (default), ``"trajectory"`` or ``"stride"``: where slices may
            start in a segment: anywhere, only at its first stored step, or every
            ``start_stride`` steps from it. See **Slices** in :class:`SliceSampler`.
        start_stride: period of ``start="stride"``, in steps (``None``: ``slice_len // 2``,
            at least 1); only with ``start="stride"``.

    Examples:
        >>> options = SliceOptions(slice_len=8, end_keys=[["next", "done"]], span=True)
        >>> options.end_keys, options.sides
        ((('next', 'done'),), (-1, -1))
        >>> SliceOptions(slice_len=8, strict_length=False, span=True, min_slice_len=2,
        ...              owner="MySampler")
        Traceback (most recent call last):
        ...
        ValueError: MySampler: span=True and min_slice_len=2 both set how short a slice cut ...
    """

    num_slices: int | None = None
    slice_len: int | None = None
    end_key: NestedKey | None = None
    end_keys: Sequence[NestedKey] | None = None
    traj_key: NestedKey | None = None
    step_key: NestedKey | None = "step_count"
    fragmented: bool = False
    ends: Tensor | None = field(default=None, repr=False, compare=False)
    trajectories: Tensor | None = field(default=None, repr=False, compare=False)
    cache_values: bool = False
    truncated_key: NestedKey | None = ("next", "truncated")
    init_key: NestedKey | None = "is_init"
    strict_length: bool = True
    compile: bool | dict = False
    span: bool | int | tuple[bool | int, bool | int] = False
    use_gpu: bool | torch.device | str = False
    pad_output: bool = False
    replacement: bool = True
    drop_last: bool | None = None
    shuffle: bool | None = None
    generator: torch.Generator | None = field(default=None, repr=False, compare=False)
    min_slice_len: int | None = None
    start: Literal["any", "trajectory", "stride"] = "any"
    start_stride: int | None = None
    #: the sampler the arguments are checked for, named in the errors
    owner: InitVar[str] = "SliceSampler"
    #: ``span`` per side: how many steps a window cut by the trajectory start (left) / end
    #: (right) may lack (``None``: that side does not span; ``-1``: all but one); ``None``
    #: when neither side spans
    sides: tuple[int | None, int | None] | None = field(init=False, compare=False)
    #: ``(mode, [n] tensor)`` of ``ends=`` (``"end"``) / ``trajectories=`` (``"traj"``),
    #: else ``None``
    given: tuple[str, Tensor] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self, owner: str) -> None:
        _parse_start(owner, self.start, self.start_stride)
        self._check_shape(owner)
        sides = _parse_span(owner, self.span)
        if sides is not None and self.min_slice_len is not None:
            raise ValueError(
                f"{owner}: span={self.span!r} and min_slice_len={self.min_slice_len} both set "
                "how short a slice cut at a trajectory end may be; fix: give only one of them "
                "(min_slice_len=m is span=(False, slice_len - m))."
            )
        end_keys = _parse_end_keys(owner, self.end_keys, self.end_key)
        if self.fragmented:
            _check_fragmented(owner, self.step_key, self.end_key, end_keys, self.ends,
                              self.trajectories)  # fmt: skip
        given = _given_boundaries(owner, self.ends, self.trajectories, self.end_key,
                                  self.traj_key, end_keys)  # fmt: skip
        truncated_key = _check_key(owner, "truncated_key", self.truncated_key)
        init_key = _check_key(owner, "init_key", self.init_key)
        if init_key is not None and init_key in (truncated_key, DONE_KEY):
            raise ValueError(
                f"{owner}: init_key={init_key!r} names the entry marked at slice ends "
                f"(truncated_key={truncated_key!r}, or ('next', 'done')), but it is marked at "
                "slice starts; fix: pass distinct keys (default init_key='is_init')."
            )
        if self.replacement and (self.drop_last is not None or self.shuffle is not None):
            raise ValueError(
                f"{owner}: drop_last={self.drop_last!r} / shuffle={self.shuffle!r} apply to "
                "sampling without replacement only; fix: pass replacement=False (or use "
                "SliceSamplerWithoutReplacement), or drop them."
            )
        checked = {
            "end_key": _check_key(owner, "end_key", self.end_key),
            "traj_key": _check_key(owner, "traj_key", self.traj_key),
            "step_key": _check_key(owner, "step_key", self.step_key),
            "end_keys": end_keys, "truncated_key": truncated_key, "init_key": init_key,
            "fragmented": bool(self.fragmented), "replacement": bool(self.replacement),
            "sides": sides, "given": given,
        }  # fmt: skip
        for name, value in checked.items():  # frozen: set once, here
            object.__setattr__(self, name, value)

    def _check_shape(self, owner: str) -> None:
        """``num_slices`` / ``slice_len`` / ``min_slice_len`` and the length rules."""
        num_slices, slice_len, min_slice_len = self.num_slices, self.slice_len, self.min_slice_len
        if (num_slices is None) == (slice_len is None):
            raise ValueError(
                f"{owner}: expected exactly one of num_slices / slice_len, received "
                f"num_slices={num_slices}, slice_len={slice_len}; fix: give one, the other is "
                "batch_size // it."
            )
        _positive(owner, "num_slices", num_slices)
        _positive(owner, "slice_len", slice_len)
        _positive(owner, "min_slice_len", min_slice_len)
        if min_slice_len is not None and slice_len is not None and min_slice_len > slice_len:
            raise ValueError(
                f"{owner}: expected min_slice_len <= slice_len, received min_slice_len="
                f"{min_slice_len}, slice_len={slice_len}; fix: lower min_slice_len."
            )
        if min_slice_len is not None and self.strict_length and min_slice_len != slice_len:
            raise ValueError(
                f"{owner}: min_slice_len={min_slice_len} allows slices shorter than "
                f"slice_len, but strict_length=True asks for whole slices only; fix: pass "
                "strict_length=False."
            )
        if self.pad_output and self.strict_length:
            raise ValueError(
                f"{owner}: pad_output=True pads slices shorter than slice_len, but "
                "strict_length=True (the default) only returns whole slices, so there would "
                "be nothing to pad; fix: pass strict_length=False with pad_output=True, or "
                "drop pad_output."
            )
