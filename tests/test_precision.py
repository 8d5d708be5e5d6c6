"""companion.precision: the arithmetic chosen from a device's compute capability, exercised on the CPU by
passing the capabilities of the GPUs readers get (T4 7.5 on Colab's free tier, V100 7.0, A100 8.0, H100 9.0,
and a pre-Volta P100 6.0)."""

from __future__ import annotations

import pytest
import torch

from companion.precision import choose_precision, cuda_capability, tf32_matmuls, triton_refusal

T4, V100, P100, A100, H100 = (7, 5), (7, 0), (6, 0), (8, 0), (9, 0)


@pytest.mark.parametrize("capability, name, dtype, scaler", [
    (H100, "bf16", torch.bfloat16, False),
    (A100, "bf16", torch.bfloat16, False),
    (T4, "fp16", torch.float16, True),       # no bf16 tensor cores: fp16 needs loss scaling
    (V100, "fp16", torch.float16, True),
    (P100, "fp32", None, False),
])
def test_auto_follows_the_capability(capability, name, dtype, scaler):
    p = choose_precision("cuda", capability)
    assert (p.name, p.autocast_dtype, p.needs_scaler) == (name, dtype, scaler)


def test_cpu_and_mps_train_in_float32_unless_bf16_is_asked_for():
    for device in ("cpu", "mps"):
        assert choose_precision(device).autocast_dtype is None
    assert choose_precision("cpu", requested="bf16").autocast_dtype is torch.bfloat16


def test_requests_the_device_cannot_honour_are_refused_with_the_device_named():
    with pytest.raises(ValueError, match="bf16' needs compute capability 8.0.*has 7.5"):
        choose_precision("cuda", T4, "bf16")
    with pytest.raises(ValueError, match="fp16' needs a CUDA GPU.*cpu"):
        choose_precision("cpu", requested="fp16")
    with pytest.raises(ValueError, match="fp16' needs compute capability 7.0.*has 6.0"):
        choose_precision("cuda", P100, "fp16")
    with pytest.raises(ValueError, match="precision must be one of"):
        choose_precision("cuda", A100, "fp8")
    with pytest.raises(ValueError, match="capability is needed"):
        choose_precision("cuda")


def test_explicit_choices_that_fit_are_kept():
    assert choose_precision("cuda", H100, "fp16").needs_scaler
    assert choose_precision("cuda", T4, "fp32").autocast_dtype is None


def test_triton_refuses_bf16_before_ampere_and_everything_before_volta():
    assert triton_refusal(torch.bfloat16, A100) is None and triton_refusal(torch.float16, T4) is None
    assert "8.0+ for bfloat16" in triton_refusal(torch.bfloat16, T4)
    assert "7.0+" in triton_refusal(torch.float16, P100)


def test_capability_is_none_off_cuda():
    assert cuda_capability("cpu") is None
    if not torch.cuda.is_available():
        assert cuda_capability() is None


def test_the_triton_entry_points_refuse_bf16_on_a_t4(monkeypatch):
    from types import SimpleNamespace

    from companion.kernels import _triton

    monkeypatch.setattr(_triton, "cuda_capability", lambda device: T4)
    q = SimpleNamespace(is_cuda=True, device="cuda:0", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="backend='triton': .*bfloat16.*7.5"):
        _triton.require_runtime(q, False, what="backend='triton'", cpu_choice="-", module="-")


def _tf32_flags():
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def test_tf32_is_scoped_to_the_block_and_restored_after_an_error():
    # The H200 run: a Trainer that switched TF32 on for good loosened later float32 checks in ch09
    # (a cache against a fresh forward differed by 1e-2). The flag must come back as it was.
    before = _tf32_flags()
    with tf32_matmuls(True):
        assert _tf32_flags() == (True, True)
    assert _tf32_flags() == before
    with pytest.raises(RuntimeError, match="inside"), tf32_matmuls(True):
        raise RuntimeError("inside")
    assert _tf32_flags() == before
    with tf32_matmuls(False):
        assert _tf32_flags() == before


def test_a_cuda_trainer_uses_tf32_in_its_steps_and_leaves_it_as_it_found_it():
    from companion.models import from_preset
    from companion.training.losses import default_loss
    from companion.training.trainer import TrainConfig, Trainer

    model = from_preset("llama-like", d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=11,
                        max_seq_len=8)
    seen = []

    def loss_fn(m, batch):  # records the flag the step's matmuls run under
        seen.append(_tf32_flags())
        return default_loss(m, batch, 0.0)

    before = _tf32_flags()
    trainer = Trainer(model, None, TrainConfig(device="cpu"), loss_fn=loss_fn)
    trainer._tf32 = True  # what a CUDA device sets; the flags themselves are settable without CUDA
    assert _tf32_flags() == before  # building the Trainer changed nothing
    x = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0))
    trainer.forward_backward([(x, x)])
    assert seen == [(True, True)]  # TF32 inside the step
    assert _tf32_flags() == before  # and as it was after it
