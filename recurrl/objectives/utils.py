"""Target-network updaters: ``HardUpdate`` (periodic copy) and ``SoftUpdate`` (Polyak)."""

from __future__ import annotations

import torch

from recurrl.objectives.common import LossModule

__all__ = ["HardUpdate", "SoftUpdate", "TargetNetUpdater"]


class TargetNetUpdater:
    """Base of the updaters: syncs every ``(online, target)`` pair a loss declares."""

    def __init__(self, loss_module: LossModule) -> None:
        pairs = loss_module._target_network_pairs()
        if not pairs:
            raise ValueError(
                f"{type(self).__name__}: {type(loss_module).__name__} has no target network. "
                f"Fix: build the loss with delay_value=True."
            )
        self.loss_module = loss_module
        self._pairs = pairs

    def _params(self):
        for online, target in self._pairs:
            src = dict(online.named_parameters())
            src.update(online.named_buffers())
            dst = dict(target.named_parameters())
            dst.update(target.named_buffers())
            for name, p in dst.items():
                yield src[name], p

    @torch.no_grad()
    def init_(self) -> None:
        """Copy the online weights into the target network."""
        for src, dst in self._params():
            dst.copy_(src)

    def step(self) -> None:
        """Call once per optimizer step."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement step(), the hook of a "
            f"TargetNetUpdater. Fix: use SoftUpdate or HardUpdate, or define step()."
        )


class HardUpdate(TargetNetUpdater):
    """Copy the online weights into the target every ``value_network_update_interval`` steps.

    Examples:
        >>> import torch
        >>> from tensordict.nn import TensorDictModule
        >>> from recurrl.objectives import DQNLoss
        >>> q = TensorDictModule(torch.nn.Linear(2, 3), ["obs"], ["action_value"])
        >>> loss = DQNLoss(q)
        >>> updater = HardUpdate(loss, value_network_update_interval=2)
        >>> with torch.no_grad():
        ...     _ = q.module.weight.add_(1.0)
        >>> updater.step(); bool((loss.target_value_network.module.weight == q.module.weight).all())
        False
        >>> updater.step(); bool((loss.target_value_network.module.weight == q.module.weight).all())
        True
    """

    def __init__(self, loss_module: LossModule, *, value_network_update_interval: int = 1000):
        super().__init__(loss_module)
        if value_network_update_interval < 1:
            raise ValueError(
                f"HardUpdate: expected value_network_update_interval >= 1, received "
                f"{value_network_update_interval!r}."
            )
        self.value_network_update_interval = int(value_network_update_interval)
        self.counter = 0

    def step(self) -> None:
        self.counter += 1
        if self.counter % self.value_network_update_interval == 0:
            self.init_()


class SoftUpdate(TargetNetUpdater):
    """Polyak averaging after every step: ``target <- (1 - tau) * target + tau * online``.

    Keyword Args:
        tau: weight of the online network, in ``(0, 1]``. Default 0.005 (when ``eps`` is not
            given either).
        eps: the reference's other spelling, the weight kept by the target:
            ``eps = 1 - tau``, in ``[0, 1)``. Exclusive with ``tau``.

    Examples:
        >>> import torch
        >>> from tensordict.nn import TensorDictModule
        >>> from recurrl.objectives import DQNLoss
        >>> q = TensorDictModule(torch.nn.Linear(1, 1, bias=False), ["obs"], ["action_value"])
        >>> loss = DQNLoss(q)
        >>> with torch.no_grad():
        ...     _ = q.module.weight.fill_(1.0)
        ...     _ = loss.target_value_network.module.weight.fill_(0.0)
        >>> SoftUpdate(loss, tau=0.1).step()
        >>> loss.target_value_network.module.weight
        Parameter containing:
        tensor([[0.1000]])
        >>> round(SoftUpdate(loss, eps=0.95).tau, 12)  # the reference's spelling: tau = 1 - eps
        0.05
    """

    def __init__(
        self, loss_module: LossModule, *, tau: float | None = None, eps: float | None = None
    ) -> None:
        super().__init__(loss_module)
        if tau is not None and eps is not None:
            raise ValueError(
                f"SoftUpdate: expected one of tau and eps (eps = 1 - tau), received tau={tau!r} "
                f"and eps={eps!r}."
            )
        if eps is not None:
            if not 0.0 <= eps < 1.0:
                raise ValueError(
                    f"SoftUpdate: expected eps (the target's weight) in [0, 1), received {eps!r}."
                )
            tau = 1.0 - eps
        tau = 0.005 if tau is None else tau
        if not 0.0 < tau <= 1.0:
            raise ValueError(f"SoftUpdate: expected tau in (0, 1], received {tau!r}.")
        self.tau = float(tau)

    @torch.no_grad()
    def step(self) -> None:
        for src, dst in self._params():
            if dst.dtype.is_floating_point:
                dst.lerp_(src, self.tau)
            else:
                dst.copy_(src)
