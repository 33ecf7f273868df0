"""``MultiAgentMLP``: an MLP over an agent dimension, shared or per agent, centralized or not."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from recurrl.modules.mlp import MLP

__all__ = ["MultiAgentMLP"]


class _AgentLinear(nn.Module):
    """``n`` independent linear maps applied to the ``n`` agents of ``[*B, n, in]`` at once
    (one batched matmul), each initialised as ``nn.Linear`` is."""

    def __init__(self, n: int, n_in: int, n_out: int, bias: bool, device: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, n_out, n_in, device=device))
        self.bias = nn.Parameter(torch.empty(n, n_out, device=device)) if bias else None
        bound = 1.0 / math.sqrt(n_in)
        for i in range(n):
            nn.init.kaiming_uniform_(self.weight[i], a=math.sqrt(5))
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        y = torch.einsum("...ni,noi->...no", x, self.weight)
        return y if self.bias is None else y + self.bias


class MultiAgentMLP(nn.Module):
    """An MLP for ``n_agents`` agents: input ``[*B, n_agents, n_agent_inputs]``, output
    ``[*B, n_agents, n_agent_outputs]``, the reference library's multi-agent MLP.

    * ``share_params=True``: one MLP for every agent (homogeneous agents); False: one per
      agent, all evaluated in one batched matmul per layer (heterogeneous agents).
    * ``centralized=False``: each agent's output reads its own input; True: every agent's
      output reads all agents' inputs (``n_agents * n_agent_inputs`` features), e.g. the
      centralized critic of MAPPO over all agents' observations. A centralized shared MLP
      gives every agent the same output.

    Args:
        n_agent_inputs: features of one agent's input; ``None`` infers them at the first
            call (only with ``share_params=True``).
        n_agent_outputs: features of one agent's output.
        n_agents: size of the agent dim (the second to last dim of the input).

    Keyword Args:
        centralized: every agent reads all agents' inputs. Default: False.
        share_params: one set of weights for every agent. Default: True.
        device: device of the parameters.
        depth: hidden layers when ``num_cells`` is an int (as :class:`MLP`).
        num_cells: hidden widths (a list, or an int repeated ``depth`` times); default 32
            twice, as the reference library.
        activation_class: activation after every hidden layer. Default: ``nn.Tanh``.
        centralised: the reference library's former spelling of ``centralized``.
        **kwargs: further :class:`MLP` arguments (``activation_kwargs``, ``bias_last_layer``,
            ...), with ``share_params=True`` only.

    Examples:
        >>> import torch
        >>> obs = torch.randn(5, 3, 4)  # [*B, n_agents, n_agent_inputs]
        >>> policy = MultiAgentMLP(4, 2, n_agents=3, share_params=False)
        >>> policy(obs).shape
        torch.Size([5, 3, 2])
        >>> critic = MultiAgentMLP(4, 1, n_agents=3, centralized=True)  # sees every agent
        >>> v = critic(obs)
        >>> v.shape, bool((v == v[:, :1]).all())
        (torch.Size([5, 3, 1]), True)
    """

    def __init__(
        self,
        n_agent_inputs: int | None,
        n_agent_outputs: int,
        n_agents: int,
        *,
        centralized: bool | None = None,
        share_params: bool = True,
        device: torch.device | str | None = None,
        depth: int | None = None,
        num_cells: Sequence[int] | int | None = None,
        activation_class: type[nn.Module] = nn.Tanh,
        centralised: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if centralized is not None and centralised is not None and centralized != centralised:
            raise ValueError(
                f"MultiAgentMLP: centralized={centralized!r} and centralised={centralised!r} "
                f"disagree (two spellings of one argument). Fix: pass centralized only."
            )
        centralized = bool(centralized if centralized is not None else centralised)
        if isinstance(n_agents, bool) or not isinstance(n_agents, int) or n_agents < 1:
            raise ValueError(f"MultiAgentMLP: n_agents must be an int >= 1, received {n_agents!r}.")
        if num_cells is None:
            num_cells = [32, 32] if depth is None else 32
        self.n_agents, self.centralized, self.share_params = n_agents, centralized, share_params
        self.n_agent_inputs, self.n_agent_outputs = n_agent_inputs, n_agent_outputs
        n_in = None if n_agent_inputs is None else n_agent_inputs * (n_agents if centralized else 1)
        if share_params:
            self.net: nn.Module = MLP(n_in, n_agent_outputs, depth, num_cells, activation_class,
                                      device=device, **kwargs)  # fmt: skip
            return
        if n_in is None or kwargs:
            raise ValueError(
                f"MultiAgentMLP: share_params=False builds one batched MLP per agent and needs "
                f"n_agent_inputs (an int) and no further MLP arguments; received "
                f"n_agent_inputs={n_agent_inputs!r}, extra arguments {sorted(kwargs)}. Fix: "
                f"pass n_agent_inputs, or share_params=True."
            )
        sizes = [n_in, *_widths(depth, num_cells), n_agent_outputs]
        layers: list[nn.Module] = []
        for i in range(len(sizes) - 1):
            layers.append(_AgentLinear(n_agents, sizes[i], sizes[i + 1], True, device))
            if i < len(sizes) - 2:
                layers.append(activation_class())
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """``[*B, n_agents, n_agent_inputs]`` -> ``[*B, n_agents, n_agent_outputs]``."""
        n = self.n_agents
        if (
            x.dim() < 2
            or x.shape[-2] != n
            or (self.n_agent_inputs is not None and x.shape[-1] != self.n_agent_inputs)
        ):
            raise ValueError(
                f"MultiAgentMLP: expected an input [*B, n_agents={n}, n_agent_inputs="
                f"{self.n_agent_inputs}], received {list(x.shape)}. Fix: the agent dim second "
                f"to last, one feature vector per agent."
            )
        if self.centralized:
            x = x.flatten(-2)  # [*B, n * F]
            if self.share_params:
                out = self.net(x)
                return out.unsqueeze(-2).expand(*out.shape[:-1], n, out.shape[-1])
            x = x.unsqueeze(-2).expand(*x.shape[:-1], n, x.shape[-1])
        return self.net(x)


def _widths(depth: int | None, num_cells: Sequence[int] | int) -> list[int]:
    """The hidden widths, as :class:`MLP` reads ``depth`` and ``num_cells``."""
    if isinstance(num_cells, int):
        return [num_cells] * (1 if depth is None else depth)
    widths = list(num_cells)
    if depth is not None and depth != len(widths):
        raise ValueError(
            f"MultiAgentMLP: depth={depth} contradicts num_cells={widths} ({len(widths)} "
            f"hidden layers); pass one of them."
        )
    return widths
