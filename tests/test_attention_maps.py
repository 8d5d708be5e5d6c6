import pytest
import torch
from tolerances import attention_atol, matmul_atol

from companion.notebook.attention_maps import record_cross_attention
from companion.models.seq2seq import seq2seq_from_preset


def test_recorded_weights_reproduce_the_cross_attention_output():
    torch.manual_seed(0)
    model = seq2seq_from_preset("tiny").eval()
    src = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])  # row 0 padded (pad id 0)
    tgt = torch.tensor([[1, 20, 21], [1, 22, 23]])
    captured = {}

    def keep_io(module, args, kwargs, output):
        captured.setdefault("io", (args[0], kwargs["memory"], output))

    layer = model.decoder[0].cross_attn
    handle = layer.register_forward_hook(keep_io, with_kwargs=True)
    with record_cross_attention(model) as maps, torch.no_grad():
        model(src, tgt)
    handle.remove()
    assert len(maps) == model.config.n_decoder_layers
    A = maps[0]
    assert A.shape == (2, model.config.n_heads, 3, 6)
    torch.testing.assert_close(A.sum(-1), torch.ones(2, model.config.n_heads, 3))
    assert torch.equal(A[0, :, :, 4:], torch.zeros_like(A[0, :, :, 4:]))  # padding is never read
    # O = A V, heads concatenated, W_O: the weights really are the ones the layer used
    x, memory, out = captured["io"]
    q, k, v = layer.project_qkv(x, memory)
    heads = (A @ v).transpose(1, 2).reshape(2, 3, -1)
    # two float32 attentions (the recorded A @ v against the layer's kernel), then W_O: the heads' difference
    # grows by at most the largest row sum of |W_O|, and the two products round apart by matmul_atol
    w = layer.out.weight
    atol = attention_atol(q, k, v) * w.abs().sum(1).max().item() + matmul_atol(heads, w.T)
    torch.testing.assert_close(layer.out(heads), out, atol=atol, rtol=0)


def test_hooks_are_removed_and_errors():
    model = seq2seq_from_preset("tiny").eval()
    with record_cross_attention(model):
        pass
    assert all(not m._forward_hooks for m in model.modules())
    with pytest.raises(ValueError, match="no cross-attention"):
        with record_cross_attention(torch.nn.Linear(2, 2)):
            pass
