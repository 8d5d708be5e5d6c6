"""The training losses of the book: next-token cross-entropy with masks, and label smoothing.

What this module provides
- ``cross_entropy(logits, targets, ignore_index=-100, loss_mask=None, label_smoothing=0.0, reduction="mean")``:
  the mean negative log-likelihood over the positions that count. A position counts when its target
  is not ``ignore_index`` (padding) and, if ``loss_mask`` is given, the mask is True there (so prompt
  tokens can be excluded, as in supervised fine-tuning).
- ``lm_shift(tokens, loss_mask)``: inputs, targets and target mask for next-token prediction from one
  sequence batch (position t predicts token t + 1).
- ``prompt_mask(prompt_lengths, lengths, T)``: True on the response tokens of each row, False on the
  prompt and on padding.
- The trainer's loss functions ``loss_fn(model, batch) -> (summed loss (), counted tokens ())``:
  ``lm_loss`` for (x, y) batches, ``seq2seq_loss`` for ``PairBatch``; ``default_loss`` picks by type.

Cross-entropy with label smoothing (Szegedy et al. 2016, used by Vaswani et al. 2017 with eps = 0.1).
With p = softmax(logits) over V classes and target y, the smoothed target distribution is
q(k) = (1 - eps) [k = y] + eps / V, and the loss of one position is
    H(q, p) = -sum_k q(k) log p(k) = (1 - eps) * (-log p(y)) + eps * mean_k(-log p(k)).
This is exactly what ``torch.nn.functional.cross_entropy(label_smoothing=eps)`` computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion.data.batching import IGNORE_INDEX, PairBatch
from companion.models import unwrap

__all__ = ["cross_entropy", "lm_shift", "prompt_mask", "IGNORE_INDEX", "lm_loss", "seq2seq_loss", "default_loss"]


def cross_entropy(
    logits: Tensor,
    targets: Tensor,
    *,
    ignore_index: int = IGNORE_INDEX,
    loss_mask: Tensor | None = None,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> Tensor:
    """Label-smoothed cross-entropy over the counted positions (equation in the module docstring).

    Args:
        logits: (..., V) unnormalised scores.
        targets: (...) class ids; ``ignore_index`` marks positions that never count.
        loss_mask: optional (...) boolean; False positions do not count either.
        label_smoothing: eps in [0, 1).
        reduction: ``"mean"`` over counted positions (0 when none counts), ``"sum"``, or ``"none"``
            (per-position losses, 0 where not counted).
    """
    if logits.dim() < 1 or logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits must have shape targets.shape + (V,); got {tuple(logits.shape)} and "
                         f"{tuple(targets.shape)}")
    if not 0 <= label_smoothing < 1:
        raise ValueError(f"label_smoothing must be in [0, 1); got {label_smoothing}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none'; got {reduction!r}")
    counted = targets != ignore_index
    if loss_mask is not None:
        if loss_mask.shape != targets.shape or loss_mask.dtype != torch.bool:
            raise ValueError(f"loss_mask must be boolean with the shape of targets {tuple(targets.shape)}; "
                             f"got {loss_mask.dtype} {tuple(loss_mask.shape)}")
        counted = counted & loss_mask
    V = logits.shape[-1]
    safe_targets = torch.where(counted, targets, torch.zeros_like(targets))
    if bool(((safe_targets < 0) | (safe_targets >= V)).any()):
        raise ValueError(f"targets must be in [0, {V}) or equal ignore_index={ignore_index}")
    # half-precision logits are upcast (the log-sum-exp needs the range); float32/64 keep their dtype
    log_p = torch.log_softmax(logits.float() if logits.element_size() < 4 else logits, dim=-1)
    nll = -log_p.gather(-1, safe_targets.unsqueeze(-1)).squeeze(-1)
    loss = nll if label_smoothing == 0 else (1 - label_smoothing) * nll - label_smoothing * log_p.mean(dim=-1)
    loss = torch.where(counted, loss, torch.zeros_like(loss))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / counted.sum().clamp(min=1)


def lm_shift(tokens: Tensor, loss_mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """(inputs (B, T-1), targets (B, T-1), target mask (B, T-1) or None) from tokens (B, T).

    Position t of the inputs predicts token t + 1; a target counts when ``loss_mask[:, t + 1]`` is True.
    """
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must have shape (B, T) with T >= 2; got {tuple(tokens.shape)}")
    mask = None if loss_mask is None else loss_mask[:, 1:]
    return tokens[:, :-1], tokens[:, 1:], mask


def prompt_mask(prompt_lengths: Tensor | list[int], lengths: Tensor | list[int], T: int) -> Tensor:
    """(B, T) boolean: True at positions prompt_lengths[b] <= t < lengths[b] (the response), else False."""
    prompt_lengths, lengths = torch.as_tensor(prompt_lengths), torch.as_tensor(lengths)
    if prompt_lengths.shape != lengths.shape or lengths.dim() != 1:
        raise ValueError("prompt_lengths and lengths must be 1-D with the same length (B,)")
    if bool((prompt_lengths < 0).any()) or bool((prompt_lengths > lengths).any()) or bool((lengths > T).any()):
        raise ValueError(f"each row needs 0 <= prompt_length <= length <= T={T}")
    positions = torch.arange(T).unsqueeze(0)
    return (positions >= prompt_lengths.unsqueeze(1)) & (positions < lengths.unsqueeze(1))


# --- the trainer's loss functions: (model, batch) -> (summed loss, counted tokens) -----------------


def lm_loss(model: nn.Module, batch, label_smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
    """(x (B, T), y (B, T)) -> (summed next-token cross-entropy over counted targets, count).

    Targets equal to IGNORE_INDEX do not count (padding, prompts). Same value as
    ``companion.training.losses.cross_entropy(..., reduction="sum")``, via torch's fused kernel. An MoE model's
    load-balancing loss (``aux_loss()``, a per-token mean) is added with weight = the token count.
    """
    x, y = batch[0], batch[1]
    logits = model(x)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE_INDEX, reduction="sum",
                           label_smoothing=label_smoothing)
    count = (y != IGNORE_INDEX).sum()
    aux = getattr(unwrap(model), "aux_loss", None)
    if callable(aux):
        extra = aux()
        if extra.requires_grad:
            loss = loss + extra * count
    return loss, count


def seq2seq_loss(model: nn.Module, batch: PairBatch, label_smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
    """PairBatch -> (summed cross-entropy of labels given src and tgt_in, number of real label tokens).

    Calls ``model(src, tgt_in)`` (the module's forward, which DDP needs): the source mask is rebuilt from
    the model's ``pad_id``, which must be the pad id the batches were padded with.
    """
    logits = model(batch.src, batch.tgt_in)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.labels.flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum", label_smoothing=label_smoothing)
    return loss, (batch.labels != IGNORE_INDEX).sum()


def default_loss(model: nn.Module, batch, label_smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
    """``seq2seq_loss`` for a PairBatch, ``lm_loss`` for an (x, y) pair."""
    if isinstance(batch, PairBatch):
        return seq2seq_loss(model, batch, label_smoothing)
    return lm_loss(model, batch, label_smoothing)
