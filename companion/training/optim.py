"""Optimizers, parameter groups, gradient clipping and learning-rate schedules (training chapters).

What this module provides
- ``Adam``: Kingma & Ba (2015), with optional L2 regularisation (``weight_decay`` added to the gradient:
  "Adam + L2", what ``torch.optim.Adam(weight_decay=...)`` does).
- ``AdamW``: Loshchilov & Hutter (2019), decoupled weight decay (theta <- theta - lr * lambda * theta,
  outside the adaptive step), what ``torch.optim.AdamW`` does.
- ``build_optimizer(model, name, lr, weight_decay, ...)``: ``"adam"``, ``"adam_l2"`` or ``"adamw"`` on
  the parameter groups below.
- ``param_groups(model, weight_decay, decay_embeddings=True)``: two groups, with and without decay;
  biases, normalisation gains (every 1-D parameter) and optionally embeddings are exempt.
- ``clip_grad_norm(parameters, max_norm)``: rescale all gradients so their global L2 norm is at most
  ``max_norm``; returns the norm before clipping.
- Schedules, as picklable callables for ``torch.optim.lr_scheduler.LambdaLR`` (they return the factor
  that multiplies the base learning rate at step s = 0, 1, 2, ...):
  ``Noam(d_model, warmup)``: d^-1/2 * min(t^-1/2, t * w^-3/2), t = s + 1 (Vaswani et al. 2017, eq. 3);
  ``WarmupCosine(warmup, total, floor)``: linear warmup, then cosine decay to ``floor`` (a fraction);
  ``ConstantWithWarmup(warmup)``: linear warmup, then 1.
  ``scheduler(optimizer, schedule)`` wraps one in a LambdaLR.

The Adam update for a parameter theta with gradient g at step t (all operations elementwise):
    m_t = beta1 m_{t-1} + (1 - beta1) g          v_t = beta2 v_{t-1} + (1 - beta2) g^2
    m_hat = m_t / (1 - beta1^t)                   v_hat = v_t / (1 - beta2^t)
    theta <- theta - lr * m_hat / (sqrt(v_hat) + eps)
Adam + L2 replaces g by g + lambda theta before all of this, so the decay is divided by sqrt(v_hat)
like the gradient (parameters with large gradients are barely decayed). AdamW first shrinks
theta <- theta (1 - lr lambda) and then takes the plain Adam step, so every weight decays at the same rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

__all__ = [
    "Adam",
    "AdamW",
    "build_optimizer",
    "param_groups",
    "clip_grad_norm",
    "Noam",
    "WarmupCosine",
    "ConstantWithWarmup",
    "scheduler",
]


def _check_hyper(lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    if not lr >= 0:
        raise ValueError(f"lr must be >= 0; got {lr}")
    if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
        raise ValueError(f"betas must both be in [0, 1); got {betas}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0; got {eps}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0; got {weight_decay}")


class _AdamBase(torch.optim.Optimizer):
    decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        _check_hyper(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """One update of every parameter that has a gradient (equations in the module docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise ValueError("Adam does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                if wd != 0:
                    if self.decoupled:
                        p.mul_(1 - lr * wd)  # AdamW: shrink the weight itself
                    else:
                        grad = grad.add(p, alpha=wd)  # Adam + L2: decay enters the gradient
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                m_hat_scale = 1 / (1 - beta1**t)
                v_hat = v / (1 - beta2**t)
                p.addcdiv_(m, v_hat.sqrt_().add_(eps), value=-lr * m_hat_scale)
        return loss


class Adam(_AdamBase):
    """Adam; ``weight_decay`` > 0 gives Adam + L2 (decay added to the gradient), as torch.optim.Adam."""

    decoupled = False


class AdamW(_AdamBase):
    """AdamW: Adam with decoupled weight decay theta <- theta (1 - lr * weight_decay), as torch.optim.AdamW."""

    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def param_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = True) -> list[dict]:
    """``[{"params": decayed, "weight_decay": weight_decay}, {"params": exempt, "weight_decay": 0.0}]``.

    Exempt: every parameter with fewer than 2 dimensions (biases, LayerNorm/RMSNorm gains, scalar
    gates), and, when ``decay_embeddings`` is False, the weights of ``nn.Embedding`` modules (a weight
    tied between an embedding and the output layer counts as an embedding). Every trainable
    parameter lands in exactly one group; frozen ones (requires_grad=False) in none.
    """
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0; got {weight_decay}")
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, exempt = [], []
    for p in model.parameters():  # parameters() already yields a tied tensor once
        if not p.requires_grad:
            continue
        if p.dim() < 2 or (not decay_embeddings and id(p) in embedding_ids):
            exempt.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": exempt, "weight_decay": 0.0}]


OPTIMIZERS = ("adam", "adam_l2", "adamw")


def build_optimizer(model: nn.Module, name: str = "adamw", lr: float = 3e-4, weight_decay: float = 0.1,
                    betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                    decay_embeddings: bool = True) -> torch.optim.Optimizer:
    """``"adam"`` (no decay at all), ``"adam_l2"`` (Adam + L2) or ``"adamw"`` on ``param_groups(model, ...)``."""
    if name not in OPTIMIZERS:
        raise ValueError(f"name must be one of {list(OPTIMIZERS)}; got {name!r}")
    if name == "adam":
        return Adam(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=0.0)
    groups = param_groups(model, weight_decay, decay_embeddings=decay_embeddings)
    cls = Adam if name == "adam_l2" else AdamW
    return cls(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def clip_grad_norm(parameters: Iterable[Tensor] | Tensor, max_norm: float, eps: float = 1e-6) -> Tensor:
    """Scale every gradient by min(1, max_norm / (||g|| + eps)), ||g|| = sqrt(sum over all of g^2).

    Returns the global norm before clipping (a 0-d tensor), as torch.nn.utils.clip_grad_norm_ does.
    A non-finite norm is returned as it is and the gradients are left untouched, so the caller can
    skip the step.
    """
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0; got {max_norm}")
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    # FSDP's gradients are DTensors sharded across processes: square-sum this process's shards, then
    # all-reduce the sum over the shards' process group (||g||^2 is a sum over all elements).
    group = next((g.device_mesh.get_group() for g in grads if _sharded(g)), None)
    local = [g.to_local() if _sharded(g) else g for g in grads]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach(), 2.0) for g in local]), 2.0)
    if group is not None:
        import torch.distributed as dist

        squares = total.float() ** 2
        dist.all_reduce(squares, group=group)
        total = squares.sqrt()
    if not torch.isfinite(total):
        return total
    scale = torch.clamp(max_norm / (total + eps), max=1.0)
    for g in local:
        g.detach().mul_(scale.to(g.device, g.dtype))
    return total


