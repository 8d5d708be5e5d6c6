"""``Engine``: continuous batching over a paged (or contiguous) KV cache.

Each ``step()``: the scheduler picks (sequence, n_tokens) pairs within the token budget, the runner
feeds them in one packed forward and samples where a sequence's known tokens are exhausted
(``companion.engine.runner``; the forward's K/V read is traced step by step in the docstring of
``companion.inference.batch``), and the engine appends tokens, registers newly full pages for prefix sharing, and retires sequences that
hit a stop token, max_new_tokens or the model's context (their pages return to the pool at once,
so waiting requests are admitted the very next step). Per request it records time to first token
(TTFT = first token time - arrival) and decode speed (generated tokens / (finish - arrival)).

Failure isolation: a step is a transaction. If the forward, the sampling or the page bookkeeping of
a step raises, every request fed in that step finishes with ``finish_reason="error"`` (the
exception's type and message in ``RequestOutput.error``), its pages return to the pool, and the
engine goes on serving everyone else; a bad request can never leave pages held or make later
``generate()`` calls fail. Requests are validated when they arrive (``SamplingParams.validate``,
``check_prompts``): wrong types, non-integers and out-of-range values raise ValueError naming the
argument, before anything is queued.
"""

from __future__ import annotations

import copy
import numbers
import time
from dataclasses import dataclass
from typing import Sequence as Seq

from torch import Tensor, nn

from companion.inference.generate import SamplingParams, check_decoder, check_prompts, context_length, finish_reason, is_int
from companion.inference.paged import PagedKVCache
from companion.engine.runner import Runner
from companion.engine.scheduler import Scheduler
from companion.engine.sequence import Sequence, Status

__all__ = ["Engine", "RequestOutput", "CACHES"]

CACHES = ("paged", "contiguous")


@dataclass
class RequestOutput:
    id: int
    prompt: list[int]
    tokens: list[int]
    finish_reason: str
    ttft_s: float
    tokens_per_s: float
    preemptions: int
    text: str | None = None
    error: str | None = None  # finish_reason "error": the exception that failed the request's step


