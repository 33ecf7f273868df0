"""The arguments of the tape samplers (:class:`TapeOptions`) and their checks.

:class:`~recurrl.data.samplers.TapeSampler` and
:class:`~recurrl.data.samplers.PrioritizedTapeSampler` take these arguments (the latter
without ``weight``), each sampler holding one checked :class:`TapeOptions`.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from typing import Literal

import torch
from tensordict.utils import NestedKey

from recurrl.data.samplers._slice_args import _check_key

__all__ = ["TapeOptions"]

OVERFLOW = ("cut", "drop")
WEIGHT = ("uniform", "length")


@dataclass(frozen=True, kw_only=True)
class TapeOptions:
    """The arguments of the tape samplers, checked: how episodes are found, laid on tapes
    and marked (the sections of :class:`TapeSampler` tell the rules in full).

    Fields hold the values as given, keys in canonical form (``("a",)`` is ``"a"``, lists
    are tuples).

    Args:
        frames_per_tape: steps per tape (``>= 1``). ``None``: ``batch_size // num_tapes``.
            Given, ``sample`` needs ``batch_size == num_tapes * frames_per_tape``.
        num_tapes: tapes per batch (``>= 1``).
        traj_key: int ``[*B]`` trajectory id key (default: ``("collector", "traj_ids")``,
            else ``"episode"``, when the data has it); as :class:`SliceSampler`.
        end_key: bool ``[*B, 1]`` key ending episodes (default ``("next", "done")``). With
            ids it only tells complete episodes; without ids it also cuts trajectories.
        init_key: bool key True at episode starts (``InitTracker``'s ``"is_init"``): read to
            tell episode starts and marked in the sample.
        step_key: int key counting each episode's steps (``StepCounter``'s
            ``"step_count"``): tells episode starts when the storage has no ``init_key``, and
            checks that joined pieces chain. ``None``: not read.
        truncated_key: key set True at a cut (``None``: not marked).
        overflow: what happens to the episode that does not fit: ``"cut"`` (default: cut
            to the frames left, the cut marked truncated) or ``"drop"`` (put back, the tape
            padded). See **The episode that does not fit** in :class:`TapeSampler`.
        weight: how the next episode is drawn: ``"uniform"`` (default: every complete
            episode alike) or ``"length"`` (in proportion to its length). See **Draws** in
            :class:`TapeSampler`.
        generator: random generator (default: torch's global one). Its state is part of
            the sampler's ``state_dict``, so a reloaded buffer draws the same samples.

    Examples:
        >>> TapeOptions(frames_per_tape=100, init_key=["is_init"]).init_key
        'is_init'
        >>> TapeOptions(overflow="wrap", owner="MySampler")
        Traceback (most recent call last):
        ...
        ValueError: MySampler: expected overflow to be one of ('cut', 'drop'), received 'wrap'; ...
    """

    frames_per_tape: int | None = None
    num_tapes: int = 1
    traj_key: NestedKey | None = None
    end_key: NestedKey | None = None
    init_key: NestedKey = "is_init"
    step_key: NestedKey | None = "step_count"
    truncated_key: NestedKey | None = ("next", "truncated")
    overflow: Literal["cut", "drop"] = "cut"
    weight: Literal["uniform", "length"] = "uniform"
    generator: torch.Generator | None = field(default=None, repr=False, compare=False)
    #: the sampler the arguments are checked for, named in the errors
    owner: InitVar[str] = "TapeSampler"

    def __post_init__(self, owner: str) -> None:
        for name, value in (("frames_per_tape", self.frames_per_tape),
                            ("num_tapes", self.num_tapes)):  # fmt: skip
            if value is None and name == "frames_per_tape":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{owner}: expected {name} to be an int >= 1, received {value!r}; fix: "
                    f"e.g. {name}={'1000' if name == 'frames_per_tape' else '1'}."
                )
        if self.overflow not in OVERFLOW:
            raise ValueError(
                f"{owner}: expected overflow to be one of {OVERFLOW}, received "
                f"{self.overflow!r}; fix: 'cut' (cut the last episode at the budget, marked "
                "truncated) or 'drop' (put it back, pad the tape)."
            )
        if self.weight not in WEIGHT:
            raise ValueError(
                f"{owner}: expected weight to be one of {WEIGHT}, received {self.weight!r}; "
                "fix: 'uniform' (every episode alike) or 'length' (in proportion to length)."
            )
        init_key = _check_key(owner, "init_key", self.init_key)
        if init_key is None:
            raise ValueError(
                f"{owner}: expected an init_key (episode starts are marked there for "
                "recurrent mode), received None; fix: init_key='is_init'."
            )
        checked = {
            "init_key": init_key,
            "step_key": _check_key(owner, "step_key", self.step_key),
            "truncated_key": _check_key(owner, "truncated_key", self.truncated_key),
            "end_key": _check_key(owner, "end_key", self.end_key),
            "traj_key": _check_key(owner, "traj_key", self.traj_key),
        }
        for name, value in checked.items():  # frozen: set once, here
            object.__setattr__(self, name, value)
