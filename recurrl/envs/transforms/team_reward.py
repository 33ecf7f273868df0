"""TeamReward: one env-level reward from the rewards of an agent group."""

from __future__ import annotations

from typing import Literal

from tensordict import NestedKey, TensorDictBase
from tensordict.utils import unravel_key

from recurrl.envs.specs import Composite, Unbounded
from recurrl.envs.transforms.transform import Transform

__all__ = ["TeamReward"]

_REDUCTIONS = ("mean", "sum")


class TeamReward(Transform):
    """Write an env-level reward ``[*B, 1]``: the mean (or sum) over the agents of a group of
    their rewards ``(group, "reward")`` ``[*B, n_agents, 1]``.

    Multi-agent envs reward each agent (``("next", group, "reward")``); what a person reads
    as "the return of an episode" is one number per env row. With this transform the usual
    single-agent tools apply to the team: :class:`~recurrl.envs.RewardSum` after it sums the
    team reward into ``("next", "episode_reward")``, and ``recurrl train`` / ``recurrl eval``
    report it. The mean runs over all ``n_agents`` agents (an agent that is not acting has
    reward 0 there), so the scale does not change when agents leave. The per-agent rewards
    are left as they are: multi-agent losses learn from them.

    Args:
        group: the agent group whose rewards are reduced. Default: ``"agents"``.
        reduction: ``"mean"`` (default) or ``"sum"`` over the agents.
        out_key: the env-level reward written. Default: ``"reward"``.

    Raises:
        ValueError: an unknown ``reduction``, or an ``out_key`` inside ``group``.
        KeyError: (when the env's specs are read) the env has no ``(group, "reward")``.

    Examples:
        >>> from recurrl.envs import TransformedEnv
        >>> from recurrl.testing import MultiAgentRecallEnv
        >>> env = TransformedEnv(MultiAgentRecallEnv(n_agents=2, batch_size=[3]), TeamReward())
        >>> data = env.rollout(3)  # the agents' episodes last 3 and 2 steps by default
        >>> data["next", "reward"].shape, data["next", "agents", "reward"].shape
        (torch.Size([3, 3, 1]), torch.Size([3, 3, 2, 1]))
        >>> bool((data["next", "reward"] == data["next", "agents", "reward"].mean(-2)).all())
        True
    """

    def __init__(
        self,
        group: str = "agents",
        reduction: Literal["mean", "sum"] = "mean",
        out_key: NestedKey = "reward",
    ) -> None:
        if reduction not in _REDUCTIONS:
            raise ValueError(
                f"TeamReward: reduction must be one of {_REDUCTIONS}, received {reduction!r}."
            )
        out = unravel_key(out_key)
        if (out[0] if isinstance(out, tuple) else out) == group:
            raise ValueError(
                f"TeamReward: out_key {out_key!r} is inside the group {group!r}, whose rewards "
                f"are per agent. Fix: an env-level key, e.g. out_key='reward'."
            )
        super().__init__(in_keys=[(group, "reward")], out_keys=[out])
        self.group = group
        self.reduction = reduction

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        rewards = next_tensordict.get(self.in_keys[0])  # [*B, n_agents, 1]
        team = rewards.mean(-2) if self.reduction == "mean" else rewards.sum(-2)
        next_tensordict.set(self.out_keys[0], team)
        return next_tensordict

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        spec = reward_spec.get(self.in_keys[0], None)
        if spec is None:
            raise KeyError(
                f"TeamReward: the env has no reward {self.in_keys[0]!r} (per-agent rewards of "
                f"the group {self.group!r}); reward keys: "
                f"{list(reward_spec.keys(include_nested=True, leaves_only=True))}. Fix: "
                f"TeamReward(group=...) naming one of the env's agent groups."
            )
        shape = reward_spec.shape
        reward_spec[self.out_keys[0]] = Unbounded(
            shape=(*shape, 1), dtype=spec.dtype, device=spec.device
        )
        return reward_spec

    def extra_repr(self) -> str:
        return f"group={self.group!r}, reduction={self.reduction!r}, out_key={self.out_keys[0]!r}"
