"""Parameters, FLOPs and KV-cache bytes by formula (chapters 6, 8 and 10).

Formulas, written from the configs alone (tests hold them equal to the models' measured counts):
- attention (GQA): d (h + 2g) d_h [+ (h + 2g) d_h biases] + h d_h d [+ d];
- MLA: d d_c' + d_c' + d_c' h (d_h + d_R)  (or d h (d_h + d_R) without query compression)
       + d (d_c + d_R) + d_c + d_c h d_h + d_c h d_v + h d_v d;
- SwiGLU: 3 d d_f; MLP: 2 d d_f + d_f + d (with biases); MoE: d N + (N + N_shared) 3 d d_f;
- norms: d (RMS) or 2d (LayerNorm with bias).
- FLOPs per token: forward ~ 2 N_active + 2 L T_ctx (h d_h + h d_v) (scores and weighted sum);
  training ~ 3 x forward (= 6N + the attention term).
- KV cache per token: MHA/GQA/MQA 2 L g d_h b bytes; MLA L (d_c + d_R) b bytes.
"""

from __future__ import annotations

from .models.decoder import DecoderConfig
from .models.gpt import GPTConfig
from .models.seq2seq import Seq2SeqConfig

__all__ = ["decoder_parameters", "gpt_parameters", "seq2seq_parameters", "kv_cache_bytes", "mla_cache_bytes", "flops_per_token"]


def _norm(kind: str, d: int) -> int:
    return d if kind == "rms" else 2 * d


def _attention(c: DecoderConfig) -> int:
    d, h = c.d_model, c.n_heads
    if c.attention == "mla":
        qk, dv = c.mla_head_dim + c.rope_dim, c.v_head_dim or c.mla_head_dim
        q = d * h * qk if c.q_rank is None else d * c.q_rank + c.q_rank + c.q_rank * h * qk
        return q + d * (c.kv_rank + c.rope_dim) + c.kv_rank + c.kv_rank * h * (c.mla_head_dim + dv) + h * dv * d
    g, dh = c.kv_heads, c.attn_head_dim
    n = d * (h + 2 * g) * dh + h * dh * d
    if c.attn_bias:
        n += (h + 2 * g) * dh + d
    return n + (h if c.sinks else 0)


def _ffn(kind: str, d: int, d_f: int, bias: bool) -> int:
    if kind == "swiglu":
        return 3 * d * d_f + (2 * d_f + d if bias else 0)
    return 2 * d * d_f + (d_f + d if bias else 0)


def decoder_parameters(c: DecoderConfig, active: bool = False) -> int:
    """Parameter count of ``Decoder(c)``; ``active``: only the top_k routed experts per MoE layer."""
    d, V = c.d_model, c.vocab_size
    n = V * d * (1 if c.tie_embeddings else 2) + (c.max_seq_len * d if c.position == "learned" else 0)
    n += _norm(c.norm, d) if c.norm_placement == "pre" else 0  # final norm
    for i in range(c.n_layers):
        n += _attention(c) + 2 * _norm(c.norm, d)
        if c.is_moe(i):
            expert = 3 * d * (c.moe_d_ff or c.ffn_hidden)
            used = c.top_k if active else c.n_experts
            n += d * c.n_experts + (used + c.n_shared_experts) * expert
        else:
            n += _ffn(c.ffn, d, c.ffn_hidden, c.ffn_bias)
    return n


def gpt_parameters(c: GPTConfig) -> int:
    """12 L d^2 + 13 L d + V d + T d (+ 2d for GPT-2's final LayerNorm): tied embedding counted once."""
    d, L = c.n_embd, c.n_layer
    return L * (12 * d * d + 13 * d) + c.vocab_size * d + c.block_size * d + (2 * d if c.variant == "gpt2" else 0)


def seq2seq_parameters(c: Seq2SeqConfig) -> int:
    d, f = c.d_model, c.d_ff
    attn = 4 * d * d + 4 * d
    ffn = 2 * d * f + f + d
    enc = c.n_encoder_layers * (attn + ffn + 2 * 2 * d)
    dec = c.n_decoder_layers * (2 * attn + ffn + 3 * 2 * d)
    emb = c.src_vocab_size * d if c.share_embeddings else (c.src_vocab_size + c.tgt_vocab_size) * d
    return enc + dec + emb


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, tokens: int = 1, batch: int = 1, bytes_per_value: int = 2) -> int:
    """M = 2 B L T g d_h b: keys and values of every layer, kv head and token."""
    return 2 * batch * n_layers * tokens * n_kv_heads * head_dim * bytes_per_value


def mla_cache_bytes(n_layers: int, kv_rank: int, rope_dim: int, tokens: int = 1, batch: int = 1, bytes_per_value: int = 2) -> int:
    """M_MLA = B L T (d_c + d_R) b: one latent and one shared RoPE key per token and layer."""
    return batch * n_layers * tokens * (kv_rank + rope_dim) * bytes_per_value


def flops_per_token(c: DecoderConfig, context: int, training: bool = False) -> int:
    """2 N_active (matmuls, embeddings excluded) + 2 L context h (d_qk + d_v) (attention); x3 for training."""
    n = decoder_parameters(c, active=True) - c.vocab_size * c.d_model * (1 if c.tie_embeddings else 2)
    n += c.vocab_size * c.d_model  # the output projection is a matmul
    if c.attention == "mla":
        dqk, dv = c.mla_head_dim + c.rope_dim, c.v_head_dim or c.mla_head_dim
    else:
        dqk = dv = c.attn_head_dim
    fwd = 2 * n + 2 * c.n_layers * context * c.n_heads * (dqk + dv)
    return 3 * fwd if training else fwd
