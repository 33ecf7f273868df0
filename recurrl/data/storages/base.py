"""The storage contract: a flat ``[max_size]`` TensorDict, written at given positions."""

from __future__ import annotations

from pathlib import Path

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from recurrl.data._files import load_state_file, load_tensordict

__all__ = ["Storage"]

Index = Tensor | slice | int


class Storage:
    """A fixed-capacity flat TensorDict of ``max_size`` steps, allocated from the first data.

    Subclasses implement :meth:`_allocate` (how the ``[max_size]`` TensorDict is created);
    everything else (writing, reading, saving) is shared. Positions are written by a writer
    (:class:`~recurrl.data.RoundRobinWriter`), which makes the storage a ring: once full,
    new steps overwrite the oldest ones.

    **2-D layout** (``ndim=2``, as the reference's storages): the storage holds rows of
    ``T`` steps, ``T`` taken from the first ``[N, T]`` batch written; ``max_size`` counts
    steps (frames), so it holds ``max_size // T`` rows and its capacity becomes
    ``max_size = (max_size // T) * T`` at the first write. Every write must be ``[N, T]``
    with the same ``T`` (leading dims are flattened into rows); each env's ``T`` steps fill
    one row and the oldest rows are overwritten first. Positions stay flat (row-major,
    ``row * T + t``), so samplers and ``len`` count steps; :attr:`shape` is ``[rows, T]``
    and ``storage.data.reshape(storage.shape)`` is the 2-D view.

    Args:
        max_size: capacity in steps (> 0).
        device: device of the stored tensors.
        ndim: ``1`` (a ring of steps, default) or ``2`` (a ring of ``[T]`` rows, see above).

    Attributes:
        cursor: position after the last one written (where the next write starts).
        write_count: total number of steps ever written (lets samplers detect writes they
            were not told about).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.data import LazyTensorStorage
        >>> storage = LazyTensorStorage(3)
        >>> storage.set(torch.tensor([2, 0]), TensorDict({"x": torch.tensor([5, 6])}, [2]))
        >>> len(storage), storage.cursor, storage.get(torch.tensor([0, 2]))["x"]
        (3, 1, tensor([6, 5]))
    """

    def __init__(self, max_size: int, *, device: torch.device | str = "cpu", ndim: int = 1) -> None:
        if not isinstance(max_size, int) or max_size <= 0:
            raise ValueError(
                f"{type(self).__name__}: expected max_size to be a positive int, received "
                f"{max_size!r}."
            )
        if ndim not in (1, 2):
            raise ValueError(
                f"{type(self).__name__}: expected ndim 1 (steps) or 2 ([rows, T]), received "
                f"ndim={ndim!r}; fix: flatten extra leading dims into rows (they are read "
                "row-major) and use ndim=2."
            )
        self.max_size = max_size
        self.ndim = ndim
        self.requested_size = max_size  # max_size before a 2-D layout rounds it to rows
        self.row_len: int | None = None  # T of a 2-D storage, from the first write
        self.device = torch.device(device)
        self._set_data(None)
        self._len = 0
        self.cursor = 0
        self.write_count = 0

    # -- subclass hook -------------------------------------------------------------------
    def _allocate(self, template: TensorDictBase) -> TensorDictBase:
        """Return a ``[max_size]`` TensorDict with the keys, dtypes and shapes of ``template``
        (a single step, batch size ``[]``)."""
        raise NotImplementedError(
            f"Storage subclasses implement _allocate(template); {type(self).__name__} does not."
        )

    # -- contract ------------------------------------------------------------------------
    def check_write(self, data: TensorDictBase) -> None:
        """Validate a batch about to be written (before any trimming or flattening); a 2-D
        storage fixes its row length ``T`` and capacity from the first batch."""
        if self.ndim == 1:
            return
        name = type(self).__name__
        if data.batch_dims < 2:
            raise ValueError(
                f"{name}(ndim=2): expected data with batch [N, T] (N envs, T steps, one row "
                f"each), received batch_size {list(data.batch_size)}; fix: write collector "
                "batches [N, T] (unsqueeze(0) a single env's [T]), or use ndim=1."
            )
        steps = data.batch_size[-1]
        if self.row_len is None:
            self._set_row_len(steps)
        elif steps != self.row_len:
            raise ValueError(
                f"{name}(ndim=2): expected rows of T={self.row_len} steps (the first batch's), "
                f"received batch_size {list(data.batch_size)}; fix: keep frames_per_batch / "
                "num_envs fixed, or use ndim=1 for batches of varying length."
            )

    def _set_row_len(self, steps: int) -> None:
        rows = self.requested_size // steps
        if rows == 0:
            raise ValueError(
                f"{type(self).__name__}(ndim=2): max_size={self.requested_size} steps cannot "
                f"hold one row of T={steps} steps; fix: max_size >= T (it counts steps)."
            )
        self.row_len, self.max_size = int(steps), int(rows * steps)

    @property
    def shape(self) -> torch.Size:
        """``[max_size]``, or ``[rows, T]`` for a 2-D storage (once ``T`` is known)."""
        if self.row_len is None:
            return torch.Size([self.max_size])
        return torch.Size([self.max_size // self.row_len, self.row_len])

    def __len__(self) -> int:
        return self._len

    @property
    def initialized(self) -> bool:
        """Whether the storage has been allocated (first data seen)."""
        return self._data is not None

    @property
    def data(self) -> TensorDictBase:
        """The ``[max_size]`` TensorDict (positions ``>= len(self)`` are zeros)."""
        if self._data is None:
            raise RuntimeError(
                f"{type(self).__name__}: the storage is empty (it is allocated from the first "
                "data written); fix: extend the buffer before reading it."
            )
        return self._data

    def set(self, index: Index, data: TensorDictBase) -> None:
        """Write ``data`` at ``index`` (a slice or ``[n]`` int64 positions).

        ``data`` has batch ``[n]``, or ``[*B]`` with ``prod(B) = n``, read in row-major order
        (for ``[N, T]``: env 0's ``T`` steps, then env 1's, ...), without building a
        flattened TensorDict.
        """
        bd = data.batch_dims
        if bd == 0:
            raise ValueError(
                f"{type(self).__name__}.set: expected data with batch dims [n] or [*B], "
                "received batch_size []; fix: unsqueeze a single step to batch [1]."
            )
        n = data.batch_size.numel()
        if self._data is None:
            self._set_data(self._allocate(data.reshape(n)[0].to(self.device)))
        # Leaf by leaf into cached views of the stored tensors: the same copies as
        # TensorDict.__setitem__, without its per-call validation and without flattening a
        # [N, T] TensorDict first (extend's hot path).
        items = list(data.items(include_nested=True, leaves_only=True))
        leaves = self._leaves
        if len(items) != len(leaves) or any(key not in leaves for key, _ in items):
            raise ValueError(self._mismatch(data))
        try:
            for key, value in items:
                leaf = leaves[key]
                if value.shape[bd:] != leaf.shape[1:]:  # no silent broadcasting
                    raise RuntimeError(key)
                leaf[index] = value.reshape(n, *leaf.shape[1:]) if bd > 1 else value
        except RuntimeError as err:
            raise ValueError(self._mismatch(data)) from err
        if isinstance(index, slice):
            _, high, _ = index.indices(self.max_size)
            last = high - 1
        else:
            flat = torch.as_tensor(index).reshape(-1)
            if flat.numel() == 0:
                return
            last, high = int(flat[-1]), int(flat.max()) + 1
        self._len = max(self._len, high)
        self.cursor = (last + 1) % self.max_size
        self.write_count += n

    def _set_data(self, data: TensorDictBase | None) -> None:
        self._data = data
        self._leaves = {} if data is None else dict(data.items(True, True))
        self._gather_plan = None if data is None else _gather_plan(data)

    def _mismatch(self, data: TensorDictBase) -> str:
        return (
            f"{type(self).__name__}.set: data does not match the stored layout. Expected "
            f"keys/shapes {_layout(self._data)}, received {_layout(data)}; fix: write "
            "TensorDicts with the same keys, per-step shapes and dtypes every time."
        )

    def leaf(self, key) -> Tensor | None:
        """The stored ``[max_size, *F]`` tensor of ``key`` (``None`` if there is none)."""
        return self._leaves.get(key)

    def get(self, index: Index) -> TensorDictBase:
        """Read the steps at ``index``: a TensorDict of batch ``[n]``.

        A ``[n]`` int64 tensor of positions (what samplers return) is read with one
        ``index_select`` per stored tensor, into a TensorDict built without re-validating
        the stored layout; the result equals ``storage.data[index]``. Any other index, and a
        layout this does not cover (names, non-tensor leaves, nested batch dims), goes
        through ``storage.data[index]``. Like :meth:`set`, the gather uses the stored tensors
        cached at allocation: they are written in place, never replaced.
        """
        plan = self._gather_plan
        if plan is not None and type(index) is Tensor and index.dim() == 1 \
                and index.dtype == torch.int64:  # fmt: skip
            if index.device != self.device:
                index = index.to(self.device)
            try:
                source = _gather(plan, index)
            except IndexError:  # negative or out-of-range: the generic path's rules/error
                return self.data[index]
            return TensorDict._new_unsafe(source, batch_size=torch.Size([index.numel()]),
                                          device=self._data.device)  # fmt: skip
        return self.data[index]

    # -- persistence ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Counters and a copy of the stored TensorDict (``None`` before the first write)."""
        return {
            "len": self._len,
            "cursor": self.cursor,
            "write_count": self.write_count,
            "row_len": self.row_len,
            "data": None if self._data is None else self._data.to_tensordict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (reallocates the storage)."""
        if state.get("row_len") is not None:
            self._check_ndim(state["row_len"])
            self._set_row_len(int(state["row_len"]))
        self._check_size(state["data"])
        self._set_data(None)
        if state["data"] is not None:
            self._set_data(self._allocate(state["data"][0]))
            self._data.update_(state["data"].to(self.device))
        self._len, self.cursor = int(state["len"]), int(state["cursor"])
        self.write_count = int(state["write_count"])

    def dumps(self, path: str | Path) -> None:
        """Save the stored TensorDict under the directory ``path`` (memory-mapped files)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self._data is not None:
            self._data.memmap(prefix=path / "data", copy_existing=True)
        meta = {"len": self._len, "cursor": self.cursor, "write_count": self.write_count}
        torch.save({**meta, "row_len": self.row_len}, path / "meta.pt")

    def loads(self, path: str | Path) -> None:
        """Load what :meth:`dumps` saved under ``path``.

        Only tensors and plain data are read: a file holding anything else (e.g. a pickle
        placed there by someone else) raises :class:`pickle.UnpicklingError` naming the
        file, without running it; a damaged one raises ``ValueError``.
        """
        path = Path(path)
        owner = f"{type(self).__name__}.loads"
        meta = load_state_file(path / "meta.pt", owner)
        data = load_tensordict(path / "data", owner) if (path / "data").exists() else None
        self.load_state_dict({**meta, "data": data})

    def _check_ndim(self, row_len: int) -> None:
        if self.ndim != 2:
            raise ValueError(
                f"{type(self).__name__}: expected saved data of a 1-D storage, received a 2-D "
                f"one (rows of T={row_len}); fix: load into a storage built with ndim=2."
            )

    def _check_size(self, data: TensorDictBase | None) -> None:
        if data is not None and data.batch_size != torch.Size([self.max_size]):
            raise ValueError(
                f"{type(self).__name__}: expected saved data of batch_size [{self.max_size}], "
                f"received {list(data.batch_size)}; fix: load into a storage built with "
                f"max_size={data.batch_size[0]}."
            )


def _gather_plan(td: TensorDictBase) -> list | None:
    """The stored tensors of ``td`` as a nested ``[(key, tensor or sub-plan)]`` list for
    :meth:`Storage.get`'s per-tensor gather, or ``None`` where ``td[index]`` must be used:
    anything but plain ``TensorDict`` / ``torch.Tensor`` entries (memory-mapped tensors,
    non-tensor data, lazy stacks), dimension names, nested batch dims beyond the storage's,
    empty nested TensorDicts."""
    if type(td) is not TensorDict or td._has_names() or not len(td._tensordict):
        return None
    plan = []
    for key, value in td._tensordict.items():
        if type(value) is Tensor:
            plan.append((key, value))
        elif type(value) is TensorDict and value.batch_size == td.batch_size:
            sub = _gather_plan(value)
            if sub is None:
                return None
            plan.append((key, sub))
        else:
            return None
    return plan


def _gather(plan: list, index: Tensor) -> dict:
    return {
        key: value.index_select(0, index) if type(value) is Tensor else _gather(value, index)
        for key, value in plan
    }


def _layout(td: TensorDictBase) -> dict:
    return {
        k: (tuple(v.shape[td.batch_dims :]), v.dtype)
        for k, v in td.items(include_nested=True, leaves_only=True)
    }
