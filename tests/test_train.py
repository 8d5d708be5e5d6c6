"""companion.training.trainer and companion.training.checkpoint: learning, accumulation, exact resume, DDP, checkpoints, errors."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from companion.training import checkpoint as ckpt
from companion.data import collate_pairs, make_pairs
from companion.data.batching import IGNORE_INDEX
from companion.data.synthetic import BOS, EOS, PAD, to_lm
from companion.models import GPT, Decoder, DecoderConfig, GPTConfig, seq2seq_from_preset
from companion.training.trainer import History, TrainConfig, Trainer
from companion.data.loaders import LMData, PairData, SequenceData
from companion.accounting import peak_flops, training_flops_per_token
from tolerances import float32_paths_atol


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_gpt(vocab=32, context=16, dropout=0.0, seed=0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab, block_size=context, n_layer=2, n_head=2, n_embd=32, dropout=dropout))


def tiny_seq2seq(seed=0):
    torch.manual_seed(seed)
    return seq2seq_from_preset("tiny", src_vocab_size=16, tgt_vocab_size=16, d_model=32, d_ff=64)


def digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()}


def quiet(**kw) -> TrainConfig:
    return TrainConfig(progress=False, **kw)


# --- learning ----------------------------------------------------------------------------------------


def test_synthetic_seq2seq_learns_reverse_in_200_steps():
    from companion.inference.translate import greedy_decode

    pairs = make_pairs("reverse", 20000, vocab_size=16, min_len=1, max_len=6, seed=0)
    val = make_pairs("reverse", 100, vocab_size=16, min_len=1, max_len=6, seed=1)
    data = PairData(pairs, val, 64, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    torch.manual_seed(0)
    model = seq2seq_from_preset("tiny", src_vocab_size=16, tgt_vocab_size=16, d_model=64, d_ff=128)
    trainer = Trainer(model, data, quiet(steps=200, lr=3e-3, warmup=20, log_every=20, weight_decay=0.0))
    history = trainer.fit()
    first, last = history.records[0]["loss"], history.series("loss")[1][-1]
    # Uniform guessing over the 12 symbols + EOS is ln 13 = 2.56 nats; a model that reverses is near 0.
    assert first > 2.0
    assert last < 0.25, history.series("loss")
    assert history.last("val_loss") < 0.4
    assert history.stop_reason == "steps" and trainer.step == 200
    src = collate_pairs(val[:40], PAD, BOS, EOS).src
    decoded = greedy_decode(model, src, BOS, EOS, max_len=10)
    exact = sum(h.tokens == y for h, (_, y) in zip(decoded, val[:40])) / 40
    assert exact >= 0.5, exact  # whole sequences reversed, not just a low average loss


def test_decoder_sequence_data_learns_copy_with_prompt_masked():
    pairs = make_pairs("copy", 1000, vocab_size=12, min_len=1, max_len=5, seed=0)
    seqs, masks = to_lm(pairs)
    data = SequenceData(seqs, masks, 32, validation=to_lm(make_pairs("copy", 64, 12, 1, 5, seed=1)))
    x, y = data.next_batch()
    assert bool((y[x == 3] != IGNORE_INDEX).all())  # after SEP (3) the target counts
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(vocab_size=12, d_model=32, n_layers=2, n_heads=2, max_seq_len=16))
    history = Trainer(model, data, quiet(steps=150, lr=3e-3, warmup=10, log_every=50)).fit()
    assert history.last("val_loss") < 0.5  # the copied half is predictable only by attending back


def test_shakespeare_char_model_beats_unigram_entropy_in_300_steps():
    from companion.data import load, split_text
    from companion.tokenizers import CharTokenizer

    ds = load("shakespeare")
    train_text, val_text = split_text(ds["train"])[:400_000], split_text(ds["validation"])[:40_000]
    counts = Counter(train_text)
    n = sum(counts.values())
    unigram = -sum(c / n * math.log(c / n) for c in counts.values())  # nats/char of the best context-free model
    tok = CharTokenizer.train([train_text, val_text])
    data = LMData(torch.tensor(tok.encode(train_text)), torch.tensor(tok.encode(val_text)), 16, 32)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=32))
    history = Trainer(model, data, quiet(steps=300, lr=1e-2, schedule="constant", log_every=50, eval_batches=40,
                                         weight_decay=0.0)).fit()
    assert 3.0 < unigram < 3.6
    assert history.last("val_loss") < unigram - 0.2, (history.last("val_loss"), unigram)


# --- accumulation, DDP ---------------------------------------------------------------------------------


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def float64_grads(model, batches) -> dict[str, torch.Tensor]:
    """The gradients of one forward_backward over ``batches`` by a float64 copy of ``model``."""
    twin = copy.deepcopy(model).double()
    twin.zero_grad(set_to_none=True)
    Trainer(twin, None, quiet()).forward_backward(batches)
    return grads(twin)


def assert_same_grads(a, b, exact):
    """Gradients ``a`` (micro-batches, or one DDP rank) equal ``b`` (one batch in one process), both float32,
    within tolerances.float32_paths_atol: 4 times b's own float32 error, measured against ``exact`` (the same
    batch in float64), plus 8 ulps of each tensor's scale."""
    assert a.keys() == b.keys() == exact.keys() and a
    for name in a:
        atol = float32_paths_atol(b[name], exact[name])
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=0, msg=name)


