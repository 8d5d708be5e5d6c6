"""companion.streaming: StreamingLLM's cache with positions counted inside the cache (chapter 9)."""

import pytest
import torch

from companion.models import from_preset
from companion.streaming import StreamingCache
from tolerances import float64_twin_atol

# tolerances: a streamed decode against a fresh forward are two float32 computations of one function, within
# float64_twin_atol: 4 times one side's own float32 error, measured against its float64 twin, plus 8 ulps
# (tests/tolerances.py, float32_paths_atol)


def _last(model, idx, positions=None):
    return model(idx, positions=positions)[:, -1] if positions is not None else model(idx)[:, -1]


def small(n_layers=1, **options):
    torch.manual_seed(0)
    return from_preset("llama-like", vocab_size=20, d_model=32, n_layers=n_layers, n_heads=4,
                       n_kv_heads=2, max_seq_len=128, **options).eval()


def stream(model, cache, idx):
    with torch.no_grad():
        return torch.cat([model(idx[:, t:t + 1], cache=cache) for t in range(idx.shape[1])], 1)


def test_a_window_longer_than_the_stream_is_full_attention():
    model, idx = small(n_layers=2), torch.randint(0, 20, (2, 30))
    with torch.no_grad():
        full = model(idx)
    atol = float64_twin_atol(lambda m, i: m(i), model, idx)
    torch.testing.assert_close(stream(model, StreamingCache(model, window=64), idx), full, atol=atol, rtol=0)


@pytest.mark.parametrize("options", [{}, {"rope_scaling": "yarn", "rope_factor": 4.0,
                                          "rope_original_max_len": 16}])
@pytest.mark.parametrize("keep", [0, 1, 3])
def test_one_layer_reads_the_kept_and_recent_tokens_at_positions_from_zero(keep, options):
    # In one layer the keys depend only on the tokens, so step t of the stream must equal a fresh
    # forward over [first keep tokens, last window tokens] at positions 0..n-1: in-cache positions.
    model, window = small(**options), 5
    idx = torch.randint(0, 20, (2, 40))
    cache = StreamingCache(model, window=window, keep=keep)
    out = stream(model, cache, idx)
    for t in (3, 7, 20, 39):
        first = list(range(min(keep, max(t + 1 - window, 0))))
        rows = first + list(range(max(t + 1 - window, 0), t + 1))
        with torch.no_grad():
            fresh = model(idx[:, rows])[:, -1]
        torch.testing.assert_close(out[:, t], fresh, atol=float64_twin_atol(_last, model, idx[:, rows]), rtol=0)
    assert cache.layer(0).stored == keep + window - 1
    assert cache.layer(0).positions.tolist()[:keep] == list(range(keep))


def test_a_prompt_chunk_inside_the_window_then_one_token_at_a_time():
    model, idx = small(n_layers=2), torch.randint(0, 20, (1, 24))
    one = stream(model, StreamingCache(model, window=6, keep=2), idx)
    cache = StreamingCache(model, window=6, keep=2)
    with torch.no_grad():
        head = model(idx[:, :8], cache=cache)               # 8 <= keep + window: no eviction yet
        tail = stream(model, cache, idx[:, 8:])
    atol = float64_twin_atol(lambda m, i: stream(m, StreamingCache(m, window=6, keep=2), i), model, idx)
    torch.testing.assert_close(torch.cat((head, tail), 1), one, atol=atol, rtol=0)


def test_refuses_a_chunk_that_needs_different_rows_and_a_windowed_model():
    model = small()
    cache = StreamingCache(model, window=4, keep=1)
    with torch.no_grad():
        model(torch.randint(0, 20, (1, 5)), cache=cache)
        with pytest.raises(ValueError, match="one token at a time"):
            model(torch.randint(0, 20, (1, 3)), cache=cache)
    with pytest.raises(ValueError, match="window"):
        StreamingCache(small(window=4), window=4)
    with pytest.raises(ValueError, match="window must be"):
        StreamingCache(model, window=0)


def test_a_gap_reads_the_kept_tokens_as_if_they_sat_further_back():
    # one layer, keep 1, window 4: with gap G the kept token is scored as if it sat G positions
    # before its slot; compare with a fresh forward over explicit positions
    model, idx = small(), torch.randint(0, 20, (1, 30))
    out = stream(model, StreamingCache(model, window=4, keep=1, gap=50), idx)
    rows = [0, 26, 27, 28, 29]
    with torch.no_grad():
        fresh = model(idx[:, rows], positions=torch.tensor([0, 51, 52, 53, 54]))[:, -1]
    atol = float64_twin_atol(_last, model, idx[:, rows], torch.tensor([0, 51, 52, 53, 54]))
    torch.testing.assert_close(out[:, 29], fresh, atol=atol, rtol=0)
