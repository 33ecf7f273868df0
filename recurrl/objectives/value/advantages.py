"""Value estimators (GAE, TD(lambda)) that run a possibly recurrent critic in recurrent mode.

The critic runs over the whole batch in recurrent mode; the value of ``s_{t+1}`` comes from
the same pass where ``t + 1`` continues the trajectory, and from one sequential step on
``("next", ...)`` with the recomputed ``("next", h)`` at trajectory ends (see
``recurrl/objectives/value/_next_state.py``). The kernels live in
:mod:`recurrl.functional.returns`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torch import Tensor

from recurrl.functional.returns import (
    generalized_advantage_estimate,
    td_lambda_return_estimate,
)
from recurrl.modules.recurrent_mode import set_recurrent_mode
from recurrl.objectives.common import LossModule, masked_normalize, real_steps
from recurrl.objectives.value._next_state import state_keys_of, values_and_next_values

__all__ = ["GAE", "TDLambdaEstimator", "ValueEstimatorBase"]


def _check_coef(cls: str, name: str, value: float) -> float:
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{cls}: expected {name} in [0, 1], received {value!r}.")
    return float(value)


class ValueEstimatorBase(LossModule):
    """Shared plumbing: keys, the critic pass, and the ``[*B, T, 1]`` reward/flag reads."""

    @dataclass
    class _AcceptedKeys:
        """Key names. ``reward``/``done``/``terminated`` are read under ``"next"``."""

        advantage: NestedKey = "advantage"
        value_target: NestedKey = "value_target"
        value: NestedKey = "state_value"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"
        is_init: NestedKey = "is_init"
        mask: NestedKey = ("collector", "mask")

    def __init__(
        self,
        gamma: float,
        lmbda: float,
        value_network: TensorDictModuleBase,
        *,
        shifted: bool = False,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        self.gamma = _check_coef(name, "gamma", gamma)
        self.lmbda = _check_coef(name, "lmbda", lmbda)
        if not isinstance(shifted, bool):
            raise TypeError(f"{name}: expected shifted to be a bool, received {shifted!r}.")
        self.shifted = shifted
        if not isinstance(value_network, TensorDictModuleBase):
            raise ValueError(
                f"{name}: value_network must be a tensordict.nn module writing "
                f"{self.tensor_keys.value!r}, received {type(value_network).__name__}. Fix: "
                f"wrap it, TensorDictModule(net, in_keys=[...], out_keys=['state_value'])."
            )
        self.value_network = value_network

    def _next(self, key: NestedKey) -> tuple[str, ...]:
        return ("next", *((key,) if isinstance(key, str) else key))

    def _read(self, td: TensorDictBase, key: NestedKey) -> Tensor:
        x = td.get(key, None)
        if x is None:
            raise KeyError(f"{type(self).__name__}: key {key!r} not found in the TensorDict.")
        return x.unsqueeze(-1) if x.dim() == td.batch_dims else x

    def _flags_like(self, td: TensorDictBase, reward: Tensor, *tensors: Tensor) -> list[Tensor]:
        """Env-level ``[*B, T, 1]`` entries (flags, a value shared by the agents) for
        per-agent rewards ``[*B, T, n_agents, 1]``: the same for every agent of a row."""
        bd = td.batch_dims
        out = []
        for x in tensors:
            if x.shape != reward.shape and x.dim() == bd + 1 and reward.dim() == bd + 2:
                x = x.unsqueeze(bd).expand(reward.shape)
            out.append(x)
        return out

    def _inputs(self, td: TensorDictBase) -> tuple[Tensor, ...]:
        """``(value, next_value, reward, done, terminated)``, per agent where the reward is,
        and the time dim (``td.batch_dims - 1``) for the kernels."""
        k = self.tensor_keys
        v, nv = self._values(td)
        reward = self._read(td, self._next(k.reward))
        done = self._read(td, self._next(k.done))
        term = self._read(td, self._next(k.terminated))
        v2, nv2, done, term = self._flags_like(td, reward, v, nv, done, term)
        return v, v2, nv2, reward.to(v.dtype), done, term

    def _values(self, td: TensorDictBase) -> tuple[Tensor, Tensor]:
        if self.shifted:
            return self._values_shifted(td)
        k = self.tensor_keys
        with torch.no_grad():
            v, nv = values_and_next_values(
                self.value_network, td, k.value, is_init_key=k.is_init,
                done_key=self._next(k.done), what=type(self).__name__,
            )  # fmt: skip
        if v.dim() == td.batch_dims:
            v, nv = v.unsqueeze(-1), nv.unsqueeze(-1)
        return v, nv


    def _values_shifted(self, td: TensorDictBase) -> tuple[Tensor, Tensor]:
        """``shifted=True``: one recurrent-mode call over ``T + 1`` steps (the batch and its
        last ``("next", ...)`` step); the value of ``s_{t+1}`` is the output at ``t + 1``.

        That is the value of ``s_{t+1}`` only where step ``t + 1`` continues step ``t``'s
        trajectory, or where step ``t`` terminated (its next value is not used): a
        trajectory that ends otherwise inside a row (truncated, or an ``is_init`` without a
        done) raises instead of bootstrapping from the next episode's first value.
        """
        k = self.tensor_keys
        name = type(self).__name__
        if td.batch_dims < 1:
            raise ValueError(f"{name}: expected a TensorDict with a time dim, batch_size=[].")
        done = self._read(td, self._next(k.done)).bool()
        term = self._read(td, self._next(k.terminated)).bool()
        if done.dim() > td.batch_dims + 1:
            raise ValueError(
                f"{name}(shifted=True): the done flags {k.done!r} are per agent "
                f"{list(done.shape)}; shifted=True reads env-level flags [*B, T, 1] only. "
                f"Fix: shifted=False (the default)."
            )
        is_init = td.get(k.is_init, None)
        if is_init is None:
            if state_keys_of(self.value_network):
                raise KeyError(
                    f"{name}: key {k.is_init!r} not found; a recurrent critic needs it (written "
                    f"by InitTracker). Fix: collect with a recurrl Collector."
                )
            is_init = torch.zeros_like(done)
        starts = is_init.reshape(done.shape).bool().clone()
        starts[..., 1:, :] |= done[..., :-1, :]
        cut = starts[..., 1:, :] & ~term[..., :-1, :]
        if bool(cut.any()):
            raise ValueError(
                f"{name}(shifted=True): {int(cut.sum())} step(s) end a trajectory inside a row "
                f"without terminating (truncated, or followed by is_init): their next value is "
                f"not the following step's value, which shifted=True would use. Fix: "
                f"shifted=False (one extra network step at trajectory ends), or batches "
                f"whose rows end episodes only by termination."
            )
        tdim = td.batch_dims - 1
        last, nxt = td[..., -1:], td.get("next")[..., -1:]
        in_keys = getattr(self.value_network, "in_keys", None)
        if in_keys is None:
            in_keys = [key for key in td.keys(True, True) if key != "next" and key[0] != "next"]
        ext = TensorDict({}, batch_size=[*td.batch_size[:-1], td.batch_size[-1] + 1])
        for key in dict.fromkeys(in_keys):
            root = td.get(key, None)
            if root is None or key in (k.is_init, "is_init"):
                continue  # a missing input is reported by the network, naming it
            tail = nxt.get(key, None)
            ext.set(key, torch.cat([root, tail if tail is not None else last.get(key)], tdim))
        ext_starts = torch.cat([starts, torch.zeros_like(starts.narrow(tdim, 0, 1))], tdim)
        ext.set(k.is_init, ext_starts)
        ext.set("is_init", ext_starts)  # what recurrent modules read
        with torch.no_grad(), set_recurrent_mode(True):
            out = self.value_network(ext).get(k.value)
        t = td.batch_size[-1]
        v, nv = out.narrow(tdim, 0, t), out.narrow(tdim, 1, t)
        if v.dim() == td.batch_dims:
            v, nv = v.unsqueeze(-1), nv.unsqueeze(-1)
        return v, nv


class GAE(ValueEstimatorBase):
    """Generalized advantage estimation for a (possibly recurrent) critic.

    Writes ``"advantage"``, ``"value_target"`` and the critic's ``"state_value"`` (all
    ``[*B, T, 1]``, no gradient) into the input TensorDict and returns it.

    Args:
        gamma: discount.
        lmbda: GAE lambda.
        value_network: TensorDict module writing ``"state_value"`` ``[*B, 1]``; may contain
            ``LSTMModule``/``GRUModule`` (run in recurrent mode).

    Keyword Args:
        average_gae: normalize the advantage to zero mean, unit std (over real steps).
        shifted: compute the values of ``s_t`` and ``s_{t+1}`` with one call of the
            critic over ``T + 1`` steps (the batch and its last ``("next", ...)`` step), as
            the reference's ``shifted=True``: the same results where every trajectory that
            ends inside a row terminates; a row holding a truncation or an ``is_init``
            without a done raises ``ValueError`` (the reference would silently bootstrap
            from the next episode's first value). Default ``False``: the next value at a
            trajectory end comes from one extra critic step on ``("next", ...)``.

    Input keys: the critic's in_keys and ``("next", ...)`` in_keys, ``"is_init"``,
    ``("next", "reward"|"done"|"terminated")``, optionally ``("collector", "mask")``.

    Agents (MAPPO/IPPO, see :func:`~recurrl.objectives.multiagent_ppo_loss`): with the keys
    set to a group's per-agent entries (``reward=("agents", "reward")``, ``done=``,
    ``terminated=``, ``value=``, ``advantage=``, ``value_target=``, ``mask=``) rewards and
    flags are ``[*B, T, n_agents, 1]`` and GAE runs per agent (time is dim ``-3``), each
    agent's recursion cut at its own ``done``; env-level flags or values ``[*B, T, 1]`` hold
    for every agent of the row. ``average_gae`` normalizes over the steps where the mask
    (and ``("collector", "mask")``) is True.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> critic = TensorDictModule(torch.nn.Linear(2, 1), ["obs"], ["state_value"])
        >>> td = TensorDict({"obs": torch.randn(4, 5, 2),
        ...     "is_init": torch.zeros(4, 5, 1, dtype=torch.bool),
        ...     "next": {"obs": torch.randn(4, 5, 2), "reward": torch.ones(4, 5, 1),
        ...              "done": torch.zeros(4, 5, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(4, 5, 1, dtype=torch.bool)}}, [4, 5])
        >>> GAE(0.99, 0.95, critic)(td)["advantage"].shape
        torch.Size([4, 5, 1])
    """

    def __init__(
        self,
        gamma: float,
        lmbda: float,
        value_network: TensorDictModuleBase,
        *,
        average_gae: bool = False,
        shifted: bool = False,
    ) -> None:
        super().__init__(gamma, lmbda, value_network, shifted=shifted)
        self.average_gae = average_gae

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        k = self.tensor_keys
        v, v_all, nv, reward, done, term = self._inputs(tensordict)
        adv, target = generalized_advantage_estimate(
            self.gamma, self.lmbda, v_all, nv, reward, done, term,
            time_dim=tensordict.batch_dims - 1,
        )  # fmt: skip
        if self.average_gae:
            mask = real_steps(tensordict, k.mask, adv.shape[:-1])
            adv = masked_normalize(adv.squeeze(-1), mask).unsqueeze(-1)
        tensordict.set(k.advantage, adv)
        tensordict.set(k.value_target, target)
        tensordict.set(k.value, v)
        return tensordict


class TDLambdaEstimator(ValueEstimatorBase):
    """TD(lambda) value targets for a (possibly recurrent) critic.

    Writes ``"value_target"`` (the TD(lambda) return), ``"advantage"`` (``value_target -
    state_value``) and ``"state_value"``, all ``[*B, T, 1]`` without gradient.

    Args:
        gamma: discount.
        lmbda: lambda.
        value_network: TensorDict module writing ``"state_value"``.

    Keyword Args:
        shifted: one critic call over ``T + 1`` steps, as :class:`GAE`'s ``shifted``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> critic = TensorDictModule(lambda o: o.sum(-1, keepdim=True), ["obs"], ["state_value"])
        >>> td = TensorDict({"obs": torch.zeros(3, 1), "is_init": torch.zeros(3, 1).bool(),
        ...     "next": {"obs": torch.tensor([[0.0], [0.0], [10.0]]),
        ...              "reward": torch.ones(3, 1), "done": torch.zeros(3, 1).bool(),
        ...              "terminated": torch.zeros(3, 1).bool()}}, [3])
        >>> TDLambdaEstimator(0.5, 1.0, critic)(td)["value_target"].squeeze(-1)
        tensor([3., 4., 6.])
    """

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        k = self.tensor_keys
        v, v_all, nv, reward, done, term = self._inputs(tensordict)
        target = td_lambda_return_estimate(
            self.gamma, self.lmbda, nv, reward, done, term, time_dim=tensordict.batch_dims - 1
        )
        tensordict.set(k.value_target, target)
        tensordict.set(k.advantage, target - v_all)
        tensordict.set(k.value, v)
        return tensordict