def test_accumulation_equals_one_big_batch_lm_and_padded_pairs():
    model = tiny_gpt()
    trainer = Trainer(model, None, quiet())
    x = torch.randint(0, 32, (8, 16))
    y = torch.randint(0, 32, (8, 16))
    y[:2, :5] = IGNORE_INDEX  # unequal counted tokens per micro-batch
    trainer.forward_backward([(x, y)])
    whole, exact = grads(model), float64_grads(model, [(x, y)])
    trainer.forward_backward([(x[:3], y[:3]), (x[3:], y[3:])])
    assert_same_grads(grads(model), whole, exact)

    s2s = tiny_seq2seq()
    pairs = make_pairs("reverse", 12, vocab_size=16, min_len=1, max_len=8, seed=3)
    trainer = Trainer(s2s, None, quiet())
    short = sorted(pairs, key=lambda p: len(p[0]))
    trainer.forward_backward([collate_pairs(short, PAD, BOS, EOS)])
    whole, exact = grads(s2s), float64_grads(s2s, [collate_pairs(short, PAD, BOS, EOS)])
    trainer.forward_backward([collate_pairs(short[:6], PAD, BOS, EOS), collate_pairs(short[6:], PAD, BOS, EOS)])
    assert_same_grads(grads(s2s), whole, exact)


def _ddp_worker(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        batches = torch.load(Path(out) / "batches.pt", weights_only=True)
        model = tiny_gpt()
        trainer = Trainer(model, None, quiet(device="cpu"))
        assert trainer.world == world and trainer._ddp is not None
        trainer.forward_backward([(batches["x"][rank::world], batches["y"][rank::world])])
        from safetensors.torch import save_file

        save_file(grads(model), str(Path(out) / f"lm-{rank}.safetensors"))
        s2s = tiny_seq2seq()
        pairs = make_pairs("reverse", 10, vocab_size=16, min_len=1, max_len=8, seed=4)
        trainer = Trainer(s2s, None, quiet(device="cpu"))
        trainer.forward_backward([collate_pairs(pairs[rank * 4 : rank * 4 + 4 + 2 * rank], PAD, BOS, EOS)])
        save_file(grads(s2s), str(Path(out) / f"s2s-{rank}.safetensors"))
    finally:
        dist.destroy_process_group()


def test_ddp_two_cpu_processes_equal_one_process_on_the_concatenated_batch(tmp_path):
    import torch.multiprocessing as mp
    from safetensors.torch import load_file

    x = torch.randint(0, 32, (8, 16))
    y = torch.randint(0, 32, (8, 16))
    y[1, :9] = IGNORE_INDEX  # rank 1 holds fewer counted tokens than rank 0
    torch.save({"x": x, "y": y}, tmp_path / "batches.pt")
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)

    model = tiny_gpt()
    order = torch.cat([torch.arange(0, 8, 2), torch.arange(1, 8, 2)])
    Trainer(model, None, quiet()).forward_backward([(x[order], y[order])])
    single, exact = grads(model), float64_grads(model, [(x[order], y[order])])
    for rank in range(2):
        assert_same_grads(load_file(str(tmp_path / f"lm-{rank}.safetensors")), single, exact)

    s2s = tiny_seq2seq()
    pairs = make_pairs("reverse", 10, vocab_size=16, min_len=1, max_len=8, seed=4)
    Trainer(s2s, None, quiet()).forward_backward([collate_pairs(pairs, PAD, BOS, EOS)])
    single, exact = grads(s2s), float64_grads(s2s, [collate_pairs(pairs, PAD, BOS, EOS)])
    for rank in range(2):  # rank 0 had 4 pairs, rank 1 had 6: weighting by tokens, not by process
        assert_same_grads(load_file(str(tmp_path / f"s2s-{rank}.safetensors")), single, exact)


