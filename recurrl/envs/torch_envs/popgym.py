"""popgym's RepeatPrevious, RepeatFirst and CountRecall memory tasks, N envs in tensor ops.

Each task deals cards from shuffled decks of 52 cards per deck; an env holds the sequence of
its card values (suit, colour or rank index) in dealing order, ``[N, C]``, and a step reads
column ``steps + 1``. Observations, actions, rewards, episode lengths and flags are popgym
1.0.7's (``popgym/envs/repeat_previous.py``, ``repeat_first.py``, ``count_recall.py``):
``tests/envs/torch_envs/test_popgym.py`` plays the same decks in both and compares them.
"""

from __future__ import annotations

import torch

from recurrl.envs.specs import Categorical, Composite, MultiCategorical
from recurrl.envs.torch_envs._base import TorchEnv

__all__ = ["CountRecallEnv", "RepeatFirstEnv", "RepeatPreviousEnv"]

DECK_SIZE = 52
SUITS, RANKS, COLORS = 4, 13, 2
DIFFICULTIES = ("easy", "medium", "hard")


def card_values(num_decks: int, kind: str) -> torch.Tensor:
    """``[52 * num_decks]`` int64: the value of each card of popgym's ``Deck(num_decks)``
    (card ``i``: suit ``i % 4``, rank ``(i // 4) % 13``, colour ``i % 2``).

    Examples:
        >>> card_values(1, "suits")[:6].tolist(), card_values(1, "ranks")[:6].tolist()
        ([0, 1, 2, 3, 0, 1], [0, 0, 0, 0, 1, 1])
    """
    card = torch.arange(DECK_SIZE * num_decks)
    if kind == "suits":
        return card % SUITS
    if kind == "ranks":
        return (card // SUITS) % RANKS
    if kind == "colors":
        return card % COLORS
    raise ValueError(f"card_values: expected kind 'suits', 'ranks' or 'colors', received {kind!r}.")


def _difficulty(cls: type, difficulty: str, table: dict[str, tuple]) -> tuple:
    if difficulty not in table:
        raise ValueError(
            f"{cls.__name__}: expected difficulty in {DIFFICULTIES}, received {difficulty!r}."
        )
    return table[difficulty]


class _CardEnv(TorchEnv):
    """A popgym card task: decks ``[N, C]`` of card values in dealing order, drawn at reset.

    popgym deals every episode from freshly shuffled decks and ends it when the decks are
    dealt: ``C - 1`` steps after the card shown at reset. No time limit by default.
    """

    state_names = ("decks",)

    def _setup_decks(self, values: torch.Tensor, count: int) -> None:
        """``count`` decks per env, each a shuffle of ``values`` (``[C]`` card values)."""
        self._values = values.to(device=self.device, dtype=torch.uint8)
        self.num_cards = int(values.numel())
        n = self.num_envs
        #: ``count`` tensors ``[N, C]`` uint8: the card values of each env in dealing order
        self.decks = [
            torch.zeros(n, self.num_cards, dtype=torch.uint8, device=self.device)
            for _ in range(count)
        ]

    def _draw_decks(self, rows: int) -> list[torch.Tensor]:
        """Fresh decks for ``rows`` envs: one ``[rows, C]`` shuffle of the card values per
        deck of the task, drawn with the env's generator (float64 keys: ties are
        practically impossible, so every ordering is equally likely)."""
        out = []
        for _ in self.decks:
            shape, device = (rows, self.num_cards), self.device
            keys = torch.rand(shape, generator=self.generator, dtype=torch.float64, device=device)
            out.append(self._values[keys.argsort(-1)])
        return out

    def _reset_decks(self, rows: torch.Tensor | None) -> None:
        fresh = self._draw_decks(self._count(rows))
        decks = [
            self._refill(deck, rows, new.to(device=self.device, dtype=torch.uint8))
            for deck, new in zip(self.decks, fresh, strict=True)
        ]
        self._put(decks=decks)

    def _card(self, deck: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
        """``[N]`` int64: ``deck[i, column[i]]``."""
        return deck.gather(1, column.unsqueeze(-1)).squeeze(-1).long()

    def _dealt_last(self) -> torch.Tensor:
        """``[N]`` bool: this step deals the last card (``steps`` is the count before it)."""
        return self.steps == self.num_cards - 2


class RepeatPreviousEnv(_CardEnv):
    """popgym's RepeatPrevious: answer the suit of the card dealt ``k`` steps ago.

    A card is dealt at reset and at every step; the observation is its suit. From the
    ``k``-th step on, the action scores ``+1 / (C - k)`` when it equals the suit shown
    ``k - 1`` steps before the observation it acts on (popgym's ``hand[-k]``; ``k = 1``:
    that observation's own suit), else ``-1 / (C - k)`` (0 before);
    ``C = 52 * num_decks`` cards, episodes of ``C - 1`` steps, the last one terminated.
    Difficulties (popgym's): easy 1 deck, ``k = 4``; medium 2 decks, ``k = 32``; hard 3
    decks, ``k = 64``.
    Partial resets, seeding and finished envs follow :class:`~recurrl.envs.GymVecEnv` (see
    :mod:`recurrl.envs.torch_envs`).

    - observation ``"observation"``: ``Categorical(4)`` ``[N]`` int64 (the suit);
    - action ``"action"``: ``Categorical(4)`` ``[N]``.

    Args:
        num_envs: number of envs ``N``.
        difficulty: ``"easy"``, ``"medium"`` or ``"hard"``.
        device: device of the state and of every tensor written (default cpu).
        seed: seed of the env's generator (the decks); ``None``: a random seed.
        max_episode_steps: optional time limit (popgym's envs have none).
        policy: see :class:`~recurrl.envs.EnvBase`.

    Examples:
        >>> env = RepeatPreviousEnv(2, seed=0)
        >>> td = env.reset()
        >>> td["observation"].shape, td["observation"].dtype
        (torch.Size([2]), torch.int64)
        >>> data = env.rollout(60)
        >>> data.batch_size, data["next", "terminated"][:, -1].squeeze(-1).tolist()
        (torch.Size([2, 51]), [True, True])
    """

    PARAMETERS = {"easy": (1, 4), "medium": (2, 32), "hard": (3, 64)}
    """difficulty -> (number of decks, k), as popgym's RepeatPrevious{Easy,Medium,Hard}."""

    def __init__(
        self,
        num_envs: int,
        difficulty: str = "easy",
        *,
        device: torch.device | str | None = None,
        seed: int | None = None,
        max_episode_steps: int | None = None,
    ) -> None:
        num_decks, k = _difficulty(type(self), difficulty, self.PARAMETERS)
        super().__init__(num_envs, device=device, seed=seed, max_episode_steps=max_episode_steps)
        self.difficulty, self.k = difficulty, k
        self._setup_decks(card_values(num_decks, "suits"), 1)
        self.reward_scale = 1.0 / (self.num_cards - k)
        self.observation_spec = Composite(
            observation=Categorical(SUITS, shape=(num_envs,)), shape=(num_envs,)
        )
        self.action_spec = Categorical(SUITS, shape=(num_envs,))

    def _reset_envs(self, rows: torch.Tensor | None) -> torch.Tensor:
        self._reset_decks(rows)
        return self.decks[0][:, 0].long()

    def _advance(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        (deck,) = self.decks
        new = self.steps + 1  # the card dealt now; cards 0..steps were dealt before
        scored = new >= self.k
        target = self._card(deck, (new - self.k).clamp_min(0))
        scale = self.reward_scale
        reward = torch.where(action == target, scale, -scale).masked_fill(~scored, 0.0)
        terminated = self._dealt_last()
        return self._card(deck, new), reward.unsqueeze(-1), terminated

    def extra_repr(self) -> str:
        return f"difficulty={self.difficulty!r}, {super().extra_repr()}"


class RepeatFirstEnv(_CardEnv):
    """popgym's RepeatFirst: answer the suit of the card dealt at reset, at every step.

    A card is dealt at reset and at every step; the observation is its suit. Every action
    scores ``+1 / (C - 1)`` when it equals the suit of the first card, else ``-1 / (C - 1)``;
    ``C = 52 * num_decks`` cards, episodes of ``C - 1`` steps, the last one terminated.
    Difficulties (popgym's): easy 1 deck, medium 8, hard 16.
    Partial resets, seeding and finished envs follow :class:`~recurrl.envs.GymVecEnv` (see
    :mod:`recurrl.envs.torch_envs`).

    - observation ``"observation"``: ``Categorical(4)`` ``[N]`` int64 (the suit);
    - action ``"action"``: ``Categorical(4)`` ``[N]``.

    Args:
        num_envs: number of envs ``N``.
        difficulty: ``"easy"``, ``"medium"`` or ``"hard"``.
        device: device of the state and of every tensor written (default cpu).
        seed: seed of the env's generator (the decks); ``None``: a random seed.
        max_episode_steps: optional time limit (popgym's envs have none).
        policy: see :class:`~recurrl.envs.EnvBase`.

    Examples:
        >>> env = RepeatFirstEnv(2, seed=0)
        >>> td = env.reset()
        >>> td["action"] = td["observation"]  # always answer the first suit
        >>> env.step(td)["next", "reward"] * 51
        tensor([[1.],
                [1.]])
    """

    PARAMETERS = {"easy": (1,), "medium": (8,), "hard": (16,)}
    """difficulty -> (number of decks,), as popgym's RepeatFirst{Easy,Medium,Hard}."""

    def __init__(
        self,
        num_envs: int,
        difficulty: str = "easy",
        *,
        device: torch.device | str | None = None,
        seed: int | None = None,
        max_episode_steps: int | None = None,
    ) -> None:
        (num_decks,) = _difficulty(type(self), difficulty, self.PARAMETERS)
        super().__init__(num_envs, device=device, seed=seed, max_episode_steps=max_episode_steps)
        self.difficulty = difficulty
        self._setup_decks(card_values(num_decks, "suits"), 1)
        self.reward_scale = 1.0 / (self.num_cards - 1)
        self.observation_spec = Composite(
            observation=Categorical(SUITS, shape=(num_envs,)), shape=(num_envs,)
        )
        self.action_spec = Categorical(SUITS, shape=(num_envs,))

    def _reset_envs(self, rows: torch.Tensor | None) -> torch.Tensor:
        self._reset_decks(rows)
        return self.decks[0][:, 0].long()

    def _advance(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        (deck,) = self.decks
        scale = self.reward_scale
        reward = torch.where(action == deck[:, 0], scale, -scale)
        terminated = self._dealt_last()
        return self._card(deck, self.steps + 1), reward.unsqueeze(-1), terminated

    def extra_repr(self) -> str:
        return f"difficulty={self.difficulty!r}, {super().extra_repr()}"


class CountRecallEnv(_CardEnv):
    """popgym's CountRecall: how many cards of the queried value were dealt so far?

    Two decks are dealt one card each at reset and at every step: a value card and a query
    card. The observation is ``(value, query)`` of the new cards. The action answers the
    previous query: it scores ``+1 / (C - 1)`` when it equals the number of value cards
    dealt before this step whose value is the previous query's, else ``-1 / (C - 1)``;
    ``C = 52 * num_decks`` cards per deck, episodes of ``C - 1`` steps, the last one
    terminated. Difficulties (popgym's): easy 1 deck of colours (2 values), medium 2 decks
    of suits (4), hard 4 decks of ranks (13); the action counts up to ``C / values``.
    Partial resets, seeding and finished envs follow :class:`~recurrl.envs.GymVecEnv` (see
    :mod:`recurrl.envs.torch_envs`).

    - observation ``"observation"``: ``MultiCategorical([V, V])`` ``[N, 2]`` int64;
    - action ``"action"``: ``Categorical(C / V + 1)`` ``[N]`` (27, 27, 17).

    Args:
        num_envs: number of envs ``N``.
        difficulty: ``"easy"``, ``"medium"`` or ``"hard"``.
        device: device of the state and of every tensor written (default cpu).
        seed: seed of the env's generator (the decks); ``None``: a random seed.
        max_episode_steps: optional time limit (popgym's envs have none).
        policy: see :class:`~recurrl.envs.EnvBase`.

    Attributes:
        counts: ``[N, V]`` int64, the value cards dealt so far per value.

    Examples:
        >>> env = CountRecallEnv(2, "hard", seed=0)
        >>> env.observation_spec["observation"].nvec.tolist(), env.action_spec.n
        ([13, 13], 17)
        >>> td = env.reset()
        >>> query = td["observation"][:, 1]
        >>> td["action"] = env.counts.gather(1, query.unsqueeze(-1)).squeeze(-1)
        >>> env.step(td)["next", "reward"] * 207
        tensor([[1.],
                [1.]])
    """

    PARAMETERS = {"easy": (1, "colors"), "medium": (2, "suits"), "hard": (4, "ranks")}
    """difficulty -> (number of decks, card value), as popgym's CountRecall{Easy,...}."""

    state_names = ("decks", "counts")

    def __init__(
        self,
        num_envs: int,
        difficulty: str = "easy",
        *,
        device: torch.device | str | None = None,
        seed: int | None = None,
        max_episode_steps: int | None = None,
    ) -> None:
        num_decks, kind = _difficulty(type(self), difficulty, self.PARAMETERS)
        super().__init__(num_envs, device=device, seed=seed, max_episode_steps=max_episode_steps)
        self.difficulty = difficulty
        values = card_values(num_decks, kind)
        self.num_values = int(values.max()) + 1
        self._setup_decks(values, 2)  # the value deck and the query deck
        self.reward_scale = 1.0 / (self.num_cards - 1)
        self.counts = torch.zeros(num_envs, self.num_values, dtype=torch.int64, device=self.device)
        self.observation_spec = Composite(
            observation=MultiCategorical([self.num_values] * 2, shape=(num_envs, 2)),
            shape=(num_envs,),
        )
        self.action_spec = Categorical(self.num_cards // self.num_values + 1, shape=(num_envs,))

    def _reset_envs(self, rows: torch.Tensor | None) -> torch.Tensor:
        self._reset_decks(rows)
        values, queries = self.decks
        value, query = values[:, 0].long(), queries[:, 0].long()
        fresh = torch.nn.functional.one_hot(value if rows is None else value[rows], self.num_values)
        self._put(counts=self._refill(self.counts, rows, fresh))
        return torch.stack((value, query), -1)

    def _advance(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        values, queries = self.decks
        asked = self._card(queries, self.steps)  # the query the action answers
        answer = self.counts.gather(1, asked.unsqueeze(-1)).squeeze(-1)
        new = self.steps + 1
        value, query = self._card(values, new), self._card(queries, new)
        dealt = value.unsqueeze(-1)
        self._put(counts=self.counts.scatter_add(1, dealt, torch.ones_like(dealt)))
        scale = self.reward_scale
        reward = torch.where(action == answer, scale, -scale)
        terminated = self._dealt_last()
        return torch.stack((value, query), -1), reward.unsqueeze(-1), terminated

    def extra_repr(self) -> str:
        return f"difficulty={self.difficulty!r}, {super().extra_repr()}"
