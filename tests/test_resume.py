"""Resume honours or refuses; checks come before work; a diverged run stops and keeps its last good
checkpoint (companion.training.trainer)."""

from __future__ import annotations

import math

import pytest
import torch

from companion.data.loaders import LMData
from companion.models import GPT, GPTConfig
from companion.tokenizers import CharTokenizer
from companion.training import checkpoint as ckpt
from companion.training.losses import default_loss
from companion.training.optim import WarmupCosine
from companion.training.trainer import NonFiniteLoss, TrainConfig, Trainer, check_device

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_gpt(seed=0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=2, n_embd=16))


def data(seed=0) -> LMData:
    g = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, 8, (400,), generator=g)
    return LMData(stream[:300], stream[300:], 4, 8, seed=seed)


def cfg(**kw) -> TrainConfig:
    base = dict(steps=10, lr=1e-3, log_every=1, eval_batches=1, progress=False)
    return TrainConfig(**{**base, **kw})


def trained(run, tokenizer=None, steps=4, **kw) -> Trainer:
    trainer = Trainer(tiny_gpt(), data(), cfg(out_dir=str(run), **kw), tokenizer=tokenizer)
    trainer.fit(steps=steps)
    return trainer


def test_resume_refuses_another_tokenizer_of_the_same_size(tmp_path):
    mine, other = CharTokenizer.train("abcdefgh"), CharTokenizer.train("stuvwxyz")
    assert mine.vocab_size == other.vocab_size  # the old check (sizes) would have let it through
    trained(tmp_path, tokenizer=mine)
    with pytest.raises(ValueError, match=r"was trained with a different tokenizer \(tokenizer.json differs in \['chars'\]\)"):
        Trainer(tiny_gpt(), data(), cfg(), tokenizer=other).resume(tmp_path)
    with pytest.raises(ValueError, match="the checkpoint has a tokenizer and this run has none"):
        Trainer(tiny_gpt(), data(), cfg()).resume(tmp_path)
    assert Trainer(tiny_gpt(), data(), cfg(), tokenizer=CharTokenizer.train("hgfedcba")).resume(tmp_path).step == 4


def test_a_changed_lr_is_refused_unless_overridden_then_applied(tmp_path):
    trained(tmp_path)
    with pytest.raises(ValueError, match=r"would change hyper-parameters it was trained with: lr: checkpoint 0.001, now 0.002\. "
                                         r"Use the checkpoint's values, or pass override=True"):
        Trainer(tiny_gpt(), data(), cfg(lr=2e-3)).resume(tmp_path)
    resumed = Trainer(tiny_gpt(), data(), cfg(lr=2e-3)).resume(tmp_path, override=True)
    assert resumed.resume_changes == ["lr: checkpoint 0.001, now 0.002"]
    expected = 2e-3 * WarmupCosine(0, 10, 0.1)(4)  # the lr of step 5 in a run that always had lr 2e-3
    assert resumed.lr == pytest.approx(expected, rel=1e-12)
    history = resumed.fit(steps=5)
    assert history.records[-2]["step"] == 5 and history.records[-2]["lr"] == pytest.approx(expected, rel=1e-12)


def test_a_changed_cosine_total_is_refused_unless_overridden_then_applied(tmp_path):
    trained(tmp_path)
    with pytest.raises(ValueError, match=r"steps \(the cosine schedule's total\): checkpoint 10, now 20"):
        Trainer(tiny_gpt(), data(), cfg(steps=20)).resume(tmp_path)
    resumed = Trainer(tiny_gpt(), data(), cfg(steps=20)).resume(tmp_path, override=True)
    assert resumed.resume_changes == ["steps (the cosine schedule's total): checkpoint 10, now 20"]
    assert resumed.lr == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 20))), rel=1e-12)
    # under a constant schedule the budget shapes nothing: a longer run resumes without any override
    trained(tmp_path / "constant", schedule="constant")
    longer = Trainer(tiny_gpt(), data(), cfg(steps=20, schedule="constant")).resume(tmp_path / "constant")
    assert longer.resume_changes == [] and longer.lr == pytest.approx(1e-3)


def test_an_optimizer_change_is_refused_even_with_override(tmp_path):
    trained(tmp_path)
    with pytest.raises(ValueError, match=r"cannot be resumed with a different optimizer setup \(optimizer: checkpoint 'adamw', now 'adam'\)"):
        Trainer(tiny_gpt(), data(), cfg(optimizer="adam")).resume(tmp_path, override=True)


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    trainer = None

    def poisoned(model, batch):  # the loss turns NaN from the 4th step on
        loss, count = default_loss(model, batch)
        return (loss * float("nan") if trainer.step >= 3 else loss), count

    trainer = Trainer(tiny_gpt(), data(), cfg(out_dir=str(tmp_path), checkpoint_every=2, log_every=10), loss_fn=poisoned)
    with pytest.raises(NonFiniteLoss, match=r"the loss became nan at step 4 .*the last good checkpoint, .*step-00000002, is kept"):
        trainer.fit(steps=8)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000002"]
    assert ckpt.load_state(tmp_path)["step"] == 2


def test_output_folder_is_checked_before_the_first_step(tmp_path):
    file = tmp_path / "a-file"
    file.write_text("not a folder")
    for out, match in [(file, "is a file, not a directory"), (file / "sub", "is not writable: Not a directory")]:
        trainer = Trainer(tiny_gpt(), data(), cfg(out_dir=str(out)))
        with pytest.raises(ValueError, match=match):
            trainer.fit(steps=3)
        assert trainer.step == 0  # refused before any work


def test_devices_and_non_finite_settings_are_refused_up_front():
    with pytest.raises(ValueError, match="device must be cpu, cuda, cuda:N or mps; got 'bogus'"):
        Trainer(tiny_gpt(), data(), cfg(device="bogus"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'cuda' asked for, but CUDA is not available here"):
            check_device("cuda")
    for field, value, match in [("lr", math.inf, "lr must be > 0 and finite; got inf"),
                                ("lr", math.nan, "lr must be > 0 and finite; got nan"),
                                ("weight_decay", math.inf, "weight_decay must be >= 0 and finite"),
                                ("grad_clip", math.nan, "grad_clip must be > 0 and finite, or None")]:
        with pytest.raises(ValueError, match=match):
            cfg(**{field: value})


def test_resaving_the_step_a_run_ended_at_writes_new_then_flips_latest(tmp_path):
    trained(tmp_path, steps=4)
    resumed = Trainer(tiny_gpt(), data(), cfg(out_dir=str(tmp_path))).resume(tmp_path)
    resumed.fit(steps=4)  # nothing left to train: the final save re-saves step 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000004.1"]
    assert (tmp_path / "latest").read_text().strip() == "step-00000004.1" and ckpt.load_state(tmp_path)["step"] == 4