# --- exact resume and checkpoints -----------------------------------------------------------------------


def lm_data(seed=0):
    g = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, 32, (3000,), generator=g)
    return LMData(stream[:2500], stream[2500:], 4, 16, seed=seed)


def test_resume_equals_uninterrupted(tmp_path):
    cfg = dict(steps=12, lr=3e-3, warmup=3, log_every=1, grad_accum=2, eval_every=4)
    full = Trainer(tiny_gpt(dropout=0.1), lm_data(), quiet(**cfg)).fit()

    first = Trainer(tiny_gpt(dropout=0.1), lm_data(), quiet(**cfg, out_dir=str(tmp_path / "run")))
    first.fit(steps=5)  # a run stopped after 5 of 12 steps
    torch.manual_seed(1234)  # whatever happened in between must not matter
    resumed = Trainer(tiny_gpt(dropout=0.1, seed=99), lm_data(), quiet(**cfg, out_dir=str(tmp_path / "run")))
    resumed.resume(tmp_path / "run")
    assert resumed.step == 5
    history = resumed.fit()
    assert history.series("loss") == full.series("loss")  # every step's loss, bit for bit
    # the stopped run also evaluated at its last step (5); the evaluations both runs made agree exactly
    resumed_val = dict(zip(*history.series("val_loss")))
    assert full.series("val_loss")[0] == [4, 8, 12]
    assert all(resumed_val[step] == value for step, value in zip(*full.series("val_loss")))

    pairs = make_pairs("sort", 300, vocab_size=16, min_len=1, max_len=8, seed=0)
    make = lambda: PairData(pairs, None, 16, pad_id=PAD, bos_id=BOS, eos_id=EOS)  # noqa: E731
    cfg = dict(steps=30, lr=3e-3, log_every=1, schedule="noam", warmup=5)  # 19 batches an epoch: resume mid-epoch 2
    full = Trainer(tiny_seq2seq(), make(), quiet(**cfg)).fit()
    part = Trainer(tiny_seq2seq(), make(), quiet(**cfg))
    part.fit(steps=23)
    part.save_checkpoint(tmp_path / "pairs")
    resumed = Trainer(tiny_seq2seq(seed=5), make(), quiet(**cfg)).resume(tmp_path / "pairs")
    assert resumed.fit().series("loss") == full.series("loss")


def test_checkpoint_round_trip_tied_weights_and_no_pickle(tmp_path):
    model = tiny_gpt()
    step_dir = ckpt.save_checkpoint(tmp_path, 7, model)
    assert sorted(p.name for p in step_dir.iterdir()) == ["config.json", "manifest.json", "model.safetensors"]
    assert (tmp_path / "latest").read_text().strip() == "step-00000007"
    loaded = ckpt.load_model(tmp_path)
    assert loaded.lm_head.weight is loaded.wte.weight  # still tied after loading
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    config = json.loads((step_dir / "config.json").read_text())
    assert config["model"] == "gpt" and config["n_embd"] == 32


def test_loading_into_a_model_of_another_config_names_the_field(tmp_path):
    ckpt.save_checkpoint(tmp_path, 1, tiny_gpt())
    other = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=3, n_head=2, n_embd=32))
    with pytest.raises(ValueError, match=r"n_layer: checkpoint has 2, the model has 3"):
        ckpt.load_weights(other, tmp_path)
    with pytest.raises(ValueError, match=r"model: checkpoint has 'gpt', the model is 'seq2seq'"):
        ckpt.load_weights(tiny_seq2seq(), tmp_path)
    trainer = Trainer(other, lm_data(), quiet())
    with pytest.raises(ValueError, match="holds weights only"):
        trainer.resume(tmp_path)


