"""Serving benchmarks for chapter 12: KV-cache decode cost, paged memory, prefix sharing, quantised
pages, and continuous-batching throughput. Prints markdown tables (pasted into benchmarks/README.md).

    .venv/bin/python benchmarks/serving.py [decode|memory|prefix|quant|scores|throughput|hf|hf24|bandwidth|gather|all]
    .venv/bin/python benchmarks/serving.py trees OTHER_CHECKOUT [rounds]   # this tree's engine against another's

Every experiment uses randomly initialised toy models: the numbers measure the machinery (time per
token, bytes held), not text quality.
"""

from __future__ import annotations

import math
import random
import sys
import time

import torch

from companion.engine import Engine
from companion.engine.bench import serve_benchmark
from companion.inference.generate import SamplingParams, generate
from companion.models import from_preset
from companion.cache import LayerCache, PackedLayerView
from companion.inference.batch import GatherGroup, PagedBatch
from companion.inference.paged import PagedKVCache


def fit_exponent(xs, ys) -> float:
    """Least-squares slope of log y against log x: y ~ c x^k."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


class ConcatLayerCache(LayerCache):
    """The contiguous cache as it was before issue 28 (kept here as the baseline): every step makes a
    new tensor with ``torch.cat`` (a copy of the whole cache), and the decode loop went through the
    packed multi-sequence view (a (1, S) same-sequence mask and a masked attention) even for one
    sequence. Global layers only."""

    def __init__(self):
        self.length, self.positions, self.rows = 0, None, None

    def update(self, positions, *rows):
        if self.rows is None:
            self.positions, self.rows = positions, tuple(rows)
        else:
            self.positions = torch.cat((self.positions, positions))
            self.rows = tuple(torch.cat((old, new), dim=-2) for old, new in zip(self.rows, rows))
        self.length += positions.shape[0]
        return self.positions, self.rows


class _PackedOfOne(PackedLayerView):
    """The packed view the old decode loop built around its one sequence's layer."""

    def update(self, positions, *rows):
        self.new_lengths = [positions.shape[0]]
        return super().update(positions, *rows)


class ConcatModelCache:
    def __init__(self, n_layers):
        self.layers = [_PackedOfOne([ConcatLayerCache()], [1]) for _ in range(n_layers)]

    def layer(self, i):
        return self.layers[i]

    @property
    def length(self):
        return self.layers[0].views[0].length

    def nbytes(self):
        return sum(sum(r.numel() * r.element_size() for r in layer.views[0].rows or ()) for layer in self.layers)


class GatherEveryStep(PagedBatch):
    """The engine's "gather" read as it was before issue 28 item 2 (kept here as the baseline): in
    every layer of every step each group's keys and values are copied out of the pages
    (``PagePool.read_slots``: one index_select for K, one for V) into a padded (B, L, g, d) tensor,
    which is then attended as the seats are now. (It still writes the seats, and never reads them.)"""

    def group_keys(self, layer, dtype):
        if not hasattr(self, "_copy_groups"):  # once per step: the groups at batch rows 0..B-1, their slots
            lens, self._copy_groups = self.new_lengths, []
            members = [m for m in ([b for b, n in enumerate(lens) if n == 1], [b for b, n in enumerate(lens) if n > 1]) if m]
            for grp, m in zip(self.groups(), members):
                slots = self._all_slots[torch.tensor(m)][:, : grp.L].reshape(-1)
                copy = GatherGroup(torch.arange(grp.B), grp.rows, grp.q_pos, grp.real, grp.dest, grp.B, grp.T, grp.L)
                self._copy_groups.append((copy, slots))
        pool = self.owner.pool
        return [(grp, *(pool.read_slots(layer, i, slots, dtype).view(grp.B, grp.L, *pool.data[layer][i].shape[2:]) for i in (0, 1)))
                for grp, slots in self._copy_groups]


def gathering_every_step(engine: Engine) -> Engine:
    """``engine`` with its paged batches built as ``GatherEveryStep`` (the read before issue 28 item 2)."""
    engine.runner.paged_batch = GatherEveryStep
    return engine


