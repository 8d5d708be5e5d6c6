"""Trainer(parallel="fsdp"): torch's FSDP2 on 2 gloo CPU processes equals one process; checkpoints stay full."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from companion.data.batching import IGNORE_INDEX
from companion.models import GPT, GPTConfig, seq2seq_from_preset
from companion.training import checkpoint as ckpt
from companion.training.trainer import PARALLEL, TrainConfig, Trainer, transformer_blocks

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS, ACCUM = 4, 2


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0))


class FixedBatches:
    """The trainer's batch/step protocol over fixed tensors: micro-batch i is (x[i], y[i]); ``shard``
    keeps rows rank::world of every micro-batch, so two shards together hold exactly the one-process
    batch. Validation is one fixed batch, the same on every process."""

    def __init__(self, x, y, vx, vy):
        self.x, self.y, self.vx, self.vy, self.i = x, y, vx, vy, 0

    def shard(self, rank: int, world: int) -> None:
        self.x, self.y = self.x[:, rank::world], self.y[:, rank::world]

    def next_batch(self):
        batch = (self.x[self.i], self.y[self.i])
        self.i += 1
        return batch

    def eval_batches(self, max_batches):
        return [(self.vx, self.vy)]

    def state_dict(self) -> dict:
        return {"i": self.i}

    def load_state_dict(self, state: dict) -> None:
        self.i = state["i"]


def make_batches(path: Path) -> None:
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, 32, (STEPS * ACCUM, 4, 16), generator=g)
    y = torch.randint(0, 32, (STEPS * ACCUM, 4, 16), generator=g)
    y[:, 1, :9] = IGNORE_INDEX  # rank 1 counts fewer tokens than rank 0: the mean is over tokens
    vx, vy = torch.randint(0, 32, (2, 3, 16), generator=g)
    torch.save({"x": x, "y": y, "vx": vx, "vy": vy}, path)


def data(path: Path) -> FixedBatches:
    b = torch.load(path, weights_only=True)
    return FixedBatches(b["x"], b["y"], b["vx"], b["vy"])


def config(**kw) -> TrainConfig:
    # lr large enough, and grad_clip small enough, that clipping and Adam both act at every step
    return TrainConfig(steps=STEPS, grad_accum=ACCUM, lr=1e-2, warmup=1, grad_clip=0.5, log_every=1, eval_every=2,
                       device="cpu", progress=False, **kw)


def _fsdp_worker(rank: int, world: int, tmp: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(1)
    tmp = Path(tmp)
    dist.init_process_group("gloo", init_method=f"file://{tmp / 'store'}", rank=rank, world_size=world)
    try:
        full = Trainer(tiny_gpt(), data(tmp / "batches.pt"), config(parallel="fsdp", out_dir=str(tmp / "full")))
        assert full._fsdp and full._ddp is None
        assert all(isinstance(p, DTensor) for p in full.model.parameters())  # sharded, not replicated
        history = full.fit()
        # stopped after 2 steps, then resumed by a new trainer (other seed, other weights) to the end
        part = Trainer(tiny_gpt(), data(tmp / "batches.pt"), config(parallel="fsdp", out_dir=str(tmp / "part")))
        part.fit(steps=2)
        torch.manual_seed(99)
        resumed = Trainer(GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0)),
                          data(tmp / "batches.pt"), config(parallel="fsdp", out_dir=str(tmp / "part")))
        resumed.resume(tmp / "part")
        assert resumed.step == 2
        resumed_history = resumed.fit()
        if rank == 0:
            (tmp / "fsdp.json").write_text(json.dumps({"full": history.to_dict(), "resumed": resumed_history.to_dict()}))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("fsdp")
    make_batches(tmp / "batches.pt")
    mp.spawn(_fsdp_worker, args=(2, str(tmp)), nprocs=2, join=True)
    return tmp, json.loads((tmp / "fsdp.json").read_text())


def test_fsdp_two_cpu_processes_equal_one_process(fsdp_run):
    tmp, runs = fsdp_run
    single = Trainer(tiny_gpt(), data(tmp / "batches.pt"), config())
    expected = single.fit()
    got = runs["full"]["records"]
    want = expected.records
    assert [r["step"] for r in got] == [r["step"] for r in want] and len(got) == STEPS + 2  # 4 steps + 2 evaluations
    for a, b in zip(got, want):
        key = "loss" if "loss" in b else "val_loss"
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (a, b)
    # the FSDP checkpoint holds full weights and loads in one process, equal to one process's weights
    loaded = ckpt.load_model(tmp / "full")
    assert type(loaded) is GPT and ckpt.load_state(tmp / "full")["step"] == STEPS
    # Adam moves every weight by about lr per step whatever the gradient's size, so rounding noise in
    # near-zero gradients (summed in another order across shards) shows up at ~1e-5 after 4 steps of
    # lr 1e-2 (measured: 1.5e-5); 1e-4 is 1% of one step, far below what a wrong gradient would give.
    mine = dict(single.model.named_parameters())
    for name, p in loaded.named_parameters():
        torch.testing.assert_close(p, mine[name].detach(), atol=1e-4, rtol=0, msg=name)
    moved = max(float((p - q).detach().abs().max()) for p, q in zip(loaded.parameters(), tiny_gpt().parameters()))
    assert moved > 1e-2  # the weights did train (4 steps of lr 1e-2), so the tolerance above is meaningful
    assert loaded.lm_head.weight is loaded.wte.weight  # the tie survives the gather


def test_fsdp_checkpoint_stores_a_tied_weight_once(fsdp_run):
    tmp, _ = fsdp_run
    from safetensors import safe_open

    with safe_open(str(ckpt.resolve(tmp / "full") / "model.safetensors"), framework="pt") as f:
        names, aliases = set(f.keys()), json.loads(f.metadata()["aliases"])
    plain = {n for n, _ in tiny_gpt().named_parameters(remove_duplicate=False)}
    assert len(aliases) == 1 and names | set(aliases) >= plain and not names & set(aliases)


def test_fsdp_resume_equals_uninterrupted(fsdp_run):
    _, runs = fsdp_run

    def measured(history):  # every record without its timings
        return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")} for r in history["records"]]

    assert measured(runs["resumed"]) == measured(runs["full"])  # losses, lrs, evaluations: bit for bit
    assert len(measured(runs["full"])) == STEPS + 2


def _fsdp_bf16_worker(rank: int, world: int, tmp: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(1)
    tmp = Path(tmp)
    dist.init_process_group("gloo", init_method=f"file://{tmp / 'store16'}", rank=rank, world_size=world)
    try:
        trainer = Trainer(tiny_gpt(), data(tmp / "batches.pt"), config(parallel="fsdp", precision="bf16"))
        seen = {}
        block = trainer.model.blocks[0]
        linear = next(m for m in block.modules() if isinstance(m, torch.nn.Linear))
        # hooks that return None observe without changing anything
        linear.register_forward_pre_hook(lambda m, args: None if seen.setdefault("weight", m.weight.dtype) else None)
        trainer.model.register_forward_hook(lambda m, args, out: None if seen.setdefault("logits", out[0].dtype) else None)
        history = trainer.fit()
        shards = {p.dtype for p in trainer.model.parameters()}
        assert all(isinstance(p, DTensor) for p in trainer.model.parameters())
        if rank == 0:
            (tmp / "fsdp16.json").write_text(json.dumps({
                "records": history.to_dict()["records"], "shards": sorted(map(str, shards)),
                "compute": str(seen["weight"]), "logits": str(seen["logits"]), "autocast": str(trainer.autocast_dtype)}))
    finally:
        dist.destroy_process_group()


def test_fsdp_bf16_policy_computes_in_bf16_keeps_fp32_shards_and_tracks_fp32(fsdp_run):
    import torch.multiprocessing as mp

    tmp, runs = fsdp_run
    mp.spawn(_fsdp_bf16_worker, args=(2, str(tmp)), nprocs=2, join=True)
    got = json.loads((tmp / "fsdp16.json").read_text())
    # the policy, observed: bf16 weights inside the forward, float32 master shards, float32 logits, no autocast
    assert got["compute"] == "torch.bfloat16" and got["shards"] == ["torch.float32"]
    assert got["logits"] == "torch.float32" and got["autocast"] == "None"
    # the same run in float32 (the module's fixture): bf16 keeps 8 mantissa bits (relative rounding 2^-9 =
    # 0.2% per operation), so after 4 steps the losses agree to a few percent, not to float32's 1e-5
    fp32 = [r for r in runs["full"]["records"] if "loss" in r]
    bf16 = [r for r in got["records"] if "loss" in r]
    assert len(bf16) == len(fp32) == STEPS
    for a, b in zip(bf16, fp32):
        assert a["loss"] == pytest.approx(b["loss"], rel=3e-2), (a, b)
    assert any(abs(a["loss"] - b["loss"]) > 1e-5 * b["loss"] for a, b in zip(bf16, fp32))  # it did run in bf16


def test_fsdp_reduce_dtype_is_validated():
    with pytest.raises(ValueError, match=r"fsdp_reduce_dtype must be one of \('fp32', 'bf16', 'fp16'\); got 'int8'"):
        TrainConfig(fsdp_reduce_dtype="int8")


def test_transformer_blocks_are_the_layers_of_each_family():
    gpt = tiny_gpt()
    assert transformer_blocks(gpt) == list(gpt.blocks)
    s2s = seq2seq_from_preset("tiny", src_vocab_size=16, tgt_vocab_size=16, d_model=32, d_ff=64)
    assert transformer_blocks(s2s) == [*s2s.encoder, *s2s.decoder]


def test_parallel_is_validated_and_one_process_ignores_it():
    assert PARALLEL == ("ddp", "fsdp")
    with pytest.raises(ValueError, match=r"parallel must be one of \('ddp', 'fsdp'\); got 'zero3'"):
        TrainConfig(parallel="zero3")
    trainer = Trainer(tiny_gpt(), None, config(parallel="fsdp"))
    assert trainer.world == 1 and not trainer._fsdp and type(trainer.model) is GPT
