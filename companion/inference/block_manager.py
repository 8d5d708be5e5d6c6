"""The block manager of the paged KV cache: which physical page holds which tokens (chapter 12).

Bookkeeping only, no tensors: a free list (oldest freed first), a reference count per page, and the
hash chain that names full pages so that sequences with a common prefix share them,

    h_0 = H(namespace),  h_k = H(h_{k-1}, tokens of page k).

What this module provides
- ``BlockManager``: allocate / free pages, register and look up full pages by hash, copy-on-write.
- ``PoolExhausted``: raised before anything is modified when the pool cannot serve a request.

``companion.inference.paged`` puts storage tensors (``PagePool``) and the per-sequence views on top.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from typing import Sequence

__all__ = ["BlockManager", "PoolExhausted"]


class PoolExhausted(RuntimeError):
    """The page pool has fewer free pages than an allocation needs. Nothing was changed."""


class BlockManager:
    """Bookkeeping of a pool of ``n_pages`` pages of ``page_size`` slots: free list, reference counts,
    the hash chain of full pages. Holds no tensors; ``on_copy(src, dst)`` copies a page's contents."""

    def __init__(self, n_pages: int, page_size: int, namespace: str = "", on_copy=None):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1; got {page_size}")
        if n_pages < 1:
            raise ValueError(f"n_pages must be >= 1; got {n_pages}")
        self.n_pages, self.page_size = n_pages, page_size
        self.ref = [0] * n_pages
        self.free_list: OrderedDict[int, None] = OrderedDict((i, None) for i in range(n_pages))  # oldest freed first
        self.hash_of: dict[int, bytes] = {}  # page -> hash of its (full, computed) contents
        self.page_of: dict[bytes, int] = {}  # hash -> page
        self.root = hashlib.sha256(namespace.encode()).digest()
        # pages that lost their name so far: lets a sequence skip re-registering pages when it knows
        # nothing was unnamed since its last ``register`` (``PagedSequenceCache.commit``)
        self.unnamed = 0
        self.on_copy = on_copy

    @property
    def n_free(self) -> int:
        return len(self.free_list)

    def rename(self, namespace: str) -> None:
        """A new namespace (h_0): every page loses its name, so nothing computed before can be shared
        afterwards (pages in use stay with their holders; a chain hashed from the old root never
        matches a new one, so a running sequence's later registrations cannot be shared either)."""
        self.root = hashlib.sha256(namespace.encode()).digest()
        self.unnamed += len(self.hash_of)
        self.hash_of.clear()
        self.page_of.clear()

    def pages_for(self, n_tokens: int) -> int:
        return math.ceil(n_tokens / self.page_size)

    # hash chain -------------------------------------------------------------------------------------
    def chain(self, tokens: Sequence[int], known: Sequence[bytes] = ()) -> list[bytes]:
        """h_k for every FULL page of ``tokens``. ``known``: h_0.. of a prefix already hashed (a chain
        depends only on the tokens before it, so a growing sequence hashes each page once)."""
        p, out = self.page_size, list(known[: len(tokens) // self.page_size])
        h = out[-1] if out else self.root
        for k in range(len(out), len(tokens) // p):
            h = hashlib.sha256(h + b"|" + ",".join(map(str, tokens[k * p : (k + 1) * p])).encode()).digest()
            out.append(h)
        return out

    # allocation -------------------------------------------------------------------------------------
    def _take(self) -> int:
        page, _ = self.free_list.popitem(last=False)
        old = self.hash_of.pop(page, None)  # its old contents are about to be overwritten
        if old is not None:
            del self.page_of[old]
            self.unnamed += 1
        self.ref[page] = 1
        return page

    def _release(self, page: int) -> None:
        if self.ref[page] < 1:
            raise RuntimeError(f"page {page} released more often than it was referenced")
        self.ref[page] -= 1
        if self.ref[page] == 0:
            self.free_list[page] = None  # contents (and hash) stay until the page is handed out again

    def share_prefix(self, tokens: Sequence[int]) -> list[int]:
        """Pages registered for the longest run of full leading pages of ``tokens``; each gets a reference."""
        pages = []
        for h in self.chain(tokens):
            page = self.page_of.get(h)
            if page is None:
                break
            if self.ref[page] == 0:
                del self.free_list[page]  # revived from the free list with its contents intact
            self.ref[page] += 1
            pages.append(page)
        return pages

    def _exclusive(self, table: list[int], start: int, end: int) -> bool:
        """Slots [start, end) (end > start) lie in pages the table has, held by it alone and unnamed:
        writing them needs no page and no copy."""
        first, last = start // self.page_size, (end - 1) // self.page_size
        if last >= len(table):
            return False
        if first == last:  # one page (a decode step): no generator
            page = table[first]
            return self.ref[page] == 1 and page not in self.hash_of
        return all(self.ref[table[k]] == 1 and table[k] not in self.hash_of for k in range(first, last + 1))

    def pages_needed(self, table: list[int], start: int, end: int) -> int:
        """Free pages a write of token slots [start, end) needs: new pages plus copies of shared ones."""
        if end <= start:
            return 0
        if self._exclusive(table, start, end):
            return 0  # the usual decode step (see ``prepare_write``)
        new = max(0, self.pages_for(end) - len(table))
        first, last = start // self.page_size, min(len(table), self.pages_for(end)) - 1
        return new + sum(1 for k in range(first, last + 1) if self.ref[table[k]] > 1)

    def prepare_write(self, table: list[int], start: int, end: int) -> None:
        """Make slots [start, end) writable: allocate pages, copy-on-write shared ones. Raises
        ``PoolExhausted`` before changing anything if the pool is short."""
        if end <= start or self._exclusive(table, start, end):
            return  # the usual decode step: the pages exist, are this table's alone and unnamed
        need = self.pages_needed(table, start, end)
        if need > self.n_free:
            raise PoolExhausted(f"page pool exhausted: this write needs {need} free page(s), {self.n_free} of {self.n_pages} are free")
        for k in range(start // self.page_size, min(len(table), self.pages_for(end))):
            page = table[k]
            if self.ref[page] > 1:  # copy-on-write: the other holders keep the original untouched
                fresh = self._take()
                if self.on_copy is not None:
                    self.on_copy(page, fresh)
                self._release(page)
                table[k] = fresh
            elif page in self.hash_of:  # sole holder overwrites a registered page: it no longer matches its hash
                del self.page_of[self.hash_of.pop(page)]
                self.unnamed += 1
        while len(table) < self.pages_for(end):
            table.append(self._take())

    def register(self, table: list[int], tokens: Sequence[int], n_computed: int, hashes: Sequence[bytes] | None = None) -> None:
        """Name the full, computed pages of a sequence by their hash so later sequences can share them.
        ``hashes``: the chain of those pages when the caller already has it (``chain``)."""
        for k, h in enumerate(self.chain(tokens[:n_computed]) if hashes is None else hashes):
            page = table[k]
            if page in self.hash_of or h in self.page_of:
                continue  # already named (perhaps another page holds the same contents: keep that one)
            self.hash_of[page], self.page_of[h] = h, page

    def free(self, table: list[int]) -> None:
        for page in reversed(table):  # the tail is least likely to be shared: hand it out first
            self._release(page)
        table.clear()
