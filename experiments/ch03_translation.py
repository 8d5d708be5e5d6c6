"""Chapter 3's translation runs: tuning runs, and the reference checkpoint the chapter loads.

Reference checkpoint (the command the chapter cites; about 3 minutes of one CPU thread):

    .venv/bin/python experiments/ch03_translation.py --save data/reference/ch03-translator

trains the chapter's exact recipe (``chapter_data``: the chapter's split, tokenizers and filters;
``chapter_config``: its model; ``train_reference``: its TrainConfig and data, 1,600 steps at peak lr 3e-3
after a 200-step warm-up instead of the chapter's 400 / 80), on one thread from ``torch.manual_seed(0)``,
then writes the weights in float16, both tokenizers, ``config.json``, ``info.json`` (the command, the
CPU time and the scores of the saved weights) and ``SHA256SUMS.json`` into the folder, and prints the
digest table to paste into ``companion.data.reference.DIGESTS``. ``--steps N`` (1600), ``--lr`` (3e-3)
and ``--warmup`` (200) change the schedule. The chapter calls ``train_reference`` itself when its
``RETRAIN`` flag is True.

Tuning runs (the tables of experiments/ch03_translation.md):

    .venv/bin/python experiments/ch03_translation.py split=both steps=1600 lr=3e-3 warmup=200

Settings are key=value (defaults in ``a`` in ``tune``). ``split``: ``chapter`` (train on the training
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
import argparse
import hashlib
import json
import platform
import random
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from companion.data import bible_dataset, split_by_key
from companion.data.loaders import PairData
from companion.data.reference import DIGEST_FILE, load_reference, unique_state
from companion.inference.translate import corpus_bleu, corpus_chrf, translate
from companion.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from companion.tokenizers import WordTokenizer
from companion.training.trainer import TrainConfig, Trainer

COMMAND = "python experiments/ch03_translation.py --save data/reference/ch03-translator"


def chapter_data(max_words=16, vocab=2000):
    """The chapter's data, as its quick profile builds it: the rows of the three sets and both tokenizers."""
    bible = bible_dataset("en", "fr", max_words=max_words)
    rows = list(bible["train"]["translation"])
    side = split_by_key([row["en"].lower() for row in rows], fractions=(0.94, 0.06, 0.0))
    train_rows = [row for row, s in zip(rows, side) if s == "train"]
    new_verses = list({row["en"].lower(): row for row, s in zip(rows, side) if s != "train"}.values())
    seen = {row["en"].lower() for row in train_rows}
    candidates = [*bible["validation"]["translation"], *bible["test"]["translation"]]
    held_out = [row for row in candidates if row["en"].lower() not in seen]
    src_tok = WordTokenizer.train([row["en"] for row in train_rows], max_size=vocab)
    tgt_tok = WordTokenizer.train([row["fr"] for row in train_rows], max_size=vocab)
    return dict(train_rows=train_rows, new_verses=new_verses, held_out=held_out,
                src_tok=src_tok, tgt_tok=tgt_tok)


def chapter_config(src_tok, tgt_tok):
    """The chapter's quick-profile model: post-LN, d = 128, 2 + 2 layers, 4 heads, FFN 256, no dropout."""
    return Seq2SeqConfig(src_vocab_size=src_tok.vocab_size, tgt_vocab_size=tgt_tok.vocab_size,
                         share_embeddings=False, pad_id=tgt_tok.id("<pad>"), d_model=128, n_heads=4,
                         d_ff=256, n_encoder_layers=2, n_decoder_layers=2, max_len=64, dropout=0.0)