def test_corrupted_checkpoint_gives_a_clear_error_and_files_stay_intact(tmp_path):
    trainer = Trainer(tiny_gpt(), lm_data(), quiet(steps=2, out_dir=str(tmp_path)))
    trainer.fit()
    step_dir = ckpt.resolve(tmp_path)
    weights = step_dir / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte inside a tensor: safetensors alone would not notice
    weights.write_bytes(bytes(raw))
    before = digest(tmp_path)
    with pytest.raises(ValueError, match=r"model\.safetensors is corrupted"):
        ckpt.load_model(tmp_path)
    with pytest.raises(ValueError, match=r"model\.safetensors is corrupted"):
        Trainer(tiny_gpt(), lm_data(), quiet(steps=4, out_dir=str(tmp_path))).resume(tmp_path)
    assert digest(tmp_path) == before

    (step_dir / "manifest.json").write_text("{not json")
    before = digest(tmp_path)
    with pytest.raises(ValueError, match=r"manifest\.json is corrupted"):
        ckpt.load_model(tmp_path)
    assert digest(tmp_path) == before
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a companion checkpoint"):
        ckpt.load_model(tmp_path / "empty")


def test_a_crash_mid_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    trainer = Trainer(tiny_gpt(), lm_data(), quiet(steps=2, out_dir=str(tmp_path)))
    trainer.fit()
    before = digest(tmp_path)
    real = ckpt._write_file

    def crash(path, data):
        if path.name != "model.safetensors":
            return real(path, data)
        path.write_bytes(data[:100])  # half-written file...
        raise KeyboardInterrupt("power cut")  # ...and the process dies

    monkeypatch.setattr(ckpt, "_write_file", crash)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(steps=3)  # trains, then the save at step 3 crashes
    monkeypatch.undo()
    assert trainer.step == 3
    assert digest(tmp_path) == before  # step 2 and `latest` untouched, no debris left
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    ckpt.load_model(tmp_path)


def test_keep_prunes_old_checkpoints(tmp_path):
    Trainer(tiny_gpt(), lm_data(), quiet(steps=6, checkpoint_every=2, keep_checkpoints=2, out_dir=str(tmp_path))).fit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000004", "step-00000006"]


# --- the loop's other duties -----------------------------------------------------------------------------


def test_wall_clock_guard_stops_early_and_history_plots():
    import matplotlib

    matplotlib.use("Agg")
    trainer = Trainer(tiny_gpt(), lm_data(), quiet(steps=100_000, max_seconds=0.5, log_every=5))
    history = trainer.fit()
    assert history.stop_reason == "max_seconds" and 0 < trainer.step < 100_000
    assert history.records[-2]["step"] == trainer.step  # the last training record, then the final evaluation
    assert history.last("tokens_per_s") > 0
    assert "mfu" not in history.records[-2]  # CPU: no MFU
    ax = history.plot()
    assert [line.get_label() for line in ax.get_lines()] == ["train", "validation"]
    assert History.from_dict(json.loads(json.dumps(history.to_dict()))).records == history.records


def test_bf16_autocast_on_cpu_when_asked():
    trainer = Trainer(tiny_gpt(), lm_data(), quiet(steps=3, precision="bf16"))
    assert trainer.autocast_dtype == torch.bfloat16
    assert math.isfinite(trainer.train_step())
    assert Trainer(tiny_gpt(), lm_data(), quiet()).autocast_dtype is None  # auto on CPU: float32


def test_flops_and_peak_table(monkeypatch):
    from companion.accounting import gpt_parameters

    model = tiny_gpt(vocab=50, context=16)
    c = model.config
    non_embedding = gpt_parameters(c) - c.vocab_size * c.n_embd - c.block_size * c.n_embd - 2 * c.n_embd
    # 2 per matmul weight (+ the output projection) and the attention scores / weighted sum, x3 for training
    expected = 3 * (2 * (non_embedding + 2 * c.n_embd + c.vocab_size * c.n_embd) + 2 * c.n_layer * 16 * 2 * c.n_embd)
    assert training_flops_per_token(model, 16) == expected
    assert training_flops_per_token(tiny_seq2seq(), 16) is None
    assert peak_flops("cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name, peak in [("NVIDIA H200", 989e12), ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
                       ("NVIDIA A100-SXM4-80GB", 312e12), ("Tesla T4", None)]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert peak_flops("cuda") == peak, name


# --- bad inputs ------------------------------------------------------------------------------------------


