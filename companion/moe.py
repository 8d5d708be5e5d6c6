"""Mixture-of-experts feed-forward layer (chapter 9).

y = sum_{e in TopK(x)} g_e(x) E_e(x) + sum_s S_s(x)     (Shazeer et al. 2017; Mixtral; DeepSeekMoE)

- N routed experts E_e (SwiGLU FFNs), of which each token uses its top k by router score.
- Router: "softmax" (Mixtral: p = softmax(x W_r), gates = the top-k p renormalised to sum 1) or
  "sigmoid" (DeepSeek-V3: s = sigmoid(x W_r), gates = the top-k s renormalised).
- DeepSeek-V3 routing options: ``n_groups`` / ``topk_groups`` (group-limited routing: the experts
  are split into n_groups equal groups, each group is scored by the sum of its two best selection
  scores, and a token picks its top k only among the experts of its topk_groups best groups),
  ``norm_topk_prob`` (renormalise the k gates to sum 1, or keep the raw scores: Qwen2-MoE,
  DeepSeek-V2, and the Switch Transformer's top 1, y = p_e E_e(x); with k = 1 renormalising makes
  every gate p_e / p_e = 1, so the loss gives the router no gradient: use norm_topk_prob=False) and ``routed_scaling_factor`` (the gates are multiplied by it, 2.5 in DeepSeek-V3,
  so that the routed experts' sum is not dwarfed by the shared expert's).
- gpt-oss: ``router_bias`` (a learned bias on the router logits, part of the score, unlike the
  balancing bias) and ``expert="clamped_swiglu"`` (``companion.feedforward.ClampedSwiGLU``). Its
  softmax over the k chosen logits equals the softmax over all E renormalised over the k.
- Optional shared experts S_s that every token uses (DeepSeekMoE): common knowledge lives there,
  so routed experts can specialise.
- Load balancing, two ways:
  * auxiliary loss L_aux = alpha * N * sum_e f_e P_e (Switch Transformer), f_e = fraction of the
    token-to-expert assignments that went to e, P_e = mean router probability of e. It is minimal
    (= alpha) when both are uniform. Read it from ``aux_loss`` after a forward and add it to the loss.
  * bias balancing (DeepSeek-V3, "auxiliary-loss-free"): a per-expert bias b_e is added to the scores
    for choosing the top k only (never to the gate values); after each step ``update_bias()`` moves
    b_e by -gamma for overloaded and +gamma for underloaded experts.
- ``last_load``: tokens per expert in the last forward (the per-expert load report).
- ``load_imbalance(load)``: max_e load_e / mean_e load_e of such a report: 1 when balanced, E when
  one expert takes every assignment (chapter 9 compares the balancing methods by it).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from companion.feedforward import ClampedSwiGLU, SwiGLU

__all__ = ["MoE", "ROUTERS", "EXPERTS", "load_imbalance"]

ROUTERS = ("softmax", "sigmoid")
EXPERTS = ("swiglu", "clamped_swiglu")  # SwiGLU (Mixtral, DeepSeek, Qwen) or gpt-oss's clamped one, with biases


def load_imbalance(load: Tensor) -> Tensor:
    """load (..., E) assignments per expert -> (...,) max_e load_e / mean_e load_e.

    1 for a perfectly even load, E when one expert receives everything: the factor by which the
    busiest expert exceeds its fair share, which is what sets an expert-parallel layer's speed."""
    if not isinstance(load, Tensor) or load.dim() < 1 or load.shape[-1] < 1:
        raise ValueError(f"load must be a tensor (..., E) with E >= 1 experts; got {getattr(load, 'shape', load)!r}")
    if bool((load < 0).any()) or bool((load.sum(-1) <= 0).any()):
        raise ValueError("load must be non-negative counts with at least one assignment per row")
    load = load.to(torch.float64)
    return load.amax(-1) / load.mean(-1)


