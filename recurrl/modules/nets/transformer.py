"""A GTrXL-style gated transformer whose memory is the last ``M`` inputs of every layer.

:class:`GatedTransformer` is the network of :class:`~recurrl.modules.TransformerModule`
(plain tensors in and out; the module reads and writes the TensorDict). Each layer follows
Parisotto et al. 2019, "Stabilizing Transformers for Reinforcement Learning" (GTrXL):
layer norm *before* attention and MLP (the identity-map reordering), and a GRU-type gate in
place of each residual sum, biased towards the identity at initialisation::

    y  = x gated with relu(MHA(LN(x) -> LN([memory, x])))
    x' = y gated with relu(MLP(LN(y)))

    gate(x, y): r = sigmoid(W_r y + U_r x)
                z = sigmoid(W_z y + U_z x - b_g)          (b_g = gate_bias, 2 by default)
                x + z * (tanh(W_g y + U_g (r * x)) - x)   (= (1 - z) x + z h)

Positions are rotary (Su et al. 2021, "RoFormer"), applied to queries and keys, so the
attention score of two steps depends only on their distance: the memory needs no absolute
position, and the same step scores the same whether it sits in a stored memory or earlier
in the sequence (up to float rounding).

The memory of layer ``l`` is the last ``M = memory_length`` inputs of layer ``l`` (oldest
first, TrXL's "hidden states of the previous layer"), plus how many of those slots are valid
(``count``, the last ``count`` slots; fewer than ``M`` early in an episode). Keys and values
are recomputed from it, with the current weights, at every call: a stored frame costs
``num_layers * M * hidden_size`` floats (plus ``num_layers`` counts), half of what storing
keys and values would.
"""

from __future__ import annotations

import math
import mmap

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["GatedTransformer"]

#: the rotary frequencies' base (RoFormer's 10000)
_ROTARY_BASE = 10000.0
#: the fewest queries per attention block in recurrent mode (see ``_chunk``)
_MIN_CHUNK = 16


def _rotary(positions: Tensor, dim: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``cos``/``sin`` ``[P, dim // 2]`` of the rotary angles of ``positions`` ``[P]``.

    The angles are computed in float64 and rounded once, so the same position gives the
    same table in every call (sequential steps and recurrent passes agree to float
    rounding of the dot products only)."""
    half = dim // 2
    freq = _ROTARY_BASE ** (-torch.arange(half, dtype=torch.float64, device=positions.device)
                            * (2.0 / dim))  # fmt: skip
    angle = positions.to(torch.float64)[:, None] * freq[None]
    return angle.cos().to(dtype), angle.sin().to(dtype)


class _RotaryCache:
    """The rotary tables of positions ``0..P-1``, built once per head size, device and dtype
    and grown (to a power of two) when a longer one is asked for; a slice of a longer table
    holds the same values as a table built for fewer positions (each angle is computed on
    its own). Nothing is cached while tracing (``torch.compile``/``torch.export``)."""

    def __init__(self) -> None:
        self._tables: dict[tuple, tuple[Tensor, Tensor]] = {}

    def __call__(self, length: int, dim: int, like: Tensor) -> tuple[Tensor, Tensor]:
        if torch.compiler.is_compiling() or torch.compiler.is_exporting():
            return _rotary(torch.arange(length, device=like.device), dim, like.dtype)
        key = (dim, like.device, like.dtype)
        cos, sin = self._tables.get(key, (None, None))
        if cos is None or cos.shape[0] < length:
            size = 1 << max(length - 1, 63).bit_length()
            # normal tensors even inside inference_mode: a table built while acting is
            # reused by training passes, which save it for backward
            with torch.inference_mode(False), torch.no_grad():
                cos, sin = _rotary(torch.arange(size, device=like.device), dim, like.dtype)
            self._tables[key] = (cos, sin)
        return cos[:length], sin[:length]


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the pairs ``(x[..., i], x[..., i + d/2])`` of ``x`` ``[..., P, d]`` by the
    angles of ``cos``/``sin`` ``[P, d/2]`` (an odd ``d`` leaves its last feature as is)."""
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest), dim=-1)