def bench_decode(lengths=(128, 512, 1024), repeats=3, d_model=256, n_layers=4) -> dict:
    """Total time to generate N tokens from a 1-token prompt: recomputing everything each step, the
    concatenating cache of before (``ConcatModelCache``) and the preallocated cache (``model.new_cache()``,
    ``companion.cache.ContiguousLayerCache``). The three runs are interleaved within each repeat
    (the order rotating), and each time is the median of ``repeats``; the ratios are of medians."""
    import statistics

    torch.manual_seed(0)
    model = from_preset("llama-like", d_model=d_model, n_layers=n_layers, n_heads=4, n_kv_heads=2,
                        max_seq_len=max(lengths) + 1).eval()
    new_cache = model.new_cache
    modes = {"none": ("none", None), "before": ("contiguous", lambda: ConcatModelCache(n_layers)),
             "after": ("contiguous", new_cache)}
    print(f"\n### Decode cost versus generated length (llama-like, d={d_model}, {n_layers} layers, greedy, "
          f"1-token prompt; median of {repeats} interleaved runs, {torch.get_num_threads()} thread(s))\n")
    print("| N | no cache (s) | concatenating cache, before (s) | preallocated cache (s) | "
          "recompute / before | recompute / after | before / after | tokens identical |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = {m: [] for m in modes}
    out = {}
    for n in lengths:
        runs, toks = {m: [] for m in modes}, {}
        generate(model, [1], cache="contiguous", max_new_tokens=8)  # warm-up
        for rep in range(repeats):
            order = list(modes)[rep % 3:] + list(modes)[: rep % 3]
            for m in order:
                cache, factory = modes[m]
                model.new_cache = factory or new_cache
                start = time.perf_counter()
                toks[m] = generate(model, [1], cache=cache, max_new_tokens=n).tokens
                runs[m].append(time.perf_counter() - start)
        model.new_cache = new_cache
        t = {m: statistics.median(runs[m]) for m in modes}
        for m in modes:
            rows[m].append(t[m])
        same = toks["none"] == toks["before"] == toks["after"]
        out[n] = t
        print(f"| {n} | {t['none']:.2f} | {t['before']:.2f} | {t['after']:.2f} | {t['none'] / t['before']:.1f}x | "
              f"**{t['none'] / t['after']:.1f}x** | {t['before'] / t['after']:.2f}x | {same} |")
    print(f"\nFitted exponent k in total time ~ N^k: no cache {fit_exponent(lengths, rows['none']):.2f}, "
          f"cache before {fit_exponent(lengths, rows['before']):.2f}, after {fit_exponent(lengths, rows['after']):.2f}.")
    for n, goal in ((512, 10), (1024, 20)):
        if n in out:
            r = out[n]["none"] / out[n]["after"]
            print(f"Goal (cache >= {goal}x recompute at N = {n}): {'met' if r >= goal else 'NOT met'} ({r:.1f}x)")
    return out


def _trace(rng, n, ctx):
    return [([rng.randrange(256) for _ in range(rng.randint(8, ctx // 2))], rng.randint(8, ctx // 4)) for _ in range(n)]


def bench_memory(n_requests=32, page_sizes=(8, 16, 32)) -> None:
    """KV slots held while serving a mixed-length trace, summed over engine steps: paged (what the
    block tables hold) versus contiguous preallocation of the full context per running request."""
    torch.manual_seed(1)
    ctx = 512
    model = from_preset("llama-like", max_seq_len=ctx).eval()
    trace = _trace(random.Random(1), n_requests, ctx)
    per_tok = 2 * model.config.n_layers * model.config.kv_heads * model.config.attn_head_dim * 4
    print(f"\n### KV memory held, {n_requests} requests of mixed lengths (prompts 8..{ctx // 2}, outputs 8..{ctx // 4}, context {ctx})\n")
    print("Token slots summed over every engine step (a time integral of memory held); K+V per token "
          f"{per_tok} bytes (float32):\n")
    print("| storage | slots held | slots filled | unused | bytes held per filled token |")
    print("|---|---:|---:|---:|---:|")
    for page_size in page_sizes:
        engine = Engine(model, page_size=page_size, n_pages=n_requests * ctx // page_size, max_batch_tokens=512,
                        max_seqs=n_requests, prefix_sharing=False)
        for prompt, new in trace:
            engine.add_request(prompt, SamplingParams(max_new_tokens=new))
        held = used = prealloc = 0
        while engine.scheduler.has_work():
            engine.step()
            running = engine.scheduler.running
            held += sum(len(s.cache.table) for s in running) * page_size
            used += sum(s.cache.length for s in running)
            prealloc += len(running) * ctx
        print(f"| paged, p = {page_size} | {held:,} | {used:,} | {100 * (1 - used / held):.1f}% | {per_tok * held / used:.0f} |")
    print(f"| contiguous, full context preallocated | {prealloc:,} | {used:,} | {100 * (1 - used / prealloc):.1f}% | {per_tok * prealloc / used:.0f} |")


def bench_prefix(n_requests=16, system_len=128, user_len=16, new=16, page_size=16) -> None:
    torch.manual_seed(2)
    model = from_preset("llama-like", max_seq_len=512).eval()
    rng = random.Random(2)
    system = [rng.randrange(256) for _ in range(system_len)]
    prompts = [system + [rng.randrange(256) for _ in range(user_len)] for _ in range(n_requests)]
    params = SamplingParams(max_new_tokens=new)
    print(f"\n### Prefix sharing: {n_requests} requests = one {system_len}-token system prompt + {user_len} own tokens, {new} new tokens each\n")
    print("| prefix sharing | peak pages in use | tokens computed in prefill | wall s | outputs identical |")
    print("|---|---:|---:|---:|---:|")
    results = {}
    for share in (False, True):
        engine = Engine(model, page_size=page_size, n_pages=n_requests * 12, max_batch_tokens=4096, max_seqs=n_requests, prefix_sharing=share)
        engine.generate(prompts[:1], params)  # a first request that registers the system prompt
        start = time.perf_counter()
        outs = engine.generate(prompts[1:], params)
        results[share] = ([o.tokens for o in outs], engine.stats["peak_pages"], engine.stats["prefill_tokens_fed"], time.perf_counter() - start)
    same = results[True][0] == results[False][0]
    for share in (False, True):
        _, peak, computed, wall = results[share]
        print(f"| {'on' if share else 'off'} | {peak} | {computed:,} | {wall:.2f} | {same} |")
    print(f"\nKV pages saved at peak: {100 * (1 - results[True][1] / results[False][1]):.0f}%.")


@torch.no_grad()
def bench_quant(n_tokens=96) -> None:
    """Teacher-forced: the same tokens through float / int8 / int4 pages; errors against float pages."""
    print(f"\n### Quantised KV pages: error on {n_tokens} teacher-forced tokens (prefill 32, then one token per step)\n")
    print("| model | bits | bytes/token (K+V, all layers) | vs fp32 | max abs err attention out (layer 0) | max abs err logits | rel. err logits | greedy agreement |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in ("llama-like", "deepseek-like"):
        torch.manual_seed(3)  # the weights; the tokens from their own generator (rows identical between runs)
        model = from_preset(name).eval()
        tokens = torch.randint(0, 256, (n_tokens,), generator=torch.Generator().manual_seed(3)).tolist()
        outs = {}
        for bits in (None, 8, 4):
            kv = PagedKVCache(model, n_pages=n_tokens // 8 + 1, page_size=8, bits=bits)
            seq = kv.new_sequence()
            captured = []
            hook = model.layers[0].attn.register_forward_hook(lambda m, i, o: captured.append(o[0]))
            logits = [model(torch.tensor([tokens[:32]]), cache=seq)[0]]
            logits += [model(torch.tensor([[t]]), cache=seq)[0] for t in tokens[32:]]
            hook.remove()
            outs[bits] = (torch.cat(logits), torch.cat(captured), kv.pool.nbytes()["total"] / (kv.n_pages * 8))
        ref_logits, ref_attn, ref_bytes = outs[None]
        for bits in (None, 8, 4):
            logits, attn, per_tok = outs[bits]
            err = (logits - ref_logits).abs().max().item()
            rel = ((logits - ref_logits).norm() / ref_logits.norm()).item()
            agree = (logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item()
            print(f"| {name} | {bits or 32} | {per_tok:.0f} | {per_tok / ref_bytes:.3f} | {(attn - ref_attn).abs().max().item():.2e} | {err:.2e} | {rel:.2e} | {100 * agree:.0f}% |")


@torch.no_grad()
def bench_quant_scores(n_tokens=96) -> None:
    """Layer 0 of llama-like: scores z_ij = q_i . k_j / sqrt(d_h) with keys as stored (after RoPE),
    float against int8 / int4 round trips. Layer 0's input does not depend on the cache, so this
    isolates the error the quantised keys put into the scores."""
    from companion.inference.kvquant import dequantize, quantize

    torch.manual_seed(3)
    model = from_preset("llama-like").eval()
    tokens = torch.randint(0, 256, (1, n_tokens))
    attn, pos = model.layers[0].attn, torch.arange(n_tokens)
    q, k, _ = attn.project_qkv(model.layers[0].attn_norm(model.embed(tokens)))
    q, k = attn.rope(q, pos), attn.rope(k, pos)
    causal = torch.ones(n_tokens, n_tokens, dtype=torch.bool).tril()

    def scores(keys):
        return (q @ keys.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1).transpose(-1, -2)) / attn.head_dim**0.5

    z = scores(k)
    print(f"\n### Quantised keys: attention scores of layer 0 (llama-like, {n_tokens} tokens, causal entries)\n")
    print(f"Float scores: std {z[..., causal].std().item():.3e}, max |z| {z[..., causal].abs().max().item():.3e}.\n")
    print("| bits | max abs err, scores | mean abs err, scores | max abs err, attention weights |")
    print("|---:|---:|---:|---:|")
    p_ref = torch.softmax(z.masked_fill(~causal, float("-inf")), -1)
    for bits in (8, 4):
        zq = scores(dequantize(*quantize(k, bits), bits))
        p_q = torch.softmax(zq.masked_fill(~causal, float("-inf")), -1)
        err = (zq - z)[..., causal].abs()
        print(f"| {bits} | {err.max().item():.2e} | {err.mean().item():.2e} | {(p_q - p_ref).abs().max().item():.2e} |")


def bench_throughput(n_requests=16, new=32, d_model=128, n_layers=4) -> dict:
    """Generated tokens/s: the engine with all requests at once versus one request after another."""
    torch.manual_seed(4)
    model = from_preset("llama-like", d_model=d_model, n_layers=n_layers, max_seq_len=512).eval()
    r = serve_benchmark(model, n_requests=n_requests, new_tokens=new)
    print(f"\n### Engine throughput: {n_requests} requests (prompts 16..64, {new} new tokens each), llama-like d={d_model}, {n_layers} layers\n")
    print("| run | wall s | generated tokens/s | speed-up | median TTFT s | outputs identical |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| one after another (contiguous cache) | {r['sequential_s']:.2f} | {r['sequential_tok_s']:.0f} | 1.0 | | |")
    print(f"| Engine, continuous batching (paged) | {r['engine_s']:.2f} | {r['engine_tok_s']:.0f} | {r['speedup']:.1f} | {r['median_ttft_s']:.3f} | {r['identical']} |")
    return r


def left_padded(prompts) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as one left-padded batch (ids, attention mask): every prompt ends at the last column."""
    L = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), L, dtype=torch.long)
    att = torch.zeros(len(prompts), L, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, L - len(p) :], att[b, L - len(p) :] = torch.tensor(p), 1
    return ids, att


@torch.no_grad()
def compare_with_transformers(model, prompts, workloads: dict, reps=5, compiled=True, hf_compiled=True, title="",
                              before=False) -> dict:
    """The Engine against transformers' batched generate() on the same weights, on the model's device
    and dtype; prints one markdown table and the goal verdicts; returns generated tokens/s by
    (workload, run).

    ``workloads`` maps a name to the new-token count of each request. transformers runs one static batch
    (left padding, greedy, sdpa, use_cache) to the longest request (what a user of generate() does with
    such a batch) and the user keeps each request's first n_i tokens; the engine retires each request
    when it is done. Runs: transformers eager (what a user picks), the Engine eager ("gather" kernel)
    and, with ``compiled``, ``Engine(compile=True)`` (torch.compile'd decode steps); with
    ``hf_compiled``, transformers with its own compile (``cache_implementation="static"`` +
    ``CompileConfig``, which generate() compiles the decode forward with; on a CPU only when asked to,
    ``_compile_all_devices``). A compiled run that fails is reported and left out; the rest are timed.
    With ``before``, also the eager Engine with the read of before issue 28 item 2 (``GatherEveryStep``).

    Generated tokens/s counts the tokens the requests asked for (sum of n_i) over the wall time.
    Repetitions are interleaved (every run, per workload, per round) after one untimed warm-up round,
    which also compiles: its wall time minus the timed median is reported as the compile time. Medians.
    Correctness: in float32 every run's tokens must equal transformers' eager tokens; in bf16 or fp16
    the tokens are reported, and both stacks' logits are checked against float32 (``low_precision_logits``).
    Each engine run gets a fresh Engine (page pool allocated before the clock starts, as a server does
    at start-up; no prefix pages carried over; compiled graphs are shared, built in the warm-up)."""
    import statistics

    import transformers

    from companion.hf import to_hf

    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    hf = to_hf(model, attn_implementation="sdpa").to(device=device, dtype=dtype).eval()
    # No end-of-sequence token: the engine's requests stop only at their length, so generate() must
    # too. (``to_hf`` names token 2 as eos; with it, min_new_tokens would forbid transformers from
    # choosing token 2 where its own argmax is 2, and the two would part ways for that reason alone.)
    hf.generation_config.eos_token_id = None
    n_requests = len(prompts)
    ids, att = (t.to(device) for t in left_padded(prompts))
    L = ids.shape[1]

    def run_hf(lens, compile_):
        n = max(lens)
        kw = {}
        if compile_:
            cc = transformers.CompileConfig(mode="default")  # "reduce-overhead" means CUDA graphs
            cc._compile_all_devices = True  # generate() compiles on CUDA only unless told
            kw = dict(cache_implementation="static", compile_config=cc)
        sync()
        start = time.perf_counter()
        out = hf.generate(ids, attention_mask=att, max_new_tokens=n, do_sample=False, pad_token_id=0, use_cache=True, **kw)
        sync()
        wall = time.perf_counter() - start
        return wall, [row[:k] for row, k in zip(out[:, L:].tolist(), lens)]

    def run_engine(lens, compile_, old_read=False):
        budget = max(1024, sum(len(p) for p in prompts))  # every prompt can prefill in the first step
        engine = Engine(model, page_size=16, max_batch_tokens=budget, max_seqs=n_requests, compile=compile_)
        if old_read:
            gathering_every_step(engine)
        params = [SamplingParams(max_new_tokens=k) for k in lens]
        sync()
        start = time.perf_counter()
        outs = engine.generate(prompts, params)
        sync()
        wall = time.perf_counter() - start
        work[tuple(lens)] = (engine.steps, engine.stats["tokens_fed"])
        return wall, [o.tokens for o in outs]

    work = {}  # workload -> (forwards, token rows fed) of the engine
    runs = {"hf": lambda lens: run_hf(lens, False)}
    if hf_compiled:
        runs["hf_c"] = lambda lens: run_hf(lens, True)
    if before:
        runs["engine_0"] = lambda lens: run_engine(lens, False, old_read=True)
    runs["engine"] = lambda lens: run_engine(lens, False)
    if compiled:
        runs["engine_c"] = lambda lens: run_engine(lens, True)
    names = {"hf": "transformers generate, eager (static batch, left padding)",
             "hf_c": "transformers generate, static cache + torch.compile",
             "engine_0": "companion Engine, eager, before (copies every page, every layer, every step)",
             "engine": "companion Engine, eager (paged, seats + SDPA)",
             "engine_c": "companion Engine, compile=True (compiled decode step)"}
    times = {(w, r): [] for w in workloads for r in runs}
    first, tokens = {}, {}
    for rnd in range(reps + 1):  # round 0: warm-up (and compilation), not timed
        for w, lens in workloads.items():
            for r in list(runs):
                try:
                    wall, toks = runs[r](lens)
                except Exception as e:  # a compile path that fails here: report it, time the rest
                    if not r.endswith("_c"):
                        raise
                    print(f"{names[r]}: failed, left out ({type(e).__name__}: {str(e)[:300]})")
                    del runs[r]
                    continue
                tokens[w, r] = toks
                if rnd:
                    times[w, r].append(wall)
                else:
                    first[w, r] = wall
    print(f"\n### Against transformers {transformers.__version__} generate(): {title}, {str(dtype).removeprefix('torch.')} "
          f"on {device.type}, {torch.get_num_threads()} thread(s), median of {reps} interleaved rounds\n")
    print("| workload | run | wall s | generated tokens/s | vs transformers eager | per-round range | identical to transformers | warm-up s (compile) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    result = {}
    for w, lens in workloads.items():
        total = sum(lens)
        label = f"{w}: {lens[0]} new each" if len(set(lens)) == 1 else f"{w}: {min(lens)}..{max(lens)} new (sum {total})"
        for r in runs:
            med = statistics.median(times[w, r])
            ratios = [h / e for h, e in zip(times[w, "hf"], times[w, r])]
            same = sum(a == b for a, b in zip(tokens[w, r], tokens[w, "hf"]))
            result[w, r] = total / med
            warm = f"{first[w, r]:.1f} ({first[w, r] - med:.1f})" if r.endswith("_c") else f"{first[w, r]:.2f}"
            print(f"| {label} | {names[r]} | {med:.3f} | {total / med:.0f} | {statistics.median(times[w, 'hf']) / med:.2f}x | "
                  f"{min(ratios):.2f}-{max(ratios):.2f} | {same}/{n_requests} | {warm} |")
    if dtype == torch.float32:
        for (w, r), toks in tokens.items():  # greedy on the same weights: every request token for token
            assert toks == tokens[w, "hf"], f"{w}, {r}: {sum(a == b for a, b in zip(toks, tokens[w, 'hf']))}/{n_requests} identical"
    else:
        # Two correct 16-bit stacks round differently and part ways at near-ties (the H200 run: 10/32
        # identical in bf16, with the engine equal to each request run alone). Token identity is
        # float32's test; in 16 bits each stack's logits are judged against a float32 reference.
        low_precision_logits(model, hf, prompts)
    print("\nwarm-up s: the untimed first run; for the compiled runs (in parentheses) minus the timed median, i.e. the compile time.")
    print("\nWork done (counted, not timed): forwards of the model and the token rows they are fed. The rows' ratio "
          "bounds the engine's speed-up where a forward's time grows with its rows; where a forward's time is a fixed "
          "per-call cost, the forwards' ratio does.\n")
    print("| workload | transformers: forwards, rows (padding and finished rows included) | engine: forwards, rows | rows ratio | forwards ratio |")
    print("|---|---:|---:|---:|---:|")
    for w, lens in workloads.items():
        hf_rows, hf_forwards = n_requests * (L + max(lens) - 1), max(lens)  # one prefill, then one row per request and step
        forwards, rows = work[tuple(lens)]
        print(f"| {w} | {hf_forwards}, {hf_rows:,} | {forwards}, {rows:,} | {hf_rows / rows:.2f}x | {hf_forwards / forwards:.2f}x |")
    if "engine_c" in runs:
        for w in workloads:
            same = sum(a == b for a, b in zip(tokens[w, "engine_c"], tokens[w, "engine"]))
            print(f"compiled engine tokens identical to the eager engine's, {w}: {same}/{n_requests}")
    for w in workloads:
        for r in [r for r in ("engine_0", "engine", "engine_c") if r in runs]:
            for base in [b for b in ("hf", "hf_c") if b in runs]:
                ratio = result[w, r] / result[w, base]
                kind = {"engine_0": "eager (before)", "engine": "eager", "engine_c": "compiled"}[r]
                print(f"Goal (>= 2x), {w}, {kind} engine vs transformers "
                      f"{'eager' if base == 'hf' else 'compiled'}: {'met' if ratio >= 2 else 'NOT met'} ({ratio:.2f}x)")
    return result


def low_precision_logits(model, hf, prompts, n: int = 4) -> dict:
    """Both stacks' 16-bit logits against a float32 copy of the same weights, on the first ``n`` prompts
    (each alone, no padding): max |logits - reference| / max |reference|. Prints one line and fails when
    the companion's error is more than twice transformers' plus one unit of the format (2^-8 for
    bf16, 2^-11 for fp16): the engine's model must be about as accurate as transformers' in the same
    arithmetic. Returns the two errors."""
    import copy

    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    reference = copy.deepcopy(model).float()
    errors = {"companion": 0.0, "transformers": 0.0}
    with torch.no_grad():
        for p in prompts[:n]:
            x = torch.tensor([p], device=device)
            want = reference(x).float()
            scale = want.abs().max().item()
            got = {"companion": model(x).float(), "transformers": hf(x).logits.float()}
            for name, logits in got.items():
                errors[name] = max(errors[name], (logits - want).abs().max().item() / scale)
    unit = torch.finfo(dtype).eps / 2  # 2^-8 for bf16, 2^-11 for fp16: the format's unit roundoff
    print(f"\n{str(dtype).removeprefix('torch.')} logits against a float32 reference (max relative error, {n} prompts): "
          f"companion {errors['companion']:.1e}, transformers {errors['transformers']:.1e}")
    bound = 2 * errors["transformers"] + unit
    assert errors["companion"] <= bound, f"companion's {dtype} logits err {errors['companion']:.3g} > {bound:.3g}"
    return errors


def bench_hf(
    n_requests=16, new=32, d_model=128, n_layers=4, n_heads=4, reps=5, mixed_range=(8, 64), compiled=True, hf_compiled=True,
    before=False,
) -> dict:
    """``compare_with_transformers`` on a llama-like model on the CPU, prompts of 16..64 tokens, two
    workloads: equal (every request wants ``new`` tokens: the best case for a static batch) and mixed
    (request i wants n_i tokens, n_i uniform in ``mixed_range``)."""
    torch.manual_seed(4)
    model = from_preset("llama-like", d_model=d_model, n_layers=n_layers, n_heads=n_heads, max_seq_len=512).eval()
    rng = random.Random(4)
    prompts = [[rng.randrange(256) for _ in range(rng.randint(16, 64))] for _ in range(n_requests)]
    workloads = {"equal": [new] * n_requests, "mixed": [rng.randint(*mixed_range) for _ in range(n_requests)]}
    title = (f"{n_requests} requests (prompts 16..64), llama-like d={d_model}, {n_layers} layers, {n_heads} heads "
             f"({model.num_parameters() / 1e6:.2f}M parameters)")
    return compare_with_transformers(model, prompts, workloads, reps, compiled, hf_compiled, title, before)


def bench_hf_read() -> dict:
    """Issue 28 item 2's workload: 24 requests, d = 256, the Engine before (pages gathered every
    step), after (seats) and compiled, side by side with transformers eager in one interleaved run of
    7 rounds (transformers' own compile left out: it is ``hf``'s question)."""
    return bench_hf(n_requests=24, d_model=256, compiled=True, hf_compiled=False, before=True, reps=7)


def bench_hf_sizes() -> None:
    """``hf`` at the toy size (d=128, 4 layers: eager and compiled, both stacks) and at a size where
    arithmetic outweighs the per-op overhead (d=512, 8 layers: eager only, to bound the time).
    For compile times as a first user sees them, run with an empty inductor cache:
    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) .venv/bin/python benchmarks/serving.py hf"""
    start = time.perf_counter()
    bench_hf()
    print(f"\n(toy size: {time.perf_counter() - start:.0f} s)")
    start = time.perf_counter()
    bench_hf(d_model=512, n_layers=8, n_heads=8, compiled=False, hf_compiled=False)
    print(f"\n(d=512: {time.perf_counter() - start:.0f} s)")


def memory_bandwidth(device="cpu", nbytes=2**30, repeats=5) -> dict:
    """Achieved memory bandwidth of ``device`` on one large float32 tensor (far larger than any cache):
    read = nbytes / (time of x.sum()), copy = 2 nbytes / (time of y.copy_(x)) (read + write); best of
    ``repeats``, in GB/s (1e9 bytes)."""
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
    y = torch.empty_like(x)
    best = {"read": float("inf"), "copy": float("inf")}
    for _ in range(repeats + 1):  # the first round warms up (page faults, kernel launch)
        for name, op in (("read", x.sum), ("copy", lambda: y.copy_(x))):
            sync()
            start = time.perf_counter()
            op()
            sync()
            best[name] = min(best[name], time.perf_counter() - start)
    size = x.numel() * 4
    return {"read_GBs": size / best["read"] / 1e9, "copy_GBs": 2 * size / best["copy"] / 1e9}


def decode_step_times(model, batch, prompt_len=32, steps=8, page_size=16, seed=0, n_pages=None, **engine_kw) -> dict:
    """Time ``steps`` engine steps in which all ``batch`` sequences decode (Engine.step(), public API):
    ``batch`` random prompts of ``prompt_len`` tokens are prefilled first (untimed: the engine's first
    step(s)); each timed step then feeds one token per sequence and samples its next token (greedy).
    Returns the step times (s), each step's context lengths (tokens each query attends over, the new
    one included) and the engine. Synchronises CUDA around every step. ``n_pages``: the pool size
    (default: just enough); equal pools across calls let ``compile=True`` engines share their graphs."""
    dev = next(model.parameters()).device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    rng = random.Random(seed)
    pages = batch * -(-(prompt_len + steps + 1) // page_size) if n_pages is None else n_pages
    engine = Engine(model, page_size=page_size, n_pages=pages, max_seqs=batch, max_batch_tokens=batch * prompt_len,
                    prefix_sharing=False, **engine_kw)
    for _ in range(batch):
        engine.add_request([rng.randrange(model.config.vocab_size) for _ in range(prompt_len)],
                           SamplingParams(max_new_tokens=steps + 1))
    seqs = engine.sequences
    while not all(s.output for s in seqs):  # prefill (one step when max_batch_tokens allows)
        engine.step()
    times, contexts = [], []
    for _ in range(steps):
        assert len(engine.scheduler.running) == batch and all(s.output for s in seqs)  # a pure decode step
        ctx = [len(s.tokens) for s in seqs]
        sync()
        start = time.perf_counter()
        events = engine.step()
        sync()
        times.append(time.perf_counter() - start)
        contexts.append(ctx)
        assert len(events) == batch
    return {"times": times, "contexts": contexts, "engine": engine}


@torch.no_grad()
def bench_bandwidth(batches=(1, 4, 16), d_model=1024, n_layers=16, n_heads=8, n_kv_heads=2, prompt_len=32, steps=8) -> list[dict]:
    """Decode bandwidth utilisation of the eager Engine on this CPU: bytes one decode step must read
    (``companion.accounting.decode_step_bytes``: weights once + the K/V of every sequence) over the
    measured step time, against this machine's read bandwidth measured in the same run. The model
    (float32, ~0.7 GB at the defaults) is larger than the last-level cache, so weights come from DRAM."""
    import statistics

    from companion.accounting import decode_step_bytes, flops_per_token

    torch.manual_seed(5)
    model = from_preset("llama-like", d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                        max_seq_len=256).eval()
    c = model.config
    bw = memory_bandwidth("cpu")
    weight_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    print(f"\n### Decode bandwidth utilisation (CPU, Engine eager): llama-like d={d_model}, {n_layers} layers, {n_heads} heads, "
          f"{n_kv_heads} kv heads ({model.num_parameters() / 1e6:.0f}M parameters, {weight_mb:.0f} MB float32), "
          f"prompts of {prompt_len}, median of {steps} decode steps, {torch.get_num_threads()} thread(s)\n")
    print(f"Measured memory bandwidth, same run, 1 GiB float32 tensor: read (x.sum()) {bw['read_GBs']:.1f} GB/s, "
          f"copy (y.copy_(x), read + write) {bw['copy_GBs']:.1f} GB/s.\n")
    print("| batch | step ms (median) | tokens/s | MB read per step (weights + KV) | achieved GB/s | utilisation (vs read GB/s) | GFLOP/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for B in batches:
        r = decode_step_times(model, B, prompt_len=prompt_len, steps=steps)
        i = r["times"].index(statistics.median_low(r["times"]))
        t, ctx = r["times"][i], r["contexts"][i]
        b = decode_step_bytes(c, ctx, param_bytes=4)
        flops = sum(flops_per_token(c, n) for n in ctx)
        row = {"batch": B, "step_s": t, "bytes": b, "GBs": b["total"] / t / 1e9, "util": b["total"] / t / 1e9 / bw["read_GBs"]}
        rows.append(row)
        print(f"| {B} | {1e3 * t:.1f} | {B / t:.0f} | {b['weights'] / 1e6:.0f} + {b['kv'] / 1e6:.1f} | {row['GBs']:.1f} | "
              f"{100 * row['util']:.0f}% | {flops / t / 1e9:.1f} |")
    print("\nMB read per step: weights (the input table only for the rows looked up) + K/V of every token each sequence "
          "attends over (``decode_step_bytes``); a lower bound on traffic (activations and K/V writes not counted).")
    return rows


@torch.no_grad()
def bench_gather(batch=16, context=1024, steps=8, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2) -> dict:
    """Share of the eager engine's decode step spent moving K/V, before (``GatherEveryStep``: every
    layer copies every sequence's K/V out of the pages) and after (seats: only the new rows move), in
    one run: two engines over the same model and prompts (``batch`` sequences whose prompts are
    ``context - 1`` tokens, prefilled first, untimed), their ``steps`` pure decode steps interleaved.
    Timed by wrapping the functions that move K/V: ``PagePool.read_slots`` (the copy out of the
    pages), ``SeatBuffers.fill`` (a seat's missing rows from the pages), ``SeatBuffers.write`` and
    ``PagePool.write_slots`` (the new rows into the seats and the pages)."""
    import statistics

    from companion.inference.batch import SeatBuffers
    from companion.inference.paged import PagePool

    torch.manual_seed(6)
    model = from_preset("llama-like", d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                        max_seq_len=context + steps + 2).eval()
    p = 16
    engines = {}
    for name in ("before", "after"):
        rng = random.Random(6)
        engine = Engine(model, page_size=p, n_pages=batch * -(-(context + steps + 1) // p), max_seqs=batch,
                        max_batch_tokens=batch * context, prefix_sharing=False)
        if name == "before":
            gathering_every_step(engine)
        for _ in range(batch):
            engine.add_request([rng.randrange(256) for _ in range(context - 1)], SamplingParams(max_new_tokens=steps + 2))
        while not all(s.output for s in engine.sequences):
            engine.step()
        engines[name] = engine
    spent = {"read": 0.0, "write": 0.0}
    wrapped = [(PagePool, "read_slots", "read"), (SeatBuffers, "fill", "read"), (SeatBuffers, "write", "write"),
               (PagePool, "write_slots", "write")]
    originals = [getattr(cls, attr) for cls, attr, _ in wrapped]

    def timer(fn, kind):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            spent[kind] += time.perf_counter() - start
            return out
        return timed

    rows = {name: {"step": [], "read": [], "write": []} for name in engines}
    tokens = {name: [] for name in engines}
    for (cls, attr, kind), fn in zip(wrapped, originals):
        setattr(cls, attr, timer(fn, kind))
    try:
        for _ in range(steps):
            for name, engine in engines.items():
                spent["read"] = spent["write"] = 0.0
                start = time.perf_counter()
                tokens[name].append(engine.step())
                t = time.perf_counter() - start
                rows[name]["step"].append(t)
                rows[name]["read"].append(spent["read"] / t)
                rows[name]["write"].append(spent["write"] / t)
    finally:
        for (cls, attr, _), fn in zip(wrapped, originals):
            setattr(cls, attr, fn)
    assert tokens["before"] == tokens["after"], "the two reads must give the same tokens"
    c = model.config
    copied = 2 * n_layers * batch * context * c.kv_heads * c.attn_head_dim * 4
    med = {name: {k: statistics.median(v) for k, v in r.items()} for name, r in rows.items()}
    print(f"\n### The engine's paged read: K/V moved in a decode step (llama-like d={d_model}, {n_layers} layers, "
          f"{n_heads} heads, {n_kv_heads} kv heads; batch {batch}, context {context}; median of {steps} interleaved steps, "
          f"{torch.get_num_threads()} thread(s))\n")
    print("| read | decode step ms | K/V copied out of the pages per step | copy out of the pages | writes of the new rows | tokens |")
    print("|---|---:|---:|---:|---:|---|")
    for name, label, mb in (("before", "gather every page, every layer, every step", copied / 1e6),
                            ("after", "seats (new rows only)", 0.0)):
        r = rows[name]
        print(f"| {label} | {1e3 * med[name]['step']:.1f} | {mb:.0f} MB | {100 * med[name]['read']:.0f}% "
              f"({100 * min(r['read']):.0f}-{100 * max(r['read']):.0f}%) | {100 * med[name]['write']:.1f}% | "
              f"{'identical' if name == 'after' else ''} |")
    share = med["after"]["read"] + med["after"]["write"]
    print(f"\nstep time before / after: {med['before']['step'] / med['after']['step']:.2f}x. Goal (K/V gather and copy "
          f"< 10% of the step): after, everything that moves K/V takes {100 * share:.1f}%: "
          f"{'met' if share < 0.10 else 'NOT met'} (before: {100 * (med['before']['read'] + med['before']['write']):.0f}%).")
    return {"median": med, "copied_bytes": copied}


def _tree_worker() -> None:
    """One side of ``bench_trees``: the companion package importable here (PYTHONPATH: the tree) serves
    bench_hf's mixed workload (16 requests, prompts 16..64, 8..64 new tokens, llama-like d=128, 4
    layers) with the eager Engine and transformers' eager generate(), one round per line read from
    stdin ("go"), and prints one JSON line: both walls, and a digest of each stack's tokens."""
    import hashlib
    import json

    import companion
    from companion.hf import to_hf

    torch.manual_seed(4)
    model = from_preset("llama-like", d_model=128, n_layers=4, n_heads=4, max_seq_len=512).eval()
    rng = random.Random(4)
    prompts = [[rng.randrange(256) for _ in range(rng.randint(16, 64))] for _ in range(16)]
    lens = [rng.randint(8, 64) for _ in range(16)]  # bench_hf's "mixed" workload
    hf = to_hf(model, attn_implementation="sdpa").eval()
    hf.generation_config.eos_token_id = None
    ids, att = left_padded(prompts)
    params = [SamplingParams(max_new_tokens=k) for k in lens]
    digest = lambda toks: hashlib.sha256(repr(toks).encode()).hexdigest()[:12]  # noqa: E731
    print(json.dumps({"package": companion.__file__}), flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        with torch.no_grad():
            start, cpu = time.perf_counter(), time.process_time()
            out = hf.generate(ids, attention_mask=att, max_new_tokens=max(lens), do_sample=False, pad_token_id=0, use_cache=True)
            hf_wall, hf_cpu = time.perf_counter() - start, time.process_time() - cpu
        hf_tokens = [row[:k] for row, k in zip(out[:, ids.shape[1]:].tolist(), lens)]
        engine = Engine(model, page_size=16, max_batch_tokens=1024, max_seqs=16)
        start, cpu = time.perf_counter(), time.process_time()
        outs = engine.generate(prompts, params)
        engine_wall, engine_cpu = time.perf_counter() - start, time.process_time() - cpu
        tokens = [o.tokens for o in outs]
        print(json.dumps({"hf": hf_wall, "engine": engine_wall, "hf_cpu": hf_cpu, "engine_cpu": engine_cpu, "engine_tokens": digest(tokens), "hf_tokens": digest(hf_tokens),
                          "identical": sum(a == b for a, b in zip(tokens, hf_tokens)), "generated": sum(lens)}), flush=True)


def bench_trees(other: str, rounds: int = 9) -> dict:
    """This tree's Engine against another tree's (``other``: a checkout, e.g. ``git worktree add
    /tmp/orig 26bdf99``), each against transformers' eager generate(), in one run: two worker
    processes (``_tree_worker``, one per tree, one thread each) take turns, round by round (this,
    other, other, this, ...), after one untimed warm-up round each. Best of ``rounds`` (the least
    disturbed round on a shared machine) and the median are reported; the tokens must be identical
    across the trees and to transformers'."""
    import json
    import os
    import statistics
    import subprocess
    from pathlib import Path

    here = str(Path(__file__).resolve().parent.parent)
    trees = {"this tree": here, "other tree": str(Path(other).resolve())}
    workers = {}
    for name, root in trees.items():
        env = dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS="1")
        workers[name] = subprocess.Popen([sys.executable, __file__, "_worker"], cwd=root, env=env, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        package = json.loads(workers[name].stdout.readline())["package"]
        assert package.startswith(root), f"{name} imported {package}, not its own tree {root}"
    runs = {name: [] for name in trees}

    def one(name):
        workers[name].stdin.write("go\n")
        workers[name].stdin.flush()
        return json.loads(workers[name].stdout.readline())

    for name in trees:  # warm-up
        one(name)
    order = list(trees)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            runs[name].append(one(name))
    for w in workers.values():
        w.stdin.close()
        w.wait()
    print(f"\n### The engine of two trees against transformers generate(), eager, one thread each: mixed workload "
          f"(16 requests, prompts 16..64, 8..64 new tokens), llama-like d=128, 4 layers; {rounds} interleaved rounds\n")
    print("wall: elapsed seconds; CPU: the worker's process time (one thread), less disturbed by other jobs on a "
          "shared machine. Best (least disturbed) round and median.\n")
    print("| tree | engine wall s best / median | engine CPU s best / median | transformers wall s best / median | "
          "transformers CPU s best / median | vs transformers, wall (best / median) | vs transformers, CPU (best / median) | identical to transformers |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    result = {}
    med = statistics.median
    for name, root in trees.items():
        rs = runs[name]
        col = {k: [x[k] for x in rs] for k in ("engine", "hf", "engine_cpu", "hf_cpu")}
        wall_ratio, cpu_ratio = [x["hf"] / x["engine"] for x in rs], [x["hf_cpu"] / x["engine_cpu"] for x in rs]
        result[name] = {k: (min(v), med(v)) for k, v in col.items()}
        cells = " | ".join(f"{min(col[k]):.3f} / {med(col[k]):.3f}" for k in ("engine", "engine_cpu", "hf", "hf_cpu"))
        print(f"| {name} ({root}) | {cells} | {min(col['hf']) / min(col['engine']):.2f}x / {med(wall_ratio):.2f}x | "
              f"{min(col['hf_cpu']) / min(col['engine_cpu']):.2f}x / {med(cpu_ratio):.2f}x | {rs[0]['identical']}/16 |")
    a, b = runs["this tree"], runs["other tree"]
    assert {x["engine_tokens"] for x in a} == {x["engine_tokens"] for x in b}, "the two trees' engines must give the same tokens"
    speed = {k: (min(x[k] for x in b) / min(x[k] for x in a), med(x[k] for x in b) / med(x[k] for x in a)) for k in ("engine", "engine_cpu")}
    print(f"\nthis tree's engine against the other's (other's time / this one's): wall {speed['engine'][0]:.3f}x best, "
          f"{speed['engine'][1]:.3f}x median; CPU {speed['engine_cpu'][0]:.3f}x best, {speed['engine_cpu'][1]:.3f}x median. "
          f"Tokens identical across the trees: yes")
    result["speed"] = speed
    return result


BENCHES = {"hf": bench_hf_sizes, "decode": bench_decode, "memory": bench_memory, "prefix": bench_prefix, "quant": bench_quant, "scores": bench_quant_scores, "throughput": bench_throughput}
BENCHES["bandwidth"] = bench_bandwidth
BENCHES["gather"] = bench_gather
BENCHES["hf24"] = bench_hf_read

if __name__ == "__main__":
    which = sys.argv[1:] or ["all"]
    if which[0] == "_worker":  # one side of ``bench_trees``
        torch.set_num_threads(1)
        _tree_worker()
        sys.exit(0)
    if which[0] == "trees":  # serving.py trees OTHER_CHECKOUT [rounds]
        torch.set_num_threads(1)
        bench_trees(which[1], *(int(x) for x in which[2:3]))
        sys.exit(0)
    torch.set_num_threads(1)  # one thread: timings less sensitive to other jobs on a shared machine
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name in BENCHES if "all" in which else which:
        BENCHES[name]()
