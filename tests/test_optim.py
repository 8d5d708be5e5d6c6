"""companion.training.optim: Adam/AdamW against torch, Adam+L2 vs AdamW, parameter groups, clipping, schedules."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from companion.training import optim
from tolerances import float32_paths_atol, gamma, reduction_atol


def _run(cls_a, cls_b, steps=100, dtype=torch.float32, **kwargs):
    torch.manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    a = [torch.randn(s).to(dtype).requires_grad_() for s in shapes]
    b = [p.detach().clone().requires_grad_() for p in a]
    opt_a, opt_b = cls_a(a, **kwargs), cls_b(b, **kwargs)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p, q in zip(a, b):
            grad = (torch.randn(p.shape, generator=g) * 3).to(dtype)
            p.grad, q.grad = grad.clone(), grad.clone()
        opt_a.step()
        opt_b.step()
    return a, b


@pytest.mark.parametrize("ours, theirs, kwargs", [
    (optim.Adam, torch.optim.Adam, dict(lr=1e-2)),
    (optim.Adam, torch.optim.Adam, dict(lr=3e-3, betas=(0.8, 0.99), weight_decay=0.1)),
    (optim.AdamW, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    (optim.AdamW, torch.optim.AdamW, dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.5)),
])
def test_matches_torch_over_100_steps(ours, theirs, kwargs):
    a, b = _run(ours, theirs, **kwargs)
    # tolerances: two float32 runs of one update rule (torch orders it otherwise: lerp, addcdiv, the bias
    # corrections folded into the step size) are within float32_paths_atol: 4 times our own run's float32 error,
    # measured against the same 100 steps in float64, plus 8 ulps
    exact, _ = _run(ours, ours, dtype=torch.float64, **kwargs)
    for p, q, p64 in zip(a, b, exact):
        atol = float32_paths_atol(p.detach(), p64.detach())
        assert torch.allclose(p, q, atol=atol, rtol=0), (p - q).abs().max()
    moved = max((p - q).abs().max() for p, q in zip(a, _run(ours, theirs, steps=0, **kwargs)[0]))
    assert moved > 0.05  # the parameters really moved, so the comparison means something


def test_adam_l2_differs_from_adamw():
    a, _ = _run(optim.Adam, optim.Adam, lr=1e-2, weight_decay=0.1)
    w, _ = _run(optim.AdamW, optim.AdamW, lr=1e-2, weight_decay=0.1)
    assert max((p - q).abs().max() for p, q in zip(a, w)) > 1e-3


def test_decay_semantics_on_a_zero_gradient():
    # With g = 0, AdamW shrinks theta by exactly (1 - lr*wd); Adam+L2 takes a normalised step of ~lr.
    p = torch.full((3,), 2.0, requires_grad=True)
    opt = optim.AdamW([p], lr=0.1, weight_decay=0.5)
    p.grad = torch.zeros(3)
    opt.step()
    assert torch.allclose(p, torch.full((3,), 2.0 * (1 - 0.05)))
    q = torch.full((3,), 2.0, requires_grad=True)
    opt = optim.Adam([q], lr=0.1, weight_decay=0.5)
    q.grad = torch.zeros(3)
    opt.step()
    # bound: m_hat = v_hat = 1 exactly, so the step is lr / (1 + eps), lr eps = 1e-9 short of lr; and about ten
    # roundings (moments, bias corrections, sqrt, + eps, division, product, subtraction) on values of at most 2
    atol = 0.1 * 1e-8 + gamma(10) * 2.0
    assert torch.allclose(q, torch.full((3,), 2.0 - 0.1), atol=atol, rtol=0)


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.frozen = nn.Parameter(torch.zeros(2, 2), requires_grad=False)


def test_param_groups():
    model = _Tiny()
    decay, exempt = optim.param_groups(model, 0.1)
    ids = lambda ps: {id(p) for p in ps}  # noqa: E731
    assert ids(decay["params"]) == {id(model.embed.weight), id(model.proj.weight)}
    assert ids(exempt["params"]) == {id(model.proj.bias), id(model.norm.weight), id(model.norm.bias)}
    assert decay["weight_decay"] == 0.1 and exempt["weight_decay"] == 0.0
    decay, exempt = optim.param_groups(model, 0.1, decay_embeddings=False)
    assert ids(decay["params"]) == {id(model.proj.weight)}
    assert id(model.embed.weight) in ids(exempt["params"])
    opt = optim.build_optimizer(model, "adamw", lr=1e-3, weight_decay=0.1)
    assert isinstance(opt, optim.AdamW) and [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert isinstance(optim.build_optimizer(model, "adam_l2"), optim.Adam)
    with pytest.raises(ValueError, match="name must be one of \\['adam', 'adam_l2', 'adamw'\\]"):
        optim.build_optimizer(model, "sgd")
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        optim.param_groups(model, -1.0)


@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(max_norm):
    torch.manual_seed(0)
    a = [torch.randn(4, 3, requires_grad=True), torch.randn(5, requires_grad=True)]
    b = [p.detach().clone().requires_grad_() for p in a]
    for p, q in zip(a, b):
        p.grad = torch.randn(p.shape) * 2
        q.grad = p.grad.clone()
    ours = optim.clip_grad_norm(a, max_norm)
    theirs = torch.nn.utils.clip_grad_norm_(b, max_norm)
    assert torch.allclose(ours, theirs)
    # the norm is an n = 17 term sum of squares (relative gamma_n, halved by the sqrt), then a division and the
    # product: each side within 2 gamma_n of the clipped gradient's size, so the two within reduction_atol(chain=2)
    n = sum(p.numel() for p in a)
    for p, q in zip(a, b):
        assert torch.allclose(p.grad, q.grad, atol=reduction_atol(n, q.grad.abs().max().item(), chain=2), rtol=0)
    after = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in a]))
    assert after <= max_norm * (1 + 1e-5)
    with pytest.raises(ValueError, match="max_norm must be > 0"):
        optim.clip_grad_norm(a, 0.0)


def test_noam_schedule():
    noam = optim.Noam(d_model=512, warmup=4000)
    peak = 512**-0.5 * 4000**-0.5
    assert math.isclose(noam(3999), peak)  # t = 4000: both arms meet
    assert noam(0) < noam(1000) < noam(3999) and noam(3999) > noam(8000)
    assert math.isclose(noam(15999) / noam(3999), 0.5)  # t^-1/2 decay: 4x the steps, half the rate
    assert math.isclose(noam(99), 512**-0.5 * 100 * 4000**-1.5)


def test_warmup_cosine_and_constant():
    sched = optim.WarmupCosine(warmup=10, total=110, floor=0.1)
    assert math.isclose(sched(0), 0.1) and math.isclose(sched(9), 1.0)
    assert math.isclose(sched(10), 1.0) and math.isclose(sched(60), 0.55)
    assert math.isclose(sched(110), 0.1) and math.isclose(sched(500), 0.1)
    values = [sched(s) for s in range(10, 111)]
    assert all(x >= y for x, y in zip(values, values[1:]))
    const = optim.ConstantWithWarmup(4)
    assert [const(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="total must be > warmup=10"):
        optim.WarmupCosine(10, 10)
    with pytest.raises(ValueError, match="floor must be in \\[0, 1\\]"):
        optim.WarmupCosine(0, 10, floor=2)


def test_schedules_drive_lambda_lr_and_survive_state_dict():
    p = torch.zeros(2, requires_grad=True)
    opt = optim.AdamW([p], lr=1e-3)
    lr_sched = optim.scheduler(opt, optim.WarmupCosine(warmup=5, total=20))
    lrs = []
    for _ in range(8):
        lrs.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(2)
        opt.step()
        lr_sched.step()
    assert math.isclose(lrs[0], 1e-3 / 5) and math.isclose(lrs[4], 1e-3)
    state = lr_sched.state_dict()
    assert state["lr_lambdas"][0] == {"warmup": 5, "total": 20, "floor": 0.1}  # callable objects are saved
    opt2 = optim.AdamW([p], lr=1e-3)
    opt2.load_state_dict(opt.state_dict())
    assert opt2.state[p]["step"] == 8


def test_param_groups_on_a_gpt_exempt_biases_norm_gains_and_embeddings():
    from companion.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=2, n_head=2, n_embd=8))
    decay, exempt = optim.param_groups(model, 0.1, decay_embeddings=False)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    exempted = {names[id(p)] for p in exempt["params"]}
    assert decayed | exempted == set(names.values()) and not decayed & exempted
    linear_weights = {names[id(m.weight)] for m in model.modules() if isinstance(m, nn.Linear)}
    linear_weights.discard("wte.weight")  # the output layer is tied to the token embedding
    norm_params = {f"{n}.{w}" for n, m in model.named_modules() if "norm" in type(m).__name__.lower()
                   for w in ("weight", "bias")}
    assert linear_weights and linear_weights <= decayed
    assert norm_params and norm_params <= exempted
    assert "wte.weight" in exempted and all(n.endswith(".bias") for n in exempted - norm_params - {"wte.weight"})


def test_adamw_decay_ignores_the_gradient_scale_and_adam_l2_does_not():
    # Flat loss, pure-noise gradients of scale 0.01 (row 0) and 10 (row 1): only the decay pulls.
    def means(cls, steps=300, lr=1e-2, wd=0.1):
        theta = torch.ones(2, 100, dtype=torch.float64, requires_grad=True)
        opt = cls([theta], lr=lr, weight_decay=wd)
        gen = torch.Generator().manual_seed(0)
        sigma = torch.tensor([[0.01], [10.0]], dtype=torch.float64)
        for _ in range(steps):
            theta.grad = sigma * torch.randn(2, 100, generator=gen, dtype=torch.float64)
            opt.step()
        return theta.detach().mean(-1)

    adamw, l2 = means(optim.AdamW), means(optim.Adam)
    assert (adamw - (1 - 1e-3) ** 300).abs().max() < 0.05
    assert l2[0].abs() < 0.05 and l2[1] > 0.9
