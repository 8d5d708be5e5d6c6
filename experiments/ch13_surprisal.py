"""Chapter 13's surprisal baseline over seed sets: the served draws (temperature 0.8, top-20) against the
same model's own draws at temperature 1 without a filter, and the validation loss.

Trains the chapter's quick-profile model as the chapter does (llama3-like, d 64, 2 layers, 300 steps of
AdamW at 1e-2, warm-up 30, Shakespeare characters), then for each seed set draws 60 characters after
each of the four prompts with both settings (seeds base + i) and prints the mean surprisal of each
under the model at temperature 1. Usage:
    OMP_NUM_THREADS=1 .venv/bin/python tools/kernel_path.py pinned -- .venv/bin/python experiments/ch13_surprisal.py
The record is experiments/ch13_surprisal.md.
"""

import torch

from companion.data import shakespeare_dataset, split_text
from companion.data.loaders import LMData
from companion.inference.generate import SamplingParams, generate
from companion.models import from_preset
from companion.tokenizers import CharTokenizer
from companion.training.trainer import TrainConfig, Trainer

PROMPTS = ["ROMEO:\n", "JULIET:\n", "KING RICHARD III:\n", "First Citizen:\n"]


def trained():
    plays = shakespeare_dataset()
    train_text, val_text = split_text(plays["train"]), split_text(plays["validation"])
    tok = CharTokenizer.train(train_text + val_text)
    data = LMData(torch.tensor(tok.encode(train_text)), torch.tensor(tok.encode(val_text)),
                  batch_size=32, context=64, seed=0)
    torch.manual_seed(0)
    model = from_preset("llama3-like", vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=4,
                        n_kv_heads=2, max_seq_len=128)
    config = TrainConfig(steps=300, lr=1e-2, warmup=30, precision="fp32", eval_every=100, eval_batches=8,
                         log_every=25, progress=False, device="cpu")
    history = Trainer(model, data, config).fit()
    return model.eval(), tok, history.last("val_loss")


def mean_surprisal(model, tok, temperature, top_k, base, new=60):
    nats = []
    for i, prompt in enumerate(PROMPTS):
        ids = tok.encode(prompt)
        sp = SamplingParams(max_new_tokens=new, temperature=temperature, top_k=top_k, seed=base + i)
        out = generate(model, ids, sp).tokens[0]
        with torch.no_grad():
            logp = model(torch.tensor([ids + out]))[0].log_softmax(-1)[len(ids) - 1:-1]
        nats.append(-logp[torch.arange(new), torch.tensor(out)])
    return torch.cat(nats).mean().item()


if __name__ == "__main__":
    model, tok, val = trained()
    print(f"validation loss {val:.3f}")
    for base in (0, 10, 20, 30, 40):
        tilted = mean_surprisal(model, tok, 0.8, 20, base)
        plain = mean_surprisal(model, tok, 1.0, None, base)
        print(f"seeds {base}..{base + 3}: T 0.8 top-20 {tilted:.3f}, T 1 no filter {plain:.3f}")
