"""How a remote collector's batch travels to the driver of a
:class:`~recurrl.collectors.RayCollector`.

A pickled torch tensor is serialized through torch's own reducer into an in-band byte
string, written into Ray's object store, read back and unpickled into a new tensor: three
copies and per-tensor overhead. Numpy arrays travel out of band instead (pickle protocol
5): the worker writes each one into the object store in one ``memcpy`` and the driver maps
it without copying. For the 136 MB of one 1024-env batch of the PPO fast recipe (LSTM H=64,
actor and critic states) that is 0.4-0.8 s against 0.05-0.1 s, put, read back and made one
TensorDict (``benchmarks/ray_throughput.py --transport both``, 2-core machine). So a batch
crosses the process boundary as the *wire form* of its TensorDict: the nested entries with
every CPU tensor viewed as a numpy array (no copy on the worker's side), plus its batch
size and device; the driver turns it back into the TensorDict.

The arrays the driver receives live in the read-only object store; :func:`unpack` copies
them exactly once into writable tensors, which for ``sync=True`` is the concatenation of
the workers' batches along the env dim (no second copy for the concatenation). Every
entry, dtype and nesting level arrives unchanged: hidden states, ``is_init`` and
trajectory ids included (``tests/collectors/test_ray_wire.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

__all__ = ["Wire", "as_tensordict", "is_wire", "pack", "unpack"]

_MARK = "__recurrl_wire__"
#: A packed batch: ``{_MARK: 1, "batch_size": [...], "device": str | None, "entries": {...}}``,
#: entries a nested dict of numpy arrays (or torch tensors that numpy cannot hold).
Wire = dict[str, Any]


def is_wire(obj: Any) -> bool:
    """Whether ``obj`` is a batch in wire form (:func:`pack`)."""
    return isinstance(obj, dict) and obj.get(_MARK) == 1


def _entries(td: TensorDictBase, batch: torch.Size) -> dict[str, Any] | None:
    """The nested entries of ``td`` as numpy arrays where possible; ``None`` when ``td`` is
    not a plain TensorDict whose sub-TensorDicts share its batch size (then it travels as
    itself, pickled)."""
    if type(td) is not TensorDict or td.batch_size != batch:
        return None
    if td._td_dim_names is not None and any(n is not None for n in td._td_dim_names):
        return None  # dim names are kept by pickling the TensorDict itself
    out: dict[str, Any] = {}
    for key, value in td._tensordict.items():
        if type(value) is torch.Tensor:
            out[key] = _leaf(value)
            continue
        sub = _entries(value, batch)
        if sub is None:
            return None
        out[key] = sub
    return out


def _leaf(value: torch.Tensor) -> np.ndarray | torch.Tensor:
    if value.device.type != "cpu" or value.requires_grad or value.layout != torch.strided:
        return value  # pickled by torch (rare: the collector stores detached CPU tensors)
    value = value.contiguous()
    try:
        return value.numpy()  # a view: Ray copies it once, into the object store
    except TypeError:  # a dtype numpy lacks (bfloat16): pickled by torch
        return value


def pack(td: TensorDictBase) -> Wire | TensorDictBase:
    """The wire form of a collected batch (its CPU tensors as numpy arrays, not copied), or
    ``td`` itself when it is not a plain TensorDict on the CPU.

    Examples:
        >>> td = TensorDict({"obs": torch.ones(2, 3), "next": {"h": torch.zeros(2, 3, 4)}},
        ...                 batch_size=[2, 3])
        >>> wire = pack(td)
        >>> type(wire["entries"]["next"]["h"]).__name__
        'ndarray'
        >>> back = unpack([wire, wire])
        >>> back.batch_size, back["next", "h"].shape
        (torch.Size([4, 3]), torch.Size([4, 3, 4]))
    """
    if td.device is not None and td.device.type != "cpu":
        return td
    entries = _entries(td, td.batch_size)
    if entries is None:
        return td
    device = None if td.device is None else str(td.device)
    return {_MARK: 1, "batch_size": list(td.batch_size), "device": device, "entries": entries}


def _join(values: list[Any], path: tuple[str, ...]) -> Any:
    """One copy of the leaves ``values`` (one per batch) concatenated along dim 0, or the
    nested dict of such copies."""
    first = values[0]
    if isinstance(first, dict):
        if any(not isinstance(v, dict) or v.keys() != first.keys() for v in values):
            raise _Mismatch(path, "keys")
        return {k: _join([v[k] for v in values], (*path, k)) for k in first}
    if any(isinstance(v, dict) for v in values):
        raise _Mismatch(path, "keys")
    if any((v.dtype, v.shape[1:]) != (first.dtype, first.shape[1:]) for v in values):
        raise _Mismatch(path, "dtypes or shapes")  # never promoted or broadcast silently
    if all(isinstance(v, np.ndarray) for v in values):
        # the one copy: out of the read-only object store into writable memory
        joined = np.concatenate(values, axis=0) if len(values) > 1 else values[0].copy()
        return torch.from_numpy(joined)
    tensors = [torch.from_numpy(v.copy()) if isinstance(v, np.ndarray) else v for v in values]
    return torch.cat(tensors, dim=0) if len(tensors) > 1 else tensors[0].clone()


class _Mismatch(ValueError):
    def __init__(self, path: tuple[str, ...], what: str) -> None:
        where = path if len(path) != 1 else path[0]
        super().__init__(f"the batches hold different {what} at entry {where or '(root)'!r}")


def _build(entries: dict[str, Any], batch: torch.Size, device: Any) -> TensorDict:
    """A TensorDict of the nested dict of tensors ``entries`` (sub-dicts become
    sub-TensorDicts of the same batch size, empty ones included)."""
    subs = {k: _build(v, batch, device) if isinstance(v, dict) else v for k, v in entries.items()}
    return TensorDict(subs, batch_size=batch, device=device)


def unpack(batches: list[Wire | TensorDictBase]) -> TensorDictBase:
    """One writable TensorDict from the batches of the remote collectors, concatenated along
    dim 0 (env rows) in order; each leaf is copied exactly once.

    Raises:
        ValueError: the batches hold different keys, shapes or dtypes (they cannot be
            concatenated).
    """
    if not batches:
        raise ValueError("unpack: expected at least one batch, received none.")
    if not all(is_wire(b) for b in batches):
        tds = [as_tensordict(b) for b in batches]
        try:
            return torch.cat(tds, dim=0) if len(tds) > 1 else tds[0]
        except (RuntimeError, KeyError) as err:
            raise ValueError(f"the batches cannot be concatenated: {err}") from err
    sizes = [b["batch_size"] for b in batches]
    devices = {b["device"] for b in batches}
    if len(devices) > 1 or any(s[1:] != sizes[0][1:] or not s for s in sizes):
        raise ValueError(
            f"the batches have batch sizes {sizes} on devices {sorted(map(str, devices))}"
        )
    batch = torch.Size([sum(s[0] for s in sizes), *sizes[0][1:]])
    entries = _join([b["entries"] for b in batches], ())
    return _build(entries, batch, devices.pop())


def as_tensordict(batch: Wire | TensorDictBase) -> TensorDictBase:
    """``batch`` as a TensorDict (a wire form is copied out of the object store)."""
    return unpack([batch]) if is_wire(batch) else batch