def _check_pool_memory(model: nn.Module, n_pages: int, page_size: int, max_seqs: int) -> None:
    """ValueError naming n_pages and max_seqs when the page pool's keys and values (at most d_model wide
    per layer each, in the weights' dtype) and the step's block tables would not fit the memory
    available on the model's device."""
    from companion.training.memory import _shape, available_bytes, human

    param = next(model.parameters())
    layers, d, _, _ = _shape(model)
    tables = max_seqs * -(-context_length(model) // page_size) * 8  # the step's block tables, int64
    need = n_pages * page_size * 2 * layers * d * param.element_size() + tables
    available = available_bytes(param.device)
    if available is not None and need > available:
        raise ValueError(f"n_pages={n_pages:,} pages of {page_size} tokens (max_seqs={max_seqs:,} full contexts unless "
                         f"n_pages is given) need about {human(need)} of keys and values, more than the "
                         f"{human(available)} available: lower n_pages or max_seqs")


class Engine:
    """Serve ``model`` with continuous batching.

    Args:
        model: a ``Decoder`` or ``GPT`` (put in eval mode here).
        tokenizer: optional, with ``encode(str) -> list[int]`` and ``decode(list[int]) -> str``;
            lets prompts be strings and fills ``RequestOutput.text``.
        cache: "paged" (page pool, prefix sharing, preemption) or "contiguous" (one growing cache per sequence).
        max_batch_tokens: tokens fed per step, all sequences together (decode tokens + prefill chunks).
        page_size: p, token slots per page. n_pages: pool size (default: max_seqs full contexts).
        max_seqs: sequences running at once. kv_bits: None, 8 or 4 (quantised pages).
        prefix_sharing: map registered full prompt pages instead of recomputing them.
        attention_kernel: how attention reads the pages (paged cache only): "gather" (per-sequence
            padded batches over seats, dense copies of the running sequences' K/V written with the
            pages (``SeatBuffers``: one padded batch of them), torch SDPA; the fast CPU path), "reference" (``paged_attention_reference``),
            "triton" (``companion.kernels.triton_paged``: CUDA, or TRITON_INTERPRET=1), "flex" (torch's
            flex_attention over the pool with a block mask: compiled on CUDA, a slow check on a CPU), or None (all sequences
            packed into one row with a block mask). See ``companion.inference.batch.PagedBatch``.
        compile: run the decode steps (every sequence feeding one token) through a torch.compile'd
            forward (``companion.engine.compiled``): paged cache, "gather" kernel, float pages, and a
            Decoder with plain causal attention only; needs a C++ compiler for inductor. The first
            decode step compiles (tens of seconds on a small CPU); later engines reuse the graphs.
    """

    def __init__(
        self, model: nn.Module, tokenizer=None, *, cache: str = "paged", max_batch_tokens: int = 256, page_size: int = 16,
        n_pages: int | None = None, max_seqs: int = 32, kv_bits: int | None = None, prefix_sharing: bool = True,
        attention_kernel: str | None = "gather", compile: bool = False,
    ):
        if cache not in CACHES:
            raise ValueError(f"cache must be one of {CACHES}; got {cache!r}")
        _need_int("max_batch_tokens", max_batch_tokens)
        _need_int("page_size", page_size)
        _need_int("max_seqs", max_seqs)
        if n_pages is not None:
            _need_int("n_pages", n_pages)
        if kv_bits not in (None, 8, 4):
            raise ValueError(f"kv_bits must be None, 8 or 4; got {kv_bits!r}")
        if not isinstance(compile, bool):
            raise ValueError(f"compile must be True or False; got {compile!r}")
        if compile and cache != "paged":
            raise ValueError(f"compile=True needs cache='paged'; got cache={cache!r}")
        check_decoder(model, "Engine")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.context = context_length(model)
        if page_size > self.context:  # a page holds one sequence's tokens: past the context it is memory never used
            raise ValueError(f"page_size must be at most the model's context ({self.context} tokens); got {page_size}")
        self.page_size = page_size
        # a step never feeds more than every running sequence's whole context: a larger budget is never
        # spent, so it is capped there (10**12 would size the step's buffers at 10**12 rows)
        max_batch_tokens = min(max_batch_tokens, max_seqs * self.context)
        self.kv: PagedKVCache | None = None
        if cache == "paged":
            n_pages = max_seqs * -(-self.context // page_size) if n_pages is None else int(n_pages)
            _check_pool_memory(model, n_pages, page_size, max_seqs)  # before any page is allocated
            dtype = next(model.parameters()).dtype
            device = next(model.parameters()).device
            self.kv = PagedKVCache(
                model, n_pages, page_size, bits=kv_bits, dtype=dtype, device=device, prefix_sharing=prefix_sharing,
                attention_kernel=attention_kernel,
            )
        self.scheduler = Scheduler(model, self.kv, max_batch_tokens, max_seqs)
        decode_step = None
        if compile:
            from companion.engine.compiled import CompiledDecode

            decode_step = CompiledDecode(model, self.kv)  # ValueError naming compile when it cannot run
        self.runner = Runner(model, self.kv, max_batch_tokens, max_seqs, decode_step)
        self.sequences: list[Sequence] = []
        self.steps = 0
        # tokens_fed: rows through the model (prefill + decode; shared prefixes are not fed);
        # peak_pages: most pages referenced at once (cached-but-free pages not counted)
        self.stats = {"tokens_fed": 0, "prefill_tokens_fed": 0, "peak_pages": 0}

    # requests ---------------------------------------------------------------------------------------
    def add_request(self, prompt, params: SamplingParams | None = None) -> int:
        """Queue one request (with its own copy of ``params``); returns its id. Raises ValueError for an
        unservable request."""
        params = params or SamplingParams()
        if isinstance(params, SamplingParams):
            # The request keeps its own copy: a caller that reuses one SamplingParams and changes it
            # for the next request (max_new_tokens, even to an invalid value) changes only that one.
            params = copy.copy(params)
        prompt = self._check_request(prompt, params)
        seq = Sequence(len(self.sequences), prompt, params, time.perf_counter())
        seq.generator = params.generator()
        self.sequences.append(seq)
        if params.max_new_tokens == 0:
            self._finish(seq, "length", running=False)
        else:
            self.scheduler.add(seq)
        return seq.id

    def _check_request(self, prompt, params: SamplingParams) -> list[int]:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be SamplingParams; got {type(params).__name__}")
        params.validate()
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt is a string but the engine has no tokenizer; pass token ids or a tokenizer")
            prompt = self.tokenizer.encode(prompt)
        if isinstance(prompt, Tensor) and prompt.dim() != 1:
            raise ValueError(f"a tensor prompt must be 1-D (T,) token ids; got shape {tuple(prompt.shape)}")
        (prompt,) = check_prompts(self.model, [prompt])  # integers only: 2.0 or a float tensor is refused
        if self.kv is not None:
            longest = min(len(prompt) + params.max_new_tokens, self.context)
            need = -(-longest // self.page_size)
            if need > self.kv.n_pages:
                raise ValueError(
                    f"n_pages={self.kv.n_pages} is too small: one request of {len(prompt)} prompt + {params.max_new_tokens} new "
                    f"tokens needs {need} pages of {self.page_size}"
                )
        return prompt

    # the loop ---------------------------------------------------------------------------------------
    def step(self) -> list[tuple[int, int]]:
        """One scheduling step; returns the (request id, new token) pairs it produced. If the step
        raises, its requests finish with reason "error", their pages are freed and no pair is returned."""
        batch = self.scheduler.schedule()
        if not batch:
            if self.scheduler.has_work():
                raise RuntimeError("no sequence could be scheduled although requests wait: the pool cannot hold any of them")
            return []
        fed = sum(n for _, n in batch)
        self.stats["tokens_fed"] += fed
        if fed != len(batch):  # some sequence is prefilling
            self.stats["prefill_tokens_fed"] += sum(n for seq, n in batch if not seq.output)
        self.steps += 1
        try:
            new = self.runner.run(batch)
            if self.kv is not None:
                self.stats["peak_pages"] = max(self.stats["peak_pages"], self.kv.n_pages - self.kv.n_free)
                for seq, _ in batch:
                    seq.cache.commit(seq.tokens)  # name newly full pages for prefix sharing
        except Exception as error:  # noqa: BLE001 - a failed step must not poison the engine
            self._fail(batch, error)
            return []
        events = []
        for seq, tok in new:
            seq.append(tok)
            if seq.first_token_time is None:
                seq.first_token_time = time.perf_counter()
            events.append((seq.id, tok))
            reason = finish_reason(tok, seq.params, len(seq.output), len(seq.tokens), self.context)
            if reason is not None:
                self._finish(seq, reason)
        return events

    def _fail(self, batch: list[tuple[Sequence, int]], error: Exception) -> None:
        """Roll back a step that raised: its sequences finish with reason "error" and their pages
        (including the ones reserved for this step) go back to the pool; the rest keep running."""
        message = f"{type(error).__name__}: {error}"
        for seq, _ in batch:
            if seq.status is Status.RUNNING:
                seq.error = message
                self._finish(seq, "error")

    def weights_changed(self) -> None:
        """Say that the model's weights changed: no prefix page computed before is shared afterwards.
        In-place changes made through the parameters themselves are noticed without it (the pool
        compares ``companion.inference.paged.weights_version`` before sharing); edits through ``.data``
        are not."""
        if self.kv is not None:
            self.kv.invalidate_prefixes()

    def _finish(self, seq: Sequence, reason: str, running: bool = True) -> None:
        if running:
            self.scheduler.finish(seq)
        seq.status, seq.finish_reason, seq.finish_time = Status.FINISHED, reason, time.perf_counter()

    def generate(self, prompts, sampling_params: SamplingParams | Seq[SamplingParams] | None = None, arrivals: Seq[int] | None = None) -> list[RequestOutput]:
        """Serve every prompt to completion; request i is added before step ``arrivals[i]`` (default 0).
        ``sampling_params``: one for all, or one per prompt. Returns outputs in prompt order."""
        if not hasattr(prompts, "__iter__"):
            raise ValueError(f"prompts must be token ids (a list of ints, a list of lists or a tensor), or text with a "
                             f"tokenizer; got {type(prompts).__name__}")
        if isinstance(prompts, Tensor):
            if prompts.dim() not in (1, 2):
                raise ValueError(f"a prompts tensor must be (T,) or (B, T); got shape {tuple(prompts.shape)}")
            prompts = [prompts] if prompts.dim() == 1 else list(prompts)
        elif isinstance(prompts, str) or (
            prompts and isinstance(prompts[0], numbers.Number) and not isinstance(prompts[0], bool)
        ):
            prompts = [prompts]  # one prompt of ids (a float among them is refused by check_prompts)
        prompts = list(prompts)
        if not prompts:
            raise ValueError("prompts must hold at least one prompt; got none")
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"sampling_params needs one entry per prompt ({len(prompts)}); got {len(sampling_params)}")
        arrivals = [0] * len(prompts) if arrivals is None else list(arrivals)
        if len(arrivals) != len(prompts) or not all(is_int(a) and a >= 0 for a in arrivals):
            raise ValueError(f"arrivals needs one step index >= 0 per prompt ({len(prompts)}); got {arrivals}")
        for p, sp in zip(prompts, sampling_params):  # validate everything before queueing anything
            self._check_request(p, sp)
        order = sorted(range(len(prompts)), key=lambda i: arrivals[i])
        ids: dict[int, int] = {}
        step, k = 0, 0
        while k < len(order) or self.scheduler.has_work():
            if not self.scheduler.has_work():  # nothing runs until the next arrival: skip the idle steps
                step = max(step, arrivals[order[k]])
            while k < len(order) and arrivals[order[k]] <= step:
                ids[order[k]] = self.add_request(prompts[order[k]], sampling_params[order[k]])
                k += 1
            self.step()
            step += 1
        return [self.output(ids[i]) for i in range(len(prompts))]

    def output(self, request_id: int) -> RequestOutput:
        seq = self.sequences[request_id]
        done = seq.finish_time or time.perf_counter()
        ttft = (seq.first_token_time - seq.arrival) if seq.first_token_time is not None else float("nan")
        rate = len(seq.output) / (done - seq.arrival) if done > seq.arrival else float("nan")
        text = self.tokenizer.decode(seq.output) if self.tokenizer is not None else None
        return RequestOutput(
            seq.id, seq.prompt, list(seq.output), seq.finish_reason, ttft, rate, seq.preemptions, text, seq.error
        )


def _need_int(name: str, value) -> None:
    """Sizes are whole numbers: 10.5 pages is refused, never rounded."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be >= 1 and an integer; got {value!r}")
