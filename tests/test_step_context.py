"""The step's metadata in one object (``companion.inference.batch.StepContext``), built by the runner
into static buffers: the buffers keep their addresses from step to step, a refill for a smaller batch
leaves the padded rows inert, and the paths that read the context give the engine's tokens."""

import random

import pytest
import torch

from companion.engine import Engine
from companion.inference.batch import ROW_PAD, SEQ_PAD, StepBuffers, bucket_sizes
from companion.inference.generate import SamplingParams, generate
from companion.inference.paged import PagedKVCache
from companion.models import from_preset


def test_bucket_sizes_double_up_to_the_limit():
    assert bucket_sizes(32) == [1, 2, 4, 8, 16, 32]
    assert bucket_sizes(12) == [1, 2, 4, 8, 12]
    assert bucket_sizes(1) == [1]
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="limit must be an int >= 1"):
            bucket_sizes(bad)


def _addresses(buffers: StepBuffers) -> list[int]:
    return [buffers.rows.data_ptr(), buffers.seqs.data_ptr(), buffers.block_tables.data_ptr()]


def test_the_engine_fills_the_same_buffers_every_step():
    torch.manual_seed(0)
    rng = random.Random(0)
    model = from_preset("llama-like").eval()
    prompts = [[rng.randrange(256) for _ in range(rng.randint(2, 14))] for _ in range(6)]
    params = [SamplingParams(max_new_tokens=rng.randint(2, 9)) for _ in prompts]
    engine = Engine(model, page_size=4, max_batch_tokens=16, max_seqs=4)
    buffers = engine.runner.buffers
    before = _addresses(buffers)
    for p, sp in zip(prompts, params):
        engine.add_request(p, sp)
    sizes = set()
    while engine.scheduler.has_work():
        engine.step()
        ctx = engine.runner.context
        sizes.add((len(ctx.new_lengths), ctx.input_ids.shape[0]))
        assert _addresses(buffers) == before
        # every field is a view of the buffers, at their start: nothing allocated per step
        assert ctx.positions.data_ptr() == buffers.rows[1].data_ptr()
        assert ctx.slot_mapping.data_ptr() == buffers.rows[2].data_ptr()
        assert ctx.context_lens.data_ptr() == buffers.seqs[0].data_ptr()
        assert ctx.block_tables.data_ptr() == buffers.block_tables.data_ptr()
    assert len(sizes) > 3  # batches of several shapes went through the same buffers
    # the tokens are each request's own greedy continuation
    for i, (p, sp) in enumerate(zip(prompts, params)):
        alone = generate(model, [p], sp, cache="contiguous")
        assert engine.output(i).tokens == alone.tokens[0]


def test_a_refill_for_a_smaller_batch_leaves_the_padding_inert():
    torch.manual_seed(1)
    model = from_preset("llama-like").eval()
    kv = PagedKVCache(model, n_pages=40, page_size=4)
    buffers = StepBuffers.for_pool(kv, 16, 8, model.config.context_length)
    seqs = [kv.new_sequence() for _ in range(5)]
    first = buffers.fill(kv, seqs, [3, 1, 2, 4, 1], [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10], [11]])
    assert first.input_ids.tolist() == list(range(1, 12)) and first.positions.tolist()[:3] == [0, 1, 2]
    for seq, n in zip(seqs, first.new_lengths):
        seq.advance(n)
    small = buffers.fill(kv, seqs[:3], [1, 1, 1], [[12], [13], [14]])
    # 3 rows: bucket 4; 3 sequences: bucket 4. The fourth row and sequence are padding, whatever was there
    for name, pad in ROW_PAD.items():
        row = small.padded(name)
        assert row.shape == (4,) and row[3].item() == pad, name
    for name, pad in SEQ_PAD.items():
        seq_row = small.padded(name)
        assert seq_row.shape == (4,) and seq_row[3].item() == pad, name
    assert small.padded("block_tables")[3].eq(0).all()
    # the real rows: positions after what the sequences hold, slots through their tables
    assert small.positions.tolist() == [3, 1, 2]
    assert small.slot_mapping.tolist() == [s.table[j // 4] * 4 + j % 4 for s, j in zip(seqs, [3, 1, 2])]
    assert small.context_lens.tolist() == [4, 2, 3] and small.decoding


def test_fill_refuses_a_step_larger_than_its_buffers():
    model = from_preset("llama-like").eval()
    kv = PagedKVCache(model, n_pages=8, page_size=4)
    buffers = StepBuffers(4, 2, 8)
    with pytest.raises(ValueError, match="exceeds the buffers"):
        buffers.fill(kv, [kv.new_sequence() for _ in range(3)], [1, 1, 1], [[1], [2], [3]])
    with pytest.raises(ValueError, match="exceeds the buffers"):
        buffers.fill(kv, [kv.new_sequence()], [5], [[1, 2, 3, 4, 5]])


@pytest.mark.parametrize("kernel", ["reference", "flex", None])
def test_every_read_path_gives_the_gather_paths_tokens(kernel):
    """The paths read one context; their tokens equal the default "gather" path's."""
    torch.manual_seed(2)
    rng = random.Random(2)
    model = from_preset("mistral-like", window=5).eval()
    prompts = [[rng.randrange(256) for _ in range(rng.randint(1, 12))] for _ in range(5)]
    params = [SamplingParams(max_new_tokens=rng.randint(1, 8)) for _ in prompts]
    kw = dict(page_size=4, max_batch_tokens=12, max_seqs=3)
    gather = Engine(model, **kw).generate(prompts, params, arrivals=[0, 0, 1, 3, 3])
    other = Engine(model, attention_kernel=kernel, **kw).generate(prompts, params, arrivals=[0, 0, 1, 3, 3])
    assert [o.tokens for o in other] == [o.tokens for o in gather]
