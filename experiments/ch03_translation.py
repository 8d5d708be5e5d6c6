"""Chapter 3 tuning runs: the chapter's translation model with one setting changed at a time.

    .venv/bin/python experiments/ch03_translation.py split=both steps=1600 lr=3e-3 warmup=200

Settings are key=value (defaults in ``a`` below). ``split``: ``chapter`` (train on the training
chapters, score the new chapters), ``random`` (deduplicate all verses by English text, shuffle, hold
out 1,200), ``both`` (the chapter's split: 6% of the training chapters' verses held out by a hash of
their English text, plus the new chapters). Scores: greedy BLEU / chrF on 300 held-out verses
(lowercased, tokenised text), and for ``both`` also the new-verse set and, unless ``beam=0``, beam 4.
``n_eval`` sets how many verses of each held-out set are decoded (300). Torch runs on ``threads``
threads (1, as the chapter's quick profile does); the budget is steps only, no wall-clock guard.
Times: wall (``train_s``, ``decode_s``) and CPU time of this process (``train_cpu_s``, ``decode_cpu_s``,
``beam_cpu_s``), which is the better measure on a shared machine. One JSON line per run
is printed and appended to experiments/ch03_translation.jsonl. Results and their reading:
experiments/ch03_translation.md.
"""
import json
import random
import sys
import time
from pathlib import Path

import torch
from companion.data import bible_dataset, split_by_key
from companion.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from companion.tokenizers import WordTokenizer
from companion.data.loaders import PairData
from companion.training.trainer import TrainConfig, Trainer
from companion.inference.translate import corpus_bleu, corpus_chrf, translate

a = dict(split="chapter", max_words=20, steps=1000, batch=32, lr=2e-3, vocab=3000, d=128, ff=256, L=2, h=4,
         warmup=50, ls=0.1, dropout=0.0, threads=1, n_eval=300, beam=1, opt="adamw", wd=0.0, b2=0.98, floor=0.1, sched="cosine")
for kv in sys.argv[1:]:
    k, v = kv.split("="); a[k] = type(a[k])(v)
torch.set_num_threads(a["threads"]); torch.manual_seed(0)
ds = bible_dataset("en", "fr", max_words=a["max_words"])
if a["split"] == "chapter":
    train_rows = list(ds["train"]["translation"])
    seen = {r["en"].lower() for r in train_rows}
    held = [r for r in list(ds["validation"]["translation"]) + list(ds["test"]["translation"]) if r["en"].lower() not in seen]
elif a["split"] == "both":
    rows = list(ds["train"]["translation"])
    side = split_by_key([r["en"].lower() for r in rows], fractions=(0.94, 0.06, 0.0))
    train_rows = [r for r, s in zip(rows, side) if s == "train"]
    heldv = list({r["en"].lower(): r for r, s in zip(rows, side) if s != "train"}.values())
    seen = {r["en"].lower() for r in train_rows}
    held = [r for r in list(ds["validation"]["translation"]) + list(ds["test"]["translation"]) if r["en"].lower() not in seen]
else:  # dedup then random split
    rows = [r for s in ds for r in ds[s]["translation"]]
    uniq = {}
    for r in rows: uniq.setdefault(r["en"].lower(), r)
    rows = list(uniq.values()); random.Random(0).shuffle(rows)
    held, train_rows = rows[:1200], rows[1200:]
src_tok = WordTokenizer.train([r["en"] for r in train_rows], max_size=a["vocab"])
tgt_tok = WordTokenizer.train([r["fr"] for r in train_rows], max_size=a["vocab"])
PAD, BOS, EOS = (tgt_tok.id(t) for t in ("<pad>", "<bos>", "<eos>"))
enc = lambda rows: [(src_tok.encode(r["en"]), tgt_tok.encode(r["fr"])) for r in rows]
cfg = Seq2SeqConfig(src_vocab_size=src_tok.vocab_size, tgt_vocab_size=tgt_tok.vocab_size, share_embeddings=False, pad_id=PAD,
    d_model=a["d"], n_heads=a["h"], d_ff=a["ff"], n_encoder_layers=a["L"], n_decoder_layers=a["L"], max_len=64, dropout=a["dropout"])
model = Seq2SeqTransformer(cfg)
run = TrainConfig(steps=a["steps"], lr=a["lr"], betas=(0.9, a["b2"]), weight_decay=a["wd"], schedule=a["sched"],
    warmup=a["warmup"], lr_floor=a["floor"], label_smoothing=a["ls"], eval_every=10**9, progress=False, seed=0, optimizer=a["opt"])
data = PairData(enc(train_rows), None, batch_size=a["batch"], pad_id=PAD, bos_id=BOS, eos_id=EOS)
tr = Trainer(model, data, run); t0, c0 = time.perf_counter(), time.process_time(); h = tr.fit()
tt, tc = time.perf_counter() - t0, time.process_time() - c0
n = a["n_eval"]
src = [r["en"] for r in held[:n]]; ref = [tgt_tok.normalize(r["fr"]) for r in held[:n]]
t1, c1 = time.perf_counter(), time.process_time()
g = translate(model, src, src_tok, tgt_tok, beam_size=1, banned_tokens=["<unk>"])
td, tdc = time.perf_counter() - t1, time.process_time() - c1
extra = {}
if a["split"] == "both":
    sv = [r["en"] for r in heldv[:n]]; rv = [tgt_tok.normalize(r["fr"]) for r in heldv[:n]]
    gv = translate(model, sv, src_tok, tgt_tok, beam_size=1, banned_tokens=["<unk>"])
    extra = dict(n_heldv=len(heldv), verse_bleu=round(corpus_bleu(gv, rv, pretokenized=True), 2), verse_chrf=round(corpus_chrf(gv, rv), 2))
    if a["beam"]:
        c2 = time.process_time()
        bv = translate(model, sv, src_tok, tgt_tok, beam_size=4, banned_tokens=["<unk>"])
        bc = translate(model, src, src_tok, tgt_tok, beam_size=4, banned_tokens=["<unk>"])
        extra.update(verse_beam_bleu=round(corpus_bleu(bv, rv, pretokenized=True), 2), verse_beam_chrf=round(corpus_chrf(bv, rv), 2),
                     chap_beam_bleu=round(corpus_bleu(bc, ref, pretokenized=True), 2), chap_beam_chrf=round(corpus_chrf(bc, ref), 2),
                     beam_s=round(time.perf_counter()-t1,1), beam_cpu_s=round(time.process_time() - c2, 1))
res = dict(a, **extra, train_pairs=len(train_rows), steps_done=tr.step, train_s=round(tt, 1), train_cpu_s=round(tc, 1), decode_s=round(td, 1), decode_cpu_s=round(tdc, 1), loss=round(h.last("loss"), 3),
           bleu=round(corpus_bleu(g, ref, pretokenized=True), 2), chrf=round(corpus_chrf(g, ref), 2))
print(json.dumps(res)); open(Path(__file__).with_suffix(".jsonl"), "a").write(json.dumps(res) + "\n")
