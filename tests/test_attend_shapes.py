"""attend(q, k, v): shapes are validated once, in the shared entry point, for every backend."""

import pytest
import torch

from companion.kernels.attend import BACKENDS, attend


def qkv(B=2, h=4, T=3, d=8, g=2, S=5, S_v=None, B_k=None, d_k=None):
    q = torch.randn(B, h, T, d)
    k = torch.randn(B if B_k is None else B_k, g, S, d if d_k is None else d_k)
    v = torch.randn(B if B_k is None else B_k, g, S if S_v is None else S_v, d)
    return q, k, v


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "shape, match",
    [
        (dict(S_v=4), r"k and v must have the same length S \(one value per key\); got 5 and 4"),
        (dict(B_k=1), "q, k and v must have the same batch size B; got 2, 1 and 1"),
        (dict(d_k=6), "q and k must have the same head size d_k; got 8 and 6"),
        (dict(g=3), r"the query heads \(4\) must be a multiple of the key/value heads \(3\)"),
    ],
)
def test_mismatched_shapes_raise_on_every_backend(backend, shape, match):
    q, k, v = qkv(**shape)
    with pytest.raises(ValueError, match=match):
        attend(q, k, v, backend=backend)


def test_valid_grouped_shapes_still_agree_across_cpu_backends():
    q, k, v = qkv()
    ref = attend(q, k, v, causal=True, backend="reference")
    for backend in ("auto", "sdpa", "tiled"):
        torch.testing.assert_close(attend(q, k, v, causal=True, backend=backend), ref)
