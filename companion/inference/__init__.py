"""Inference: generate() and samplers, greedy and beam translation, the paged KV cache (page pool, block manager, sequence views) and KV quantisation (chapters 3, 4, 10, 12)."""
