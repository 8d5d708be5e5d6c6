"""Attention kernels: the one entry point ``attend`` and its backends, FlashAttention (tiled, online softmax), Triton kernels, and the paged-attention reference (chapters 11, 12)."""