def train_reference(steps=1600, lr=3e-3, warmup=200, seed=0, threads=1):
    """Train the chapter's recipe for ``steps`` steps. Returns (model, data dict, history, info dict)."""
    torch.set_num_threads(threads)
    d = chapter_data()
    src_tok, tgt_tok = d["src_tok"], d["tgt_tok"]
    PAD, BOS, EOS = (tgt_tok.id(t) for t in ("<pad>", "<bos>", "<eos>"))
    encode = lambda rows: [(src_tok.encode(r["en"]), tgt_tok.encode(r["fr"])) for r in rows]
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(chapter_config(src_tok, tgt_tok))
    run = TrainConfig(steps=steps, device="cpu", lr=lr, betas=(0.9, 0.98), weight_decay=0.0,
                      optimizer="torch_adamw", schedule="cosine", warmup=warmup, lr_floor=0.1,
                      label_smoothing=0.1, eval_every=200, progress=False, seed=seed, precision="fp32")
    data = PairData(encode(d["train_rows"]), encode(d["held_out"])[:100], batch_size=32,
                    pad_id=PAD, bos_id=BOS, eos_id=EOS)
    trainer = Trainer(model, data, run)
    wall, cpu = time.perf_counter(), time.process_time()
    history = trainer.fit()
    info = dict(command=COMMAND, steps=trainer.step, lr=lr, warmup=warmup, seed=seed, threads=threads,
                train_cpu_s=round(time.process_time() - cpu, 1),
                train_wall_s=round(time.perf_counter() - wall, 1),
                first_loss=round(history.series("loss")[1][0], 3), loss=round(history.last("loss"), 3),
                val_loss=round(history.last("val_loss"), 3), torch=torch.__version__,
                machine=f"{platform.machine()} {platform.system()}",
                date=time.strftime("%Y-%m-%d", time.gmtime()))
    return model.eval(), d, history, info


def scores(model, d, n_eval=100):
    """Greedy and beam-4 BLEU / chrF on the first ``n_eval`` verses of both held-out sets."""
    out = {}
    for name, rows in [("new verses", d["new_verses"]), ("new chapters", d["held_out"])]:
        refs = [d["tgt_tok"].normalize(r["fr"]) for r in rows[:n_eval]]
        for search, k in [("greedy", 1), ("beam 4", 4)]:
            hyp = translate(model, [r["en"] for r in rows[:n_eval]], d["src_tok"], d["tgt_tok"],
                            beam_size=k, banned_tokens=["<unk>"], max_len=63)
            out[f"{name}, {search}"] = [round(corpus_bleu(hyp, refs, pretokenized=True), 2),
                                        round(corpus_chrf(hyp, refs), 2)]
    return out


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def save_reference(folder, model, d, info):
    """Write the reference folder (float16 weights, tokenizers, config, info, digests); returns the digests."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    config = {k: v for k, v in vars(model.config).items()}
    (folder / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    weights = {k: v.detach().to(torch.float16).contiguous() for k, v in unique_state(model).items()}
    save_file(weights, folder / "model.safetensors", metadata={"dtype": "float16"})
    d["src_tok"].save(folder / "src_tokenizer.json")
    d["tgt_tok"].save(folder / "tgt_tokenizer.json")
    (folder / "info.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    for path in folder.iterdir():
        path.chmod(0o644)
    digests = {p.name: sha256(p) for p in sorted(folder.iterdir())}
    (folder / DIGEST_FILE).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    return digests


def make_reference(argv):
    ap = argparse.ArgumentParser(description="Train and save chapter 3's reference translator.")
    ap.add_argument("--save", required=True, help="folder to write, e.g. data/reference/ch03-translator")
    ap.add_argument("--steps", type=int, default=1600)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=200)
    args = ap.parse_args(argv)
    model, d, _history, info = train_reference(args.steps, args.lr, args.warmup)
    folder = Path(args.save)
    digests = save_reference(folder, model, d, info)
    # score the weights as the chapter will see them: float16 on disk, float32 after loading
    ref = load_reference(folder.name, root=folder.parent, digests=digests)
    cpu = time.process_time()
    info["scores_n100"] = scores(ref.model, d)
    info["score_cpu_s"] = round(time.process_time() - cpu, 1)
    digests = save_reference(folder, model, d, info)
    print(json.dumps(info, indent=1))
    print(f"DIGESTS[{folder.name!r}] = " + json.dumps(digests, indent=4))


def tune(argv):
    a = dict(split="chapter", max_words=20, steps=1000, batch=32, lr=2e-3, vocab=3000, d=128, ff=256, L=2, h=4,
             warmup=50, ls=0.1, dropout=0.0, threads=1, n_eval=300, beam=1, opt="adamw", wd=0.0, b2=0.98, floor=0.1, sched="cosine")
    for kv in argv:
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


if __name__ == "__main__":
    if any(arg.startswith("--") for arg in sys.argv[1:]):
        make_reference(sys.argv[1:])
    else:
        tune(sys.argv[1:])
