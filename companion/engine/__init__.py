"""A continuous-batching serving engine in four small modules (chapter 12), read in this order:

- ``sequence``: one request's state (tokens, status, cache, timings).
- ``scheduler``: which sequences run this step and how many tokens each: decode the running ones,
  continue chunked prefills, admit waiting requests while pages last, preempt the youngest when
  the pool runs out (its pages are freed; it is recomputed later).
- ``runner``: one packed forward over the scheduled tokens, then sampling.
- ``engine``: ``Engine``, the loop tying them together, with per-request TTFT and tokens/s.

The page bookkeeping (block tables, free list, prefix hashing, copy-on-write) is ``companion.inference.paged``.
"""

from companion.engine.engine import Engine, RequestOutput
from companion.engine.sequence import Sequence, Status

__all__ = ["Engine", "RequestOutput", "Sequence", "Status"]