def _sharded(t: Tensor) -> bool:
    """A DTensor split across processes (every placement a Shard), as fully_shard makes them."""
    placements = getattr(t, "placements", None)
    return placements is not None and all(p.is_shard() for p in placements)


class Noam:
    """Vaswani et al. (2017), eq. (3): factor(s) = d_model^-1/2 * min(t^-1/2, t * warmup^-3/2), t = s + 1.

    Rises linearly for ``warmup`` steps, peaks at (d_model * warmup)^-1/2, then decays as t^-1/2. The
    factor is the learning rate itself, so use it with a base lr of 1.0 (or a multiplier, as some
    implementations do).
    """

    def __init__(self, d_model: int, warmup: int = 4000):
        if d_model < 1:
            raise ValueError(f"d_model must be >= 1; got {d_model}")
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1; got {warmup}")
        self.d_model, self.warmup = d_model, warmup

    def __call__(self, step: int) -> float:
        t = step + 1
        return self.d_model**-0.5 * min(t**-0.5, t * self.warmup**-1.5)


class WarmupCosine:
    """Linear warmup to 1 over ``warmup`` steps, then cosine decay to ``floor`` at step ``total``; ``floor`` after.

    factor(s) = (s + 1) / warmup for s < warmup, else
    floor + (1 - floor) * (1 + cos(pi * p)) / 2 with p = min(1, (s - warmup) / (total - warmup)).
    """

    def __init__(self, warmup: int, total: int, floor: float = 0.1):
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0; got {warmup}")
        if total <= warmup:
            raise ValueError(f"total must be > warmup={warmup}; got {total}")
        if not 0 <= floor <= 1:
            raise ValueError(f"floor must be in [0, 1] (a fraction of the base lr); got {floor}")
        self.warmup, self.total, self.floor = warmup, total, floor

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / (self.total - self.warmup))
        return self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * progress))


class ConstantWithWarmup:
    """factor(s) = min(1, (s + 1) / warmup): linear warmup, then the base learning rate."""

    def __init__(self, warmup: int):
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0; got {warmup}")
        self.warmup = warmup

    def __call__(self, step: int) -> float:
        return 1.0 if step >= self.warmup else (step + 1) / self.warmup


def scheduler(optimizer: torch.optim.Optimizer, schedule: Callable[[int], float]) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR(optimizer, schedule)``: lr at step s = base lr * schedule(s); call ``.step()`` after each update."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