def test_bad_inputs_give_clear_errors():
    from companion.data import load
    from companion.tokenizers import CharTokenizer

    with pytest.raises(ValueError, match="corpus is empty"):
        CharTokenizer.train("")
    with pytest.raises(ValueError, match="train must be a non-empty 1-D tensor.*corpus is empty"):
        LMData(torch.tensor([], dtype=torch.long), None, 4, 8)
    with pytest.raises(ValueError, match=r"context must be <= len\(train\) - 1 = 9"):
        LMData(torch.arange(10), None, 4, 10)
    with pytest.raises(ValueError, match="batch_size must be >= 1; got 0"):
        LMData(torch.arange(100), None, 0, 8)
    with pytest.raises(ValueError, match="batch_size must be >= 1; got 0"):
        PairData(make_pairs("copy", 4), None, 0, pad_id=0, bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match="corpus is empty"):
        PairData([], None, 4, pad_id=0, bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match="corpus is empty"):
        SequenceData([], None, 4)
    with pytest.raises(ValueError, match=r"name must be one of \['bible-en-de', 'bible-en-es', 'bible-en-fr', 'shakespeare'\]"):
        load("shakespear")
    for field, value, rule in [("steps", 0, "steps must be an int >= 1"), ("grad_accum", 0, "grad_accum must be an int >= 1"),
                               ("precision", "fp8", "precision must be one of"), ("optimizer", "sgd", "optimizer must be one of"),
                               ("lr", 0.0, "lr must be > 0"), ("warmup", 300, "warmup must be < steps=200")]:
        with pytest.raises(ValueError, match=rule):
            TrainConfig(**{field: value})
    with pytest.raises(ValueError, match="data must be given"):
        Trainer(tiny_gpt(), None, quiet()).train_step()
    with pytest.raises(ValueError, match="out_dir must be given"):
        Trainer(tiny_gpt(), None, quiet()).save_checkpoint()


def test_model_kind_comes_from_the_family_registry_and_round_trips():
    from companion.models import from_preset
    from companion.models.common import FAMILIES

    for name in ("llama-like", "gpt2-tiny", "tiny"):
        model = from_preset(name)
        kind = ckpt.model_kind(model)
        assert type(model) is FAMILIES[kind].model
        rebuilt = ckpt.build_model(ckpt.config_dict(model))
        assert type(rebuilt) is type(model) and rebuilt.config == model.config
    assert not hasattr(ckpt, "MODEL_KINDS")

    class Custom(GPT):
        pass

    with pytest.raises(ValueError, match="model must be a Decoder, GPT or Seq2SeqTransformer"):
        ckpt.model_kind(Custom(tiny_gpt().config))
    with pytest.raises(ValueError, match=r"config 'model' must be one of \[.*'gpt'.*\]; got 'rnn'"):
        ckpt.build_model({"model": "rnn"})


def test_noam_schedule_reads_d_model_of_every_family():
    from companion.training.optim import Noam

    for model in (tiny_gpt(), tiny_seq2seq()):
        trainer = Trainer(model, None, quiet(schedule="noam", warmup=4, lr=1.0))
        d = model.config.d_model  # GPT: n_embd under its shared name
        assert d == 32
        assert [trainer.scheduler.lr_lambdas[0](s) for s in range(8)] == [Noam(d, 4)(s) for s in range(8)]


def test_fp16_is_refused_on_the_cpu_and_its_scaler_path_trains_when_the_device_allows_it(monkeypatch):
    with pytest.raises(ValueError, match="fp16' needs a CUDA GPU.*cpu"):
        Trainer(tiny_gpt(), lm_data(), quiet(precision="fp16"))
    # What a T4 gets (companion.precision: fp16 autocast + a gradient scaler), run on the CPU by letting the
    # policy answer as it does for capability 7.5: the scaled backward, unscale, clip and scaler step.
    import companion.training.trainer as trainer_module
    from companion.precision import FP16

    monkeypatch.setattr(trainer_module, "choose_precision", lambda *args: FP16)
    trainer = Trainer(tiny_gpt(), lm_data(), quiet(steps=4, grad_clip=1.0))
    assert trainer.autocast_dtype == torch.float16 and trainer.scaler is not None
    losses = [trainer.train_step() for _ in range(4)]
    assert all(math.isfinite(x) for x in losses) and trainer.scaler.get_scale() > 0
    assert losses[-1] < losses[0]
