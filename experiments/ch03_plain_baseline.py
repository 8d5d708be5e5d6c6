"""A plain torch.nn.Transformer of the chapter's shape on the same data, loop and schedule: a check
that the companion's model is not the reason for a low score (run it like ch03_translation.py:
.venv/bin/python experiments/ch03_plain_baseline.py split=random steps=1000). Greedy decoding here
recomputes the whole prefix each step (slow but simple)."""
import json
import math
import random
import sys
import time
from pathlib import Path

import torch, torch.nn as nn, torch.nn.functional as F
from companion.data import bible_dataset
from companion.tokenizers import WordTokenizer
from companion.inference.translate import corpus_bleu, corpus_chrf
a = dict(split="random", max_words=20, steps=1000, batch=32, lr=2e-3, vocab=3000, warmup=50, ls=0.1, secs=1000.0)
for kv in sys.argv[1:]:
    k, v = kv.split("="); a[k] = type(a[k])(v)
torch.set_num_threads(2); torch.manual_seed(0)
ds = bible_dataset("en", "fr", max_words=a["max_words"])
if a["split"] == "chapter":
    train_rows = list(ds["train"]["translation"]); seen = {r["en"].lower() for r in train_rows}
    held = [r for r in list(ds["validation"]["translation"]) + list(ds["test"]["translation"]) if r["en"].lower() not in seen]
else:
    rows = [r for s in ds for r in ds[s]["translation"]]; uniq = {}
    for r in rows: uniq.setdefault(r["en"].lower(), r)
    rows = list(uniq.values()); random.Random(0).shuffle(rows); held, train_rows = rows[:1200], rows[1200:]
st = WordTokenizer.train([r["en"] for r in train_rows], max_size=a["vocab"]); tt = WordTokenizer.train([r["fr"] for r in train_rows], max_size=a["vocab"])
PAD, UNK, BOS, EOS = 0, 1, 2, 3
tr = [(st.encode(r["en"]), tt.encode(r["fr"])) for r in train_rows]
d = 128
class M(nn.Module):
    def __init__(s):
        super().__init__()
        s.se = nn.Embedding(st.vocab_size, d); s.te = nn.Embedding(tt.vocab_size, d)
        s.t = nn.Transformer(d, 4, 2, 2, 256, 0.0, batch_first=True)
        s.out = nn.Linear(d, tt.vocab_size)
        pe = torch.zeros(128, d); pos = torch.arange(128)[:, None]; div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        pe[:, 0::2] = torch.sin(pos * div); pe[:, 1::2] = torch.cos(pos * div); s.register_buffer("pe", pe)
    def emb(s, e, x): return e(x) * math.sqrt(d) + s.pe[: x.shape[1]]
    def forward(s, src, tgt):
        T = tgt.shape[1]; cm = torch.triu(torch.full((T, T), float("-inf")), 1)
        h = s.t(s.emb(s.se, src), s.emb(s.te, tgt), tgt_mask=cm, src_key_padding_mask=src == PAD, tgt_key_padding_mask=tgt == PAD, memory_key_padding_mask=src == PAD)
        return s.out(h)
m = M(); opt = torch.optim.AdamW(m.parameters(), lr=a["lr"], betas=(0.9, 0.98), weight_decay=0.0)
def lr_at(s): 
    if s < a["warmup"]: return (s + 1) / a["warmup"]
    p = (s - a["warmup"]) / max(1, a["steps"] - a["warmup"]); return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))
sch = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
def batches():
    rng = random.Random(0)
    while True:
        idx = list(range(len(tr))); rng.shuffle(idx)
        idx = sorted(idx, key=lambda i: len(tr[i][1]))  # bucket by length
        bs = [idx[i:i + a["batch"]] for i in range(0, len(idx), a["batch"])]; rng.shuffle(bs)
        for b in bs:
            S = max(len(tr[i][0]) for i in b); T = max(len(tr[i][1]) for i in b) + 1
            src = torch.tensor([tr[i][0] + [PAD] * (S - len(tr[i][0])) for i in b])
            y = [tr[i][1] + [EOS] for i in b]; yi = [[BOS] + tr[i][1] for i in b]
            yield src, torch.tensor([t + [PAD] * (T - len(t)) for t in yi]), torch.tensor([t + [-100] * (T - len(t)) for t in y])
it = batches(); t0 = time.perf_counter(); m.train()
for step in range(a["steps"]):
    src, tin, lab = next(it)
    loss = F.cross_entropy(m(src, tin).flatten(0, 1), lab.flatten(), ignore_index=-100, label_smoothing=a["ls"])
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); sch.step()
    if time.perf_counter() - t0 > a["secs"]: break
ttime = time.perf_counter() - t0; m.eval()
src_s = [r["en"] for r in held[:300]]; ref = [tt.normalize(r["fr"]) for r in held[:300]]
outs = []
with torch.no_grad():
    for s in src_s:
        x = torch.tensor([st.encode(s)]); y = [BOS]
        for _ in range(64):
            lg = m(x, torch.tensor([y]))[0, -1]; lg[UNK] = -1e9; n = int(lg.argmax())
            if n == EOS: break
            y.append(n)
        outs.append(tt.decode(y[1:]))
res = dict(a, kind="plain", steps_done=step + 1, train_s=round(ttime, 1), bleu=round(corpus_bleu(outs, ref, pretokenized=True), 2), chrf=round(corpus_chrf(outs, ref), 2))
print(json.dumps(res)); open(Path(__file__).with_name("ch03_translation.jsonl"), "a").write(json.dumps(res) + "\n")
