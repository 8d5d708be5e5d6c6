"""Chapter 4's reference character GPT: the chapter's recipe at the quick profile's full budget.

The command the chapter cites (about a minute and a half of one CPU thread):

    .venv/bin/python experiments/ch04_char_gpt.py --save data/reference/ch04-char-gpt

trains exactly what the chapter's training cell starts (``chapter_data``: the Shakespeare split and
the character tokenizer; ``chapter_config``: a GPT-2-style model of 2 layers, width 64, 4 heads,
context 64; ``chapter_train_config``: ``Trainer`` with AdamW at a peak learning rate of 1e-2 after a
50-step warm-up, cosine decay, batches of 32 windows) for 1,600 steps from ``torch.manual_seed(0)``
on one thread, then writes the weights in float16, the tokenizer, ``config.json``, ``info.json``
(the command, the CPU time and the held-out loss of the saved weights after loading them back) and
``SHA256SUMS.json`` into the folder, and prints the digest table to paste into
``companion.data.reference.DIGESTS``. The chapter trains the first 200 steps of the same run itself
and continues it to the full budget when its ``RETRAIN`` flag is True.

The held-out loss is the mean negative log-likelihood per character over every whole window of 64
characters of the validation split (``held_out_nats``), the measure of the chapter's 1.70 bar.
"""
import argparse
import hashlib
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from companion.data import shakespeare_dataset, split_text
from companion.data.loaders import LMData
from companion.data.reference import DIGEST_FILE, load_gpt_reference, unique_state
from companion.models.gpt import GPT, GPTConfig
from companion.tokenizers import CharTokenizer
from companion.training.trainer import TrainConfig, Trainer

COMMAND = "python experiments/ch04_char_gpt.py --save data/reference/ch04-char-gpt"
CONTEXT, BATCH, LR, WARMUP = 64, 32, 1e-2, 50
SHAPE = dict(n_layer=2, n_head=4, n_embd=64)


def chapter_data():
    """The chapter's texts, tokenizer and token streams: a dict with train_text, val_text, tok,
    train (N,) and val (M,)."""
    plays = shakespeare_dataset()
    train_text, val_text = split_text(plays["train"]), split_text(plays["validation"])
    tok = CharTokenizer.train(train_text + val_text)
    return dict(train_text=train_text, val_text=val_text, tok=tok,
                train=torch.tensor(tok.encode(train_text)), val=torch.tensor(tok.encode(val_text)))


def chapter_config(vocab_size):
    return GPTConfig(vocab_size=vocab_size, block_size=CONTEXT, **SHAPE)


def chapter_train_config(steps):
    return TrainConfig(steps=steps, lr=LR, warmup=min(WARMUP, steps - 1), eval_batches=None,
                       log_every=50, progress=False)


@torch.no_grad()
def held_out_nats(model, ids):
    """Mean NLL per token (nats) over every whole window of CONTEXT tokens of ids (M,)."""
    n = (len(ids) - 1) // CONTEXT * CONTEXT
    x, y = ids[:n].view(-1, CONTEXT), ids[1:n + 1].view(-1, CONTEXT)
    total = sum(F.cross_entropy(model(a).flatten(0, 1), b.flatten(), reduction="sum").item()
                for a, b in zip(x.split(256), y.split(256)))
    return total / n


def train_reference(steps=1600, seed=0, threads=1):
    """Train the chapter's recipe for ``steps`` steps. Returns (model, data dict, info dict)."""
    torch.set_num_threads(threads)
    d = chapter_data()
    torch.manual_seed(seed)
    model = GPT(chapter_config(d["tok"].vocab_size))
    data = LMData(d["train"], None, batch_size=BATCH, context=CONTEXT, seed=seed)
    trainer = Trainer(model, data, chapter_train_config(steps))
    wall, cpu = time.perf_counter(), time.process_time()
    history = trainer.fit()
    info = dict(command=COMMAND, steps=trainer.step, lr=LR, warmup=WARMUP, batch=BATCH,
                context=CONTEXT, seed=seed, threads=threads,
                train_cpu_s=round(time.process_time() - cpu, 1),
                train_wall_s=round(time.perf_counter() - wall, 1),
                first_loss=round(history.series("loss")[1][0], 3),
                loss=round(history.last("loss"), 3), torch=torch.__version__,
                machine=f"{platform.machine()} {platform.system()}",
                date=time.strftime("%Y-%m-%d", time.gmtime()))
    return model.eval(), d, info


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def save_reference(folder, model, tok, info):
    """Write the folder (float16 weights, tokenizer, config, info, digests); returns the digests."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    config = {k: v for k, v in vars(model.config).items()}
    (folder / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    weights = {k: v.detach().to(torch.float16).contiguous() for k, v in unique_state(model).items()}
    save_file(weights, folder / "model.safetensors", metadata={"dtype": "float16"})
    tok.save(folder / "tokenizer.json")
    (folder / "info.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    for path in folder.iterdir():
        path.chmod(0o644)
    digests = {p.name: sha256(p) for p in sorted(folder.iterdir())}
    (folder / DIGEST_FILE).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    return digests


def main(argv):
    ap = argparse.ArgumentParser(description="Train and save chapter 4's reference character GPT.")
    ap.add_argument("--save", required=True, help="folder to write, e.g. data/reference/ch04-char-gpt")
    ap.add_argument("--steps", type=int, default=1600)
    args = ap.parse_args(argv)
    model, d, info = train_reference(args.steps)
    folder = Path(args.save)
    digests = save_reference(folder, model, d["tok"], info)
    # score the weights as the chapter sees them: float16 on disk, float32 after loading
    ref = load_gpt_reference(folder.name, root=folder.parent, digests=digests)
    cpu = time.process_time()
    info["val_nats_per_char"] = round(held_out_nats(ref.model, d["val"]), 4)
    info["score_cpu_s"] = round(time.process_time() - cpu, 1)
    digests = save_reference(folder, model, d["tok"], info)
    print(json.dumps(info, indent=1))
    print(f"DIGESTS[{folder.name!r}] = " + json.dumps(digests, indent=4))


if __name__ == "__main__":
    main(sys.argv[1:])
