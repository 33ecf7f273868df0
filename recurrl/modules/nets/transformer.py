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

    def keys_values(self, ctx: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, ...]:
        """Keys and values ``[N, heads, K, d]`` of ``ctx`` ``[N, K, H]`` (keys rotated), and
        ``bad`` ``[N, K]``: the positions holding a NaN or an infinity, whose keys and values
        are replaced by zeros (what a query that may see one gets is :meth:`attend`'s)."""
        n, k, size = ctx.shape
        kv = self.kv(self.norm_attn(ctx))
        bad = ~torch.isfinite(kv).all(dim=-1)
        # select, never multiply: a NaN of one episode must not reach another's scores
        kv = torch.where(bad[..., None], 0.0, kv)
        kv = kv.view(n, k, 2, self.heads, size // self.heads).permute(2, 0, 3, 1, 4)
        return _rotate(kv[0], *rope), kv[1], bad

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

    def query(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        """Rotated queries ``[N, heads, Q, d]`` of ``x`` ``[N, Q, H]``."""
        n, q, size = x.shape
        return _rotate(
            self.q(self.norm_attn(x)).view(n, q, self.heads, size // self.heads).transpose(1, 2),
            *rope,
        )


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

    def _tables(self, positions: Tensor, like: Tensor) -> tuple[Tensor, Tensor]:
        return _rotary(positions, self.hidden_size // self.num_heads, like.dtype)

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
        m = self.memory_length
        slot = torch.arange(m + 1, device=x.device)
        valid = slot[:m] >= (m - count)[..., None]  # [N, L, M]
        memory = torch.where(valid[..., None], memory, 0.0)
        rope_k = self._tables(slot, x)
        rope_q = (rope_k[0][m:], rope_k[1][m:])
        h = self.embed(x)[:, None]  # [N, 1, H]
        new = []
        for layer, block in enumerate(self.layers):
            ctx = torch.cat((memory[:, layer], h), dim=1)  # [N, M + 1, H]
            new.append(ctx[:, 1:])  # the fixed-size buffer, shifted by one (a roll)
            k, v, bad = block.keys_values(ctx, rope_k)
            sees = torch.cat((valid[:, layer], valid.new_ones(x.shape[0], 1)), dim=1)
            mask = sees[:, None, None, :]  # [N, 1, 1, M + 1]
            poisoned = (sees & bad).any(dim=-1)[:, None, None]
            a = block.attend(block.query(h, rope_q), k, v, mask, poisoned)
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
        ``[N, L]``) may be non-empty: the restarts inside a row start from nothing."""
        n, steps = x.shape[:2]
        m, device = self.memory_length, x.device
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

        chunk = min(steps, max(m, _MIN_CHUNK))
        blocks = -(-steps // chunk)
        padded = blocks * chunk
        # query t of block b sees the buffer window e in [b*chunk, b*chunk + M + chunk)
        tq = torch.arange(padded, device=device).view(blocks, chunk)
        e = tq[:, :1] + torch.arange(m + chunk, device=device)  # [blocks, M + chunk]
        lb = F.pad(lb, (0, padded - steps), value=m + steps)  # padding: a segment of its own
        lb = lb.view(n, self.num_layers, blocks, chunk, 1)
        tq = tq[..., None]
        mask = (e[:, None, :] >= tq) & (e[:, None, :] <= m + tq) & (e[:, None, :] >= lb)
        # [N, L, blocks, chunk, M + chunk]

        positions = torch.arange(m + padded, device=device)
        rope_k = self._tables(positions, x)
        rope_q = (rope_k[0][m:], rope_k[1][m:])
        h = self.embed(x)
        buffers = []
        for layer, block in enumerate(self.layers):
            buf = torch.cat((memory[:, layer], h), dim=1)  # [N, M + T, H]
            buffers.append(buf)
            k, v, bad = block.keys_values(F.pad(buf, (0, 0, 0, padded - steps)), rope_k)
            q = block.query(F.pad(h, (0, 0, 0, padded - steps)), rope_q)
            sees = mask[:, layer]  # [N, blocks, chunk, M + chunk]
            bad_w = bad[:, e]  # [N, blocks, M + chunk]
            poisoned = (sees & bad_w[:, :, None, :]).any(dim=-1)  # [N, blocks, chunk]
            a = block.attend(
                _blocks(q, blocks, chunk),
                _windows(k, blocks, chunk, m),
                _windows(v, blocks, chunk, m),
                sees.reshape(n * blocks, 1, chunk, m + chunk),
                poisoned.reshape(n * blocks, 1, chunk),
            )
            a = a.view(n, blocks, *a.shape[1:]).permute(0, 2, 1, 3, 4).flatten(2, 3)
            h = block.finish(h, _merge_heads(a[:, :, :steps]))
        y = self.norm(h)

        # next memory and count at trajectory ends: the buffer window just after step t
        ends = torch.ones_like(is_init)
        ends[:, :-1] = restart[:, 1:]
        stacked = torch.stack(buffers, dim=1)  # [N, L, M + T, H]
        windows = stacked.unfold(2, m, 1)[:, :, 1:]  # [N, L, T, H, M]: e in [t + 1, t + M]
        keep_from = torch.where(first, 0, m + seg)  # slots before a segment start are empty
        keep = (t[:, None] + 1 + torch.arange(m, device=device)) >= keep_from[..., None]
        keep = (keep & ends[..., None])[:, None, :, None, :]  # [N, 1, T, 1, M]
        nxt_memory = torch.where(keep, windows, 0.0).permute(0, 2, 1, 4, 3)
        since = torch.where(first[..., None], count[:, None, :] + t[:, None] + 1,
                            (t - seg + 1)[..., None])  # fmt: skip
        nxt_count = torch.where(ends[..., None], since.clamp(max=m), 0)
        return y, nxt_memory, nxt_count

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
            f"num_heads={self.num_heads}, memory_length={self.memory_length}"
        )


def _blocks(q: Tensor, blocks: int, chunk: int) -> Tensor:
    """Queries ``[N, heads, blocks * chunk, d]`` -> ``[N * blocks, heads, chunk, d]``."""
    n, heads, _, d = q.shape
    return q.view(n, heads, blocks, chunk, d).transpose(1, 2).reshape(n * blocks, heads, chunk, d)


def _windows(k: Tensor, blocks: int, chunk: int, m: int) -> Tensor:
    """Keys ``[N, heads, M + blocks * chunk, d]`` -> the overlapping windows of the blocks,
    ``[N * blocks, heads, M + chunk, d]`` (block ``b``: positions ``[b chunk, b chunk + M +
    chunk)``)."""
    n, heads, _, d = k.shape
    w = k.unfold(2, m + chunk, chunk)  # [N, heads, blocks, d, M + chunk]
    return w.permute(0, 2, 1, 4, 3).reshape(n * blocks, heads, m + chunk, d)
