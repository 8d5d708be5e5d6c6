"""What tiling saves (the FlashAttention chapter): a model of the bytes a dense and a tiled attention
kernel move between a GPU's main memory and its chips, and an exact count of the bytes tensors hold.

- ``dense_traffic_bytes`` / ``tiled_traffic_bytes``: the traffic model, by formula.
- ``TensorBytes``: a context manager that counts the bytes of tensor storage the operations inside it
  allocate, and the peak, exactly and deterministically (no allocator or OS statistics).
"""

from __future__ import annotations

import weakref

from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["dense_traffic_bytes", "tiled_traffic_bytes", "TensorBytes"]


def _check_sizes(**sizes) -> None:
    for name, x in sizes.items():
        if not isinstance(x, int) or isinstance(x, bool) or x < 1:
            raise ValueError(f"{name} must be an int >= 1; got {x!r}")


def dense_traffic_bytes(T: int, S: int, d: int, heads: int = 1, bytes_per_value: int = 2) -> int:
    """Bytes a dense (unfused) attention forward moves to and from main memory, per layer.

    The model of the FlashAttention chapter: read Q and K (T d + S d), write S = QK^T (T S), read
    it back for the softmax and write P (2 T S), read P and V for P V (T S + S d), write O (T d):

        bytes = heads * bytes_per_value * (4 T S + 2 T d + 2 S d).

    The four passes over a T x S matrix dominate as soon as T and S exceed d.
    """
    _check_sizes(T=T, S=S, d=d, heads=heads, bytes_per_value=bytes_per_value)
    return heads * bytes_per_value * (4 * T * S + 2 * T * d + 2 * S * d)


def tiled_traffic_bytes(
    T: int, S: int, d: int, heads: int = 1, bytes_per_value: int = 2, block_q: int = 128, *, kv_cached: bool = False
) -> int:
    """Bytes a tiled (FlashAttention) forward moves to and from main memory, per layer.

    Each query block is read once and its output written once (2 T d); the scores and probabilities
    never leave the chip; the float32 logsumexp (4 bytes a row) is written for the backward. K and V
    stream through on-chip memory once per query block, ceil(T / block_q) times, unless they stay
    in the GPU's L2 cache between blocks (``kv_cached=True``: read from main memory once):

        bytes = heads * (bytes_per_value * (2 T d + n_reads * 2 S d) + 4 T),
        n_reads = 1 if kv_cached else ceil(T / block_q).
    """
    _check_sizes(T=T, S=S, d=d, heads=heads, bytes_per_value=bytes_per_value, block_q=block_q)
    if not isinstance(kv_cached, bool):
        raise ValueError(f"kv_cached must be a bool; got {kv_cached!r}")
    n_reads = 1 if kv_cached else -(-T // block_q)
    return heads * (bytes_per_value * (2 * T * d + n_reads * 2 * S * d) + 4 * T)


class TensorBytes(TorchDispatchMode):
    """Counts the bytes of tensor storage that operations allocate inside ``with TensorBytes() as m:``.

    Every operation PyTorch runs inside the block (forward and backward alike) passes through
    ``__torch_dispatch__``. An output whose storage is new (not one of the operation's inputs, not
    already counted) adds its storage's size to ``m.now``; when the last tensor seen on that storage
    is garbage-collected, the size is subtracted again. ``m.peak`` is the largest ``m.now`` reached:
    the most bytes that tensors made inside the block held at any one time. Tensors that existed
    before the block (the inputs) are not counted.

    Unlike the resident-set size of the process or an allocator's statistics, this count does not
    depend on the allocator, the thread count or the machine: the same code gives the same bytes
    everywhere. It counts tensors only (not the interpreter's or the libraries' own buffers).
    """

    def __init__(self):
        super().__init__()
        self._refs: dict[int, int] = {}  # storage address -> how many live tensors we saw on it
        self._size: dict[int, int] = {}  # storage address -> its bytes
        self.now = 0
        self.peak = 0

    def _release(self, key: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            self.now -= self._size.pop(key)
            del self._refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, Tensor):
                continue
            key = t.untyped_storage().data_ptr()
            if key in self._refs:
                self._refs[key] += 1  # a view (or in-place result) of a tensor we already count
            elif key in inputs:
                continue  # a view of a tensor from outside the block: no new memory
            else:
                self._refs[key] = 1
                self._size[key] = t.untyped_storage().nbytes()
                self.now += self._size[key]
                self.peak = max(self.peak, self.now)
            weakref.finalize(t, self._release, key)
        return out
