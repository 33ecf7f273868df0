"""MultiAgentRecallEnv: a small multi-agent memory task with known answers (the multi-agent key
convention of docs/guides/multiagent.md), batched in torch; `recurrl train --env
MultiAgentRecall-v0` trains on it, the tests check the agent contract with it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from recurrl.envs._multiagent import DEFAULT_GROUP, multiagent_specs
from recurrl.envs.common import EnvBase
from recurrl.envs.specs import Categorical, Unbounded
from recurrl.envs.utils import get_reset_mask

__all__ = ["MultiAgentRecallEnv"]


class MultiAgentRecallEnv(EnvBase):
    """Each agent recalls a cue it saw only at its own first step; agents finish early.

    Every agent of an env row lives its own episode of ``lengths[i]`` steps: at its first
    step it sees a random cue (one-hot over ``num_cues``), then blank steps, then a query
    (the "query" entry set to 1) at its last step. The action it takes on the query step
    is scored (reward 1.0 if it equals the cue, else 0.0) and the agent is done: from the
    next step on its ``mask`` is False, its observation is zeros, its reward 0 and its
    per-agent ``done`` / ``terminated`` stay True, until the env row's episode ends. The
    row's episode ends (env-level ``terminated``) when every agent is done and no agent is
    still due to re-enter. With ``reenter=(agent, step)`` that agent, done by then,
    re-enters at env step ``step`` (counted from the row's reset, the first step is 0)
    with a fresh cue and a new episode of the same length: mid-episode per-agent
    ``is_init``.

    Keys (group ``group``, default ``"agents"``; ``n = n_agents``; ``D = num_cues + 1 + n``):

    - ``(group, "observation")`` ``[*B, n, D]``: cue one-hot ``[:num_cues]`` (first step
      only), query flag ``[num_cues]``, the agent's id one-hot ``[num_cues + 1:]`` (always,
      while the agent acts; zeros once it is done);
    - ``(group, "mask")`` ``[*B, n, 1]`` bool: the agent acts at this step;
    - ``(group, "action")`` ``Categorical(num_cues)`` ``[*B, n]`` int64; a masked agent's
      action is ignored (never read as a move: :attr:`actions_taken` counts the ones used);
    - ``("next", group, "reward")`` ``[*B, n, 1]``; per-agent ``done`` / ``terminated`` /
      ``truncated`` ``[*B, n, 1]`` (``truncated`` always False);
    - ``"state"`` ``[*B, n * num_cues + 1]``: every acting agent's current cue one-hot
      (zeros for masked agents) and the row's step count divided by its episode length;
    - env-level ``"done"`` / ``"terminated"`` / ``"truncated"`` ``[*B, 1]``.

    Known answers: an agent with memory scores 1.0 per episode of its own; a memoryless
    one sees the same query whatever its cue and scores ``1 / num_cues`` in expectation.
    A row's episode lasts ``max(max(lengths), step + lengths[agent])`` steps (``reenter``
    adds the second term).

    Args:
        batch_size: env batch shape ``B``. Default ``()``.
        n_agents: number of agents ``n`` (>= 1).
        num_cues: number of cues (= actions, >= 2).
        lengths: each agent's episode length (>= 2 steps: cue ... query), an int, one per
            agent (``[n]``) or one per row and agent (``[*B, n]``). Default
            ``(n + 1, n, ..., 2)``: agent ``i`` finishes at step ``n - i`` (0-based).
        reenter: ``(agent, step)``: that agent re-enters at env step ``step`` (``step >=``
            its length in every row), or ``None``.
        group: the group key.
        device: device of every tensor.

    Examples:
        >>> env = MultiAgentRecallEnv(batch_size=(2,), n_agents=2, lengths=(3, 2))
        >>> _ = env.set_seed(0)
        >>> data = env.rollout(3)
        >>> data["agents", "mask"].squeeze(-1)[0].tolist()  # agent 1 acts twice
        [[True, True], [True, True], [True, False]]
        >>> data["next", "agents", "done"].squeeze(-1)[0].tolist()
        [[False, False], [False, True], [True, True]]
        >>> data["next", "done"].squeeze(-1).tolist()
        [[False, False, True], [False, False, True]]
        >>> data["agents", "observation"].shape, data["state"].shape
        (torch.Size([2, 3, 2, 5]), torch.Size([2, 3, 5]))
    """

    def __init__(
        self,
        batch_size: Sequence[int] = (),
        n_agents: int = 3,
        num_cues: int = 2,
        lengths: int | Sequence[int] | torch.Tensor | None = None,
        reenter: tuple[int, int] | None = None,
        group: str = DEFAULT_GROUP,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__(device=device, batch_size=batch_size)
        if n_agents < 1 or num_cues < 2:
            raise ValueError(
                f"MultiAgentRecallEnv: expected n_agents >= 1 and num_cues >= 2, received "
                f"n_agents={n_agents}, num_cues={num_cues}."
            )
        b, n = self.batch_size, n_agents
        self.n_agents, self.num_cues, self.group = n_agents, num_cues, group
        if lengths is None:
            lengths = [n + 1 - i for i in range(n)]
        self.lengths = _lengths(lengths, (*b, n)).to(self.device)
        self.reenter = _check_reenter(reenter, self.lengths, n)
        self.episode_length = self.lengths.max(-1).values
        if self.reenter is not None:
            agent, step = self.reenter
            self.episode_length = torch.maximum(
                self.episode_length, step + self.lengths[..., agent]
            )
        self.obs_dim = num_cues + 1 + n
        specs = multiagent_specs(
            b,
            {group: (n, Unbounded(self.obs_dim), Categorical(num_cues))},
            state_dim=n * num_cues + 1,
            device=self.device,
        )
        self.observation_spec = specs["observation"]
        self.full_action_spec = specs["action"]
        self.full_reward_spec = specs["reward"]
        self.done_spec = specs["done"]
        self.generator = torch.Generator(device=self.device)
        zeros = torch.zeros((*b, n), dtype=torch.int64, device=self.device)
        self.t = torch.zeros(b, dtype=torch.int64, device=self.device)
        self.cue, self.start = zeros.clone(), zeros.clone()
        self.alive = torch.ones((*b, n), dtype=torch.bool, device=self.device)
        #: ``[*B, n]`` int64: actions used as moves, per agent (masked agents' are not)
        self.actions_taken = zeros.clone()

    # --- internals -----------------------------------------------------------------------
    def _draw_cues(self) -> torch.Tensor:
        shape = (*self.batch_size, self.n_agents)
        return torch.randint(0, self.num_cues, shape, generator=self.generator, device=self.device)

    def _local_step(self) -> torch.Tensor:
        return self.t.unsqueeze(-1) - self.start

    def _outputs(self) -> dict[str, Any]:
        local = self._local_step()
        alive = self.alive
        cue = torch.nn.functional.one_hot(self.cue, self.num_cues).to(torch.float32)
        cue = cue * ((local == 0) & alive).unsqueeze(-1)
        query = ((local == self.lengths - 1) & alive).to(torch.float32).unsqueeze(-1)
        ident = torch.eye(self.n_agents, device=self.device).expand(*alive.shape, -1)
        ident = ident * alive.unsqueeze(-1)
        obs = torch.cat([cue, query, ident], -1)
        held = torch.nn.functional.one_hot(self.cue, self.num_cues).to(torch.float32)
        held = (held * alive.unsqueeze(-1)).flatten(-2)
        frac = (self.t.to(torch.float32) / self.episode_length).unsqueeze(-1)
        gb = (*self.batch_size, self.n_agents)
        agents = TensorDict(
            {"observation": obs, "mask": alive.unsqueeze(-1).clone()}, batch_size=gb
        )
        return {self.group: agents, "state": torch.cat([held, frac], -1)}

    # --- hooks ---------------------------------------------------------------------------
    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        mask = get_reset_mask(tensordict, self.batch_size)
        cues = self._draw_cues()
        if mask is None:
            mask = torch.ones(self.batch_size, dtype=torch.bool, device=self.device)
        rows = mask.unsqueeze(-1)
        self.t = torch.where(mask, 0, self.t)
        self.cue = torch.where(rows, cues, self.cue)
        self.start = torch.where(rows, 0, self.start)
        self.alive = self.alive | rows
        out = self._outputs()
        flags = torch.zeros(
            (*self.batch_size, self.n_agents, 1), dtype=torch.bool, device=self.device
        )
        out[self.group].update(
            {"done": flags, "terminated": flags.clone(), "truncated": flags.clone()}
        )
        return TensorDict(out, batch_size=self.batch_size, device=self.device)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get((self.group, "action"))
        acting = self.alive
        self.actions_taken = self.actions_taken + acting.to(torch.int64)
        scored = acting & (self._local_step() == self.lengths - 1)
        reward = (scored & (action == self.cue)).to(torch.float32).unsqueeze(-1)
        self.t = self.t + 1
        self.alive = acting & ~scored
        if self.reenter is not None:
            agent, step = self.reenter
            back = self.t == step
            fresh = self._draw_cues()[..., agent]
            self.cue[..., agent] = torch.where(back, fresh, self.cue[..., agent])
            self.start[..., agent] = torch.where(back, step, self.start[..., agent])
            self.alive[..., agent] |= back
        # an agent re-entering at once is done (its episode ended) and acts again
        finished = (~self.alive | scored).unsqueeze(-1)
        ended = (self.t >= self.episode_length).unsqueeze(-1)
        out = self._outputs()
        out[self.group].update(
            {
                "reward": reward,
                "done": finished,
                "terminated": finished.clone(),
                "truncated": torch.zeros_like(finished),
            }
        )
        out.update({"done": ended, "terminated": ended.clone(), "truncated": ended & False})
        return TensorDict(out, batch_size=self.batch_size, device=self.device)

    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            self.generator.manual_seed(seed)


def _lengths(value: Any, shape: tuple[int, ...]) -> torch.Tensor:
    tensor = torch.as_tensor(value, dtype=torch.int64)
    try:
        tensor = tensor.expand(shape).clone()
    except RuntimeError as err:
        raise ValueError(
            f"MultiAgentRecallEnv lengths: expected an int, one per agent or one per row and "
            f"agent (shape {shape}), received shape {tuple(tensor.shape)}."
        ) from err
    if (tensor < 2).any():
        raise ValueError(
            f"MultiAgentRecallEnv: expected lengths >= 2 (a cue step and a query step), "
            f"received {tensor.tolist()}."
        )
    return tensor


def _check_reenter(
    reenter: tuple[int, int] | None, lengths: torch.Tensor, n: int
) -> tuple[int, int] | None:
    if reenter is None:
        return None
    agent, step = (int(v) for v in reenter)
    if not 0 <= agent < n:
        raise ValueError(
            f"MultiAgentRecallEnv reenter: expected an agent index in [0, {n}), received {agent}."
        )
    first = int(lengths[..., agent].max())
    if step < first:
        raise ValueError(
            f"MultiAgentRecallEnv reenter: agent {agent} acts until step {first - 1} (its "
            f"length), so it can re-enter at step >= {first}; received step {step}."
        )
    return agent, step