class _GRUGate(nn.Module):
    """GTrXL's GRU-type gate ``gate(x, y)`` of the residual ``x`` and the sublayer's ``y``."""

    def __init__(self, size: int, bias: bool, gate_bias: float, **factory) -> None:
        super().__init__()
        self.w = nn.Linear(size, 3 * size, bias=bias, **factory)  # W_r, W_z, W_g (on y)
        self.u = nn.Linear(size, 2 * size, bias=False, **factory)  # U_r, U_z (on x)
        self.u_g = nn.Linear(size, size, bias=False, **factory)  # U_g (on r * x)
        self.gate_bias = float(gate_bias)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        wr, wz, wg = self.w(y).chunk(3, dim=-1)
        ur, uz = self.u(x).chunk(2, dim=-1)
        r = torch.sigmoid(wr + ur)
        z = torch.sigmoid(wz + uz - self.gate_bias)
        return x + z * (torch.tanh(wg + self.u_g(r * x)) - x)


class _GatedLayer(nn.Module):
    """One GTrXL layer: pre-norm attention over ``[memory, x]`` and a pre-norm MLP, each
    merged into the residual stream by a :class:`_GRUGate`."""

    def __init__(
        self, size: int, heads: int, feedforward: int, bias: bool, dropout: float,
        gate_bias: float, **factory,
    ) -> None:  # fmt: skip
        super().__init__()
        self.heads = heads
        self.norm_attn = nn.LayerNorm(size, **factory)
        self.q = nn.Linear(size, size, bias=bias, **factory)
        self.kv = nn.Linear(size, 2 * size, bias=bias, **factory)
        self.out = nn.Linear(size, size, bias=bias, **factory)
        self.gate_attn = _GRUGate(size, bias, gate_bias, **factory)
        self.norm_mlp = nn.LayerNorm(size, **factory)
        self.mlp = nn.Sequential(
            nn.Linear(size, feedforward, bias=bias, **factory),
            nn.ReLU(),
            nn.Linear(feedforward, size, bias=bias, **factory),
        )
        self.gate_mlp = _GRUGate(size, bias, gate_bias, **factory)
        self.dropout = nn.Dropout(dropout)

    def keys_values(self, normed: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, ...]:
        """Keys and values ``[N, K, heads, d]`` of the normalized context ``normed``
        ``[N, K, H]`` (keys rotated by ``rope``, ``[K, d/2]`` each), and ``bad`` ``[N, K]``:
        the positions holding a NaN or an infinity, whose keys and values are replaced by
        zeros (what a query that may see one gets is :meth:`attend`'s)."""
        n, k, size = normed.shape
        kv = self.kv(normed)
        # one pass: a row's sum is NaN or infinite if one of its entries is (a finite row
        # whose sum overflows, |entries| near 1e38, is flagged too, in both modes alike)
        bad = ~torch.isfinite(kv.sum(dim=-1))
        # select, never multiply: a NaN of one episode must not reach another's scores
        kv = torch.where(bad[..., None], 0.0, kv).view(n, k, 2, self.heads, size // self.heads)
        cos, sin = rope
        return _rotate(kv[:, :, 0], cos[:, None], sin[:, None]), kv[:, :, 1], bad

    def query(self, normed: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        """Rotated queries ``[N, Q, heads, d]`` of the normalized inputs ``normed``
        ``[N, Q, H]`` (``rope``: ``[Q, d/2]`` each)."""
        n, q, size = normed.shape
        cos, sin = rope
        return _rotate(self.q(normed).view(n, q, self.heads, size // self.heads),
                       cos[:, None], sin[:, None])  # fmt: skip

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, poisoned: Tensor) -> Tensor:
        """``softmax(q k^T / sqrt(d), mask) v`` ``[B, heads, Q, d]`` (``mask`` ``[B, 1, Q, K]``
        True where a query may see a key), NaN for the queries flagged ``poisoned``
        ``[B, 1, Q]`` (they may see a non-finite key or value, as without the zeroing)."""
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return torch.where(poisoned[..., None], float("nan"), a)

    def finish(self, x: Tensor, a: Tensor) -> Tensor:
        """The gates and the MLP after attention: ``x`` ``[N, Q, H]``, ``a`` ``[N, Q, H]``."""
        x = self.gate_attn(x, F.relu(self.dropout(self.out(a))))
        return self.gate_mlp(x, F.relu(self.dropout(self.mlp(self.norm_mlp(x)))))


def _merge_heads(a: Tensor) -> Tensor:
    """``[N, heads, Q, d]`` -> ``[N, Q, heads * d]``."""
    n, heads, q, d = a.shape
    return a.transpose(1, 2).reshape(n, q, heads * d)


class GatedTransformer(nn.Module):
    """A stacked GTrXL-style transformer over plain tensors, with a memory of ``M`` steps.

    An input projection to ``hidden_size``, ``num_layers`` gated layers (see the module's
    docstring) and a final layer norm. The memory of layer ``l`` holds its last ``M`` inputs.

    Args:
        input_size: features of the input ``F``.
        hidden_size: features of the layers and the output ``H``.
        num_layers: stacked layers ``L``. Default: 1.
        num_heads: attention heads (they divide ``hidden_size``); ``None`` takes the most of
            4, 2, 1 that divides it. Default: None.
        memory_length: steps ``M`` of memory per layer (>= 1); each step attends to at most
            ``M`` earlier steps of its episode and itself. Default: 64.
        feedforward_size: hidden features of each layer's MLP; ``None`` is ``hidden_size``.
            Default: None.
        bias: biases in the linear layers. Default: True.
        dropout: dropout on the attention and MLP outputs before their gates (training).
            Default: 0.
        gate_bias: ``b_g`` of the gates (> 0 starts each layer near the identity).
            Default: 2.
        device, dtype: of the parameters.

    Examples:
        >>> import torch
        >>> net = GatedTransformer(3, 8, num_layers=2, memory_length=4)
        >>> x = torch.randn(5, 3)
        >>> memory, count = torch.zeros(5, 2, 4, 8), torch.zeros(5, 2, dtype=torch.long)
        >>> y, memory, count = net.step(x, memory, count)
        >>> y.shape, memory.shape, count[0].tolist()
        (torch.Size([5, 8]), torch.Size([5, 2, 4, 8]), [1, 1])
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        *,
        num_heads: int | None = None,
        memory_length: int = 64,
        feedforward_size: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        gate_bias: float = 2.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        sizes = {"input_size": input_size, "hidden_size": hidden_size, "num_layers": num_layers,
                 "memory_length": memory_length}  # fmt: skip
        bad = {k: v for k, v in sizes.items() if not isinstance(v, int) or v < 1}
        if bad:
            raise ValueError(f"GatedTransformer: expected positive ints, received {bad}.")
        if num_heads is None:
            num_heads = next(h for h in (4, 2, 1) if hidden_size % h == 0)
        if not isinstance(num_heads, int) or num_heads < 1 or hidden_size % num_heads:
            raise ValueError(
                f"GatedTransformer: num_heads must be a positive int dividing hidden_size="
                f"{hidden_size}, received {num_heads!r}. Fix: num_heads=None (the most of 4, "
                f"2, 1 that divides it) or a divisor of hidden_size."
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"GatedTransformer: dropout must be in [0, 1), received {dropout}.")
        factory = {"device": device, "dtype": dtype}
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.num_heads, self.memory_length = num_heads, memory_length
        self.feedforward_size = feedforward_size or hidden_size
        self.bias, self.dropout = bias, float(dropout)
        self.embed = nn.Linear(input_size, hidden_size, bias=bias, **factory)
        self.layers = nn.ModuleList(
            _GatedLayer(
                hidden_size, num_heads, self.feedforward_size, bias, dropout, gate_bias, **factory
            )
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(hidden_size, **factory)
        self._rope_cache = _RotaryCache()

    def _rope(self, length: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """Rotary tables of positions ``0..length-1`` (cached, see :class:`_RotaryCache`)."""
        return self._rope_cache(length, self.hidden_size // self.num_heads, like)

    def step(self, x: Tensor, memory: Tensor, count: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One step: each layer attends to its valid memory slots and to itself.

        Args:
            x: input ``[N, F]``.
            memory: ``[N, L, M, H]``, the last ``M`` inputs of every layer, oldest first; the
                slots before the last ``count`` are ignored (and written as zeros).
            count: valid slots ``[N, L]`` (int, ``0 <= count <= M``; 0 starts an episode).

        Returns:
            ``(y [N, H], memory [N, L, M, H], count [N, L])``: the output and the memory
            after the step (the buffer shifted by one slot, the step's layer inputs last).
        """
        m, n = self.memory_length, x.shape[0]
        valid = torch.arange(m, device=x.device) >= (m - count)[..., None]  # [N, L, M]
        memory = torch.where(valid[..., None], memory, 0.0)
        sees = torch.cat((valid, valid.new_ones(n, self.num_layers, 1)), dim=2)  # [N, L, M+1]
        rope_k = self._rope(m + 1, x)
        rope_q = (rope_k[0][m:], rope_k[1][m:])
        h = self.embed(x)[:, None]  # [N, 1, H]
        new = []
        for layer, block in enumerate(self.layers):
            ctx = torch.cat((memory[:, layer], h), dim=1)  # [N, M + 1, H]
            new.append(ctx[:, 1:])  # the fixed-size buffer, shifted by one (a roll)
            normed = block.norm_attn(ctx)
            k, v, bad = block.keys_values(normed, rope_k)
            q = block.query(normed[:, m:], rope_q)
            see = sees[:, layer]
            poisoned = (see & bad).any(dim=-1)[:, None, None]
            a = block.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                             see[:, None, None, :], poisoned)  # fmt: skip
            h = block.finish(h, _merge_heads(a))
        return self.norm(h[:, 0]), torch.stack(new, dim=1), (count + 1).clamp(max=m)

    def sequence(
        self, x: Tensor, memory: Tensor, count: Tensor, is_init: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``[N, T]`` sequences with restarts, every layer in one attention pass.

        Each row starts from the memory stored at its first step, and every ``is_init`` True
        restarts from the memory stored at that step (where it is empty, ``count`` 0, as at
        an episode start, this is the same pass, block-diagonal across the restarts; the
        rows are first cut at restarts from a non-empty stored memory).

        Args:
            x: inputs ``[N, T, F]``.
            memory: stored memories ``[N, T, L, M, H]`` (read at restarts only).
            count: stored valid-slot counts ``[N, T, L]`` (read at restarts only).
            is_init: ``[N, T]`` bool restart flags.

        Returns:
            ``(y [N, T, H], next_memory [N, T, L, M, H], next_count [N, T, L])``; the next
            memory and count are exact at every trajectory end (the step before an
            ``is_init``, and the last step) and zero elsewhere.
        """
        n, steps = x.shape[:2]
        cut = is_init.clone()
        cut[:, 0] = False
        cut &= (count > 0).any(dim=-1)  # restarts from a non-empty stored memory
        if not bool(cut.any()):
            return self._pass(x, memory[:, 0], count[:, 0], is_init)
        # cut the rows there: each piece is a row of its own, from its own stored memory
        flat_start = cut.flatten().clone()
        flat_start[::steps] = True
        starts = flat_start.nonzero().squeeze(-1)  # [P]
        piece = flat_start.cumsum(0) - 1  # [N * T]
        pos = torch.arange(n * steps, device=x.device) - starts[piece]
        lengths = torch.diff(starts, append=starts.new_tensor([n * steps]))
        shape = (starts.numel(), int(lengths.max()))

        def spread(t: Tensor, fill: float | bool = 0) -> Tensor:
            out = t.new_full((*shape, *t.shape[2:]), fill)
            out[piece, pos] = t.flatten(0, 1)
            return out

        flat_memory, flat_count = memory.flatten(0, 1), count.flatten(0, 1)
        # padding steps restart from an empty memory: they attend only among themselves
        y, nxt_memory, nxt_count = self._pass(
            spread(x), flat_memory[starts], flat_count[starts], spread(is_init, True)
        )
        return tuple(t[piece, pos].view(n, steps, *t.shape[2:])
                     for t in (y, nxt_memory, nxt_count))  # fmt: skip

    def _pass(
        self, x: Tensor, memory: Tensor, count: Tensor, is_init: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`sequence` where only the first step's memory (``[N, L, M, H]``, counts
        ``[N, L]``) may be non-empty: the restarts inside a row start from nothing.

        Banded attention: the queries are cut into blocks of ``C = max(ceil(M / 2), 16)``
        steps (fewer if ``T`` is shorter), and block ``b`` attends to the keys of its own
        block and of the ``k = ceil(M / C)`` blocks before it (``(k + 1) C`` keys, ``1.5 M``
        for an even ``M >= 32``; the first blocks' earlier blocks are the memory, preceded by
        ``k C - M`` zero slots that no query sees), so the cost grows as ``T * M``, not
        ``T^2``. With one block, it attends to the memory and itself (``M + T`` keys).
        """
        n, steps = x.shape[:2]
        m, layers, device = self.memory_length, self.num_layers, x.device
        t = torch.arange(steps, device=device)
        restart = is_init.clone()
        restart[:, 0] = False
        seg = torch.cummax(torch.where(restart, t, 0), dim=1).values  # segment start [N, T]
        first = seg == 0
        # A step's keys, in buffer coordinates e (memory slots 0..M-1, step s at M + s):
        # causal (e <= M + t), inside the window (e >= t) and inside its segment (e >= lb).
        lb = torch.where(first[:, None], (m - count)[..., None], (m + seg)[:, None])  # [N,L,T]
        valid = torch.arange(m, device=device) >= (m - count)[..., None]
        memory = torch.where(valid[..., None], memory, 0.0)

        chunk = min(steps, max(-(-m // 2), _MIN_CHUNK))
        blocks = -(-steps // chunk)
        padded = blocks * chunk
        back = -(-m // chunk) if blocks > 1 else 0  # earlier blocks a query block may see
        lead = back * chunk - m if blocks > 1 else 0  # zero slots before the memory
        width = (back + 1) * chunk if blocks > 1 else m + chunk  # keys per block
        # block b's keys: e in [b * chunk - lead, b * chunk - lead + width)
        tq = torch.arange(padded, device=device).view(blocks, chunk, 1)
        e = tq[:, :1] - lead + torch.arange(width, device=device)  # [blocks, 1, width]
        lb = F.pad(lb, (0, padded - steps), value=m + steps)  # padding: a segment of its own
        lb = lb.view(n, layers, blocks, chunk, 1)
        mask = (e >= tq) & (e <= m + tq) & (e >= lb)  # [N, L, blocks, chunk, width]

        rope = self._rope(lead + m + padded, x)  # key i of the padded buffer at position i
        rope_q = (rope[0][lead + m :], rope[1][lead + m :])
        h = self.embed(x)
        heads, d = self.num_heads, self.hidden_size // self.num_heads
        buffers = []
        for layer, block in enumerate(self.layers):
            buf = torch.cat((memory[:, layer], h), dim=1)  # [N, M + T, H]
            buffers.append(buf)
            normed = block.norm_attn(buf)
            q = block.query(F.pad(normed[:, m:], (0, 0, 0, padded - steps)), rope_q)
            k, v, bad = block.keys_values(
                F.pad(normed, (0, 0, lead, padded - steps)), rope
            )  # [N, lead + M + padded, heads, d]
            sees = mask[:, layer]
            poisoned = (sees & _banded(bad, blocks, chunk, back)[:, :, None, :]).any(dim=-1)
            a = block.attend(
                q.view(n, blocks, chunk, heads, d).transpose(2, 3).flatten(0, 1),
                _banded(k, blocks, chunk, back).transpose(2, 3).flatten(0, 1),
                _banded(v, blocks, chunk, back).transpose(2, 3).flatten(0, 1),
                sees.reshape(n * blocks, 1, chunk, width),
                poisoned.reshape(n * blocks, 1, chunk),
            )  # [N * blocks, heads, chunk, d]
            a = a.view(n, blocks, heads, chunk, d).transpose(2, 3).reshape(n, padded, heads * d)
            h = block.finish(h, a[:, :steps])
        y = self.norm(h)

        # next memory and count at trajectory ends: the buffer window just after step t (the
        # slots of an earlier episode, and every step that is not a trajectory end, zeros)
        ends = torch.ones_like(is_init)
        ends[:, :-1] = restart[:, 1:]
        keep_from = torch.where(first, 0, m + seg)  # slots before a segment start are empty
        nxt_memory = _next_memory(torch.stack(buffers, dim=1), ends, keep_from)
        since = torch.where(first[..., None], count[:, None, :] + t[:, None] + 1,
                            (t - seg + 1)[..., None])  # fmt: skip
        nxt_count = torch.where(ends[..., None], since.clamp(max=m), 0)
        return y, nxt_memory, nxt_count

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
            f"num_heads={self.num_heads}, memory_length={self.memory_length}"
        )


#: the smallest zeros (bytes) that :func:`_zeros` maps instead of writing
_MAP_BYTES = 1 << 20


def _zeros(shape: tuple[int, ...], like: Tensor) -> Tensor:
    """Zeros of ``shape`` (``like``'s dtype and device) whose memory is not written.

    A large CPU tensor is a fresh anonymous memory map, whose pages the kernel provides
    (zeroed) only where they are first written: a next memory of 16 KiB per frame written
    at its trajectory ends only costs those pages, where ``torch.zeros`` writes them all
    (2048 frames at ``M = H = 64``: 32 MiB, several times the time of the whole attention
    pass on a CPU). Small tensors, other devices and traced code get ``torch.zeros``."""
    nbytes = math.prod(shape) * like.element_size()
    if like.device.type != "cpu" or nbytes < _MAP_BYTES or torch.compiler.is_compiling():
        return like.new_zeros(shape)
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=like.dtype).view(shape)


def _next_memory(stacked: Tensor, ends: Tensor, keep_from: Tensor, sparse: bool | None = None
                 ) -> Tensor:  # fmt: skip
    """The memory after each step ``t`` ``[N, T, L, M, H]``: at the trajectory ends
    (``ends`` ``[N, T]``) the window of buffer rows ``t + 1 .. t + M`` of ``stacked``
    ``[N, L, M + T, H]``, where rows before ``keep_from`` ``[N, T]`` are zeros; zeros
    elsewhere.

    ``sparse`` (default: on CPU) gathers the windows of the trajectory ends only (one host
    sync to count them) and writes them into :func:`_zeros`; else every step's window is
    gathered, the others reading an appended zero row (no sync, the accelerators' path).
    Both are differentiable and equal."""
    n, layers, rows, size = stacked.shape
    steps = ends.shape[1]
    m = rows - steps
    device = stacked.device
    if sparse is None:
        sparse = device.type == "cpu"
    flat = torch.cat((stacked.reshape(n * layers * rows, size), stacked.new_zeros(1, size)))
    zero_row = n * layers * rows
    slot = torch.arange(m, device=device)
    base = (torch.arange(n, device=device)[:, None] * layers
            + torch.arange(layers, device=device)) * rows  # [N, L]  # fmt: skip
    if sparse:
        at = ends.flatten().nonzero().squeeze(-1)  # [E] flat (row, step) of the ends
        row, t = at // steps, at % steps
        src = t[:, None] + 1 + slot  # [E, M]
        keep = src >= keep_from.flatten()[at, None]
        index = torch.where(keep[:, None], base[row][..., None] + src[:, None], zero_row)
        out = _zeros((n * steps, layers, m, size), stacked)
        out.index_put_((at,), flat.index_select(0, index.flatten()).view(-1, layers, m, size))
        return out.view(n, steps, layers, m, size)
    src = torch.arange(steps, device=device)[:, None] + 1 + slot  # [T, M]
    keep = (src >= keep_from[..., None]) & ends[..., None]  # [N, T, M]
    index = torch.where(keep[:, :, None], base[:, None, :, None] + src[:, None], zero_row)
    return flat.index_select(0, index.flatten()).view(n, steps, layers, m, size)


def _banded(k: Tensor, blocks: int, chunk: int, back: int) -> Tensor:
    """The keys of every query block, ``k`` ``[N, K, ...]`` -> ``[N, blocks, width, ...]``:
    with one block, all ``K = width`` of them (a view); else block ``b``'s own ``chunk``
    keys preceded by those of the ``back`` blocks before it (``K = (blocks + back) * chunk``,
    ``width = (back + 1) * chunk``), a concatenation of shifted views (cheaper to
    differentiate than overlapping windows)."""
    if blocks == 1:
        return k[:, None]
    kb = k.unflatten(1, (blocks + back, chunk))
    return torch.cat([kb[:, i : i + blocks] for i in range(back + 1)], dim=2)