class MoE(nn.Module):
    """Top-k routed SwiGLU experts with optional shared experts and load balancing (see module doc)."""

    def __init__(
        self,
        d: int,
        d_ff: int,
        n_experts: int,
        top_k: int,
        *,
        n_shared: int = 0,
        d_ff_shared: int | None = None,
        router: str = "softmax",
        bias_balancing: bool = False,
        bias_update_rate: float = 1e-3,
        aux_loss_coef: float = 0.01,
        n_groups: int = 1,
        topk_groups: int | None = None,
        norm_topk_prob: bool = True,
        routed_scaling_factor: float = 1.0,
        router_bias: bool = False,
        expert: str = "swiglu",
    ):
        super().__init__()
        if n_experts < 1:
            raise ValueError(f"n_experts must be >= 1; got {n_experts}")
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must satisfy 1 <= top_k <= n_experts ({n_experts}); got {top_k}")
        if n_shared < 0:
            raise ValueError(f"n_shared must be >= 0; got {n_shared}")
        if router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}; got {router!r}")
        topk_groups = n_groups if topk_groups is None else topk_groups
        if n_groups < 1 or n_experts % n_groups:
            raise ValueError(f"n_groups must be >= 1 and divide n_experts ({n_experts}); got {n_groups}")
        if n_groups > 1 and n_experts // n_groups < 2:
            raise ValueError(f"n_groups={n_groups}: a group is scored by its two best experts, so it needs >= 2 experts")
        if not 1 <= topk_groups <= n_groups:
            raise ValueError(f"topk_groups must satisfy 1 <= topk_groups <= n_groups ({n_groups}); got {topk_groups}")
        if top_k > topk_groups * (n_experts // n_groups):
            raise ValueError(f"top_k ({top_k}) exceeds the experts of the topk_groups={topk_groups} chosen groups")
        if expert not in EXPERTS:
            raise ValueError(f"expert must be one of {EXPERTS}; got {expert!r}")
        if routed_scaling_factor <= 0:
            raise ValueError(f"routed_scaling_factor must be > 0; got {routed_scaling_factor}")
        self.d, self.n_experts, self.top_k, self.router_kind = d, n_experts, top_k, router
        self.n_groups, self.topk_groups = n_groups, topk_groups
        self.norm_topk_prob, self.routed_scaling_factor = norm_topk_prob, routed_scaling_factor
        self.aux_loss_coef, self.bias_update_rate, self.bias_balancing = aux_loss_coef, bias_update_rate, bias_balancing
        self.router = nn.Linear(d, n_experts, bias=router_bias)
        self.expert_kind = expert
        make = ClampedSwiGLU if expert == "clamped_swiglu" else SwiGLU
        self.experts = nn.ModuleList(make(d, d_ff) for _ in range(n_experts))
        self.shared = nn.ModuleList(SwiGLU(d, d_ff_shared or d_ff) for _ in range(n_shared))
        # Balancing bias: state, not a learned parameter (it is moved by a rule, not by gradients).
        self.register_buffer("balance_bias", torch.zeros(n_experts))
        self.register_buffer("last_load", torch.zeros(n_experts))
        self.aux_loss: Tensor = torch.zeros(())

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (N, d) -> (expert ids (N, k), gates (N, k), router probabilities (N, E))."""
        logits = self.router(x.to(self.router.weight.dtype))  # (N, E); a router kept in float32 routes in it
        if self.router_kind == "softmax":
            probs = logits.softmax(dim=-1)
            scores = probs
        else:
            scores = torch.sigmoid(logits)
            probs = scores / scores.sum(dim=-1, keepdim=True)  # only for the auxiliary loss
        choice = scores + self.balance_bias if self.bias_balancing else scores  # bias steers selection only
        if self.topk_groups < self.n_groups:
            choice = self._limit_to_groups(choice)
        ids = choice.topk(self.top_k, dim=-1).indices  # (N, k)
        gates = scores.gather(-1, ids)
        if self.norm_topk_prob:
            gates = gates / gates.sum(dim=-1, keepdim=True)
        return ids, gates * self.routed_scaling_factor, probs

    def _limit_to_groups(self, choice: Tensor) -> Tensor:
        """choice (N, E) -> the same with -inf outside each token's topk_groups best groups, a group's
        score being the sum of its two highest selection scores (DeepSeek-V3's node-limited routing)."""
        N, G = choice.shape[0], self.n_groups
        grouped = choice.view(N, G, self.n_experts // G)
        group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (N, G)
        best = group_score.topk(self.topk_groups, dim=-1).indices  # (N, topk_groups)
        keep = torch.zeros(N, G, dtype=torch.bool, device=choice.device).scatter(1, best, True)
        return grouped.masked_fill(~keep[:, :, None], float("-inf")).view(N, self.n_experts)

    def forward(self, x: Tensor) -> Tensor:  # (..., d) -> (..., d)
        shape = x.shape
        xf = x.reshape(-1, shape[-1])  # (N, d): routing is per token
        ids, gates, probs = self.route(xf)
        y = torch.zeros_like(xf)
        for e, expert in enumerate(self.experts):
            token, slot = (ids == e).nonzero(as_tuple=True)
            if token.numel():
                y.index_add_(0, token, (gates[token, slot, None] * expert(xf[token])).to(y.dtype))
        for shared in self.shared:
            y = y + shared(xf)
        load = torch.bincount(ids.flatten(), minlength=self.n_experts).to(xf.dtype)  # (E,)
        self.last_load = load.detach()
        f = load / ids.numel()  # fraction of assignments per expert
        self.aux_loss = self.aux_loss_coef * self.n_experts * (f * probs.mean(dim=0)).sum()
        return y.reshape(shape)

    @torch.no_grad()
    def update_bias(self) -> None:
        """DeepSeek-V3 rule: b_e <- b_e + gamma * sign(mean load - load_e), from the last forward."""
        self.balance_bias += self.bias_update_rate * torch.sign(self.last_load.mean() - self.last_load)

    def extra_repr(self) -> str:
        return (
            f"experts={self.n_experts}, top_k={self.top_k}, shared={len(self.shared)}, router={self.router_kind}, "
            f"bias_balancing={self.bias_balancing}"
            + (f", groups={self.topk_groups}/{self.n_groups}" if self.n_groups > 1 else "")
            + ("" if self.norm_topk_prob else ", norm_topk_prob=False")
            + (f", scale={self.routed_scaling_factor:g}" if self.routed_scaling_factor != 1 else "")
        )
