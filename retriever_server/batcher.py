"""Micro-batching: concurrent requests' queries are searched together in one call.

A rollout sends many small requests at once (each trajectory searches on its own). Encoding
one query at a time wastes most of a CPU's throughput, so the distinct queries of the waiting
requests (up to `max_batch_size`) are encoded and searched in ONE call on a worker thread, off
the event loop. While `workers` calls run, new requests queue up and form the next batch, so
batches grow with the load by themselves. An idle server starts a query at once (a fixed 3 ms
wait made a lone query 7.1 instead of 2.6 ms); while another worker is busy, a free worker
holds its batch open up to `max_wait_ms` for more, so the burst of requests that a finished
batch sends back is gathered instead of being cut into batches of one.

Two workers on two cores (the server's CPU default): one batch encodes while the event loop
answers the last one and reads the next, so the cores are not idle between batches. Measured
on a 2-core AVX-512 EPYC at 64 clients: 862 q/s with one worker of two encoder threads, 1,276
with two workers of one thread each (server CPU 143% -> 172%). A batch of at least
2 * MIN_CHUNK distinct queries that finds several workers free is cut into one chunk per free
worker, so one large request (Search-R1 sends a turn's queries together) still uses every core.

Faults stay with their requests: a search call that fails is retried one request at a time,
so a query that breaks the backend fails its own request only; an error while forming a batch
fails that batch and the loop goes on (`alive` says whether it runs: /health reports it); a
request whose client left (its future cancelled) is dropped before it is searched; and the
queue is bounded (`QueueFull` past `max_queued` queries: the server answers 503).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

log = logging.getLogger(__name__)

# one result per query: [(row, score)] best first, at most the batch's largest topk
Hits = list[tuple[int, float]]
SearchFn = Callable[[list[str], int], list[Hits]]
MIN_CHUNK = 8
"""Fewest queries a worker gets when a batch is cut between free workers."""


class QueueFull(RuntimeError):
    """More queries are waiting than `max_queued`: the caller should retry later."""


@dataclass
class _Pending:
    queries: list[str]
    topk: int
    future: asyncio.Future
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = len(self.queries)


class MicroBatcher:
    """`await submit(queries, topk)` -> one Hits list per query, in order, truncated to topk.

    A batch is searched with its largest topk and each request keeps its own prefix; this is
    exact for flat/IVF/BM25 and for HNSW when efSearch >= max_topk (settings enforce it)."""

    def __init__(self, search_fn: SearchFn, max_batch_size: int = 64, max_wait_ms: float = 2.0,
                 on_batch: Callable[[int, int, int], None] | None = None, workers: int = 1,
                 max_queued: int = 8192):
        self.search_fn = search_fn
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.on_batch = on_batch  # (requests, queries, distinct queries) of every batch formed
        self.workers = workers
        self.max_queued = max_queued
        self._queue: list[_Pending] = []
        self._queued = 0
        self._wake = asyncio.Event()
        self._free = workers  # workers not searching; touched from the event loop only
        self._freed = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="retrieve")
        self._task: asyncio.Task | None = None
        self._searches: set[asyncio.Task] = set()
        self._forming: list[_Pending] = []

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="micro-batcher")

    @property
    def alive(self) -> bool:
        """The batching loop runs (False before start, after stop, or had it ended by an error)."""
        return self._task is not None and not self._task.done()

    @property
    def queued(self) -> int:
        """Queries waiting for a worker."""
        return self._queued

    async def stop(self) -> None:
        for t in [self._task, *self._searches]:
            if t is not None:
                t.cancel()
                try:
                    await t
                except asyncio.CancelledError:
                    pass
        for p in self._queue + self._forming:
            if not p.future.done():
                p.future.set_exception(RuntimeError("server shutting down"))
        self._queue.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, queries: Sequence[str], topk: int) -> list[Hits]:
        if not queries:
            return []
        if not self.alive:
            raise RuntimeError("the search loop is not running")
        if self._queued and self._queued + len(queries) > self.max_queued:
            raise QueueFull(f"{self._queued} queries are waiting (max_queued={self.max_queued})")
        fut = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(list(queries), topk, fut))
        self._queued += len(queries)
        self._wake.set()
        return await fut

    def _take(self) -> list[_Pending]:
        """Whole requests up to max_batch_size queries (always at least one request)."""
        taken, n = [], 0
        while self._queue and (not taken or n + self._queue[0].size <= self.max_batch_size):
            p = self._queue.pop(0)
            n += p.size
            taken.append(p)
            self._forming.append(p)
        self._queued -= n
        return taken

    async def _run(self) -> None:
        while True:
            self._forming = []  # taken from the queue, not yet handed to a search task
            try:
                batch = await self._next_batch()
                if batch:
                    self._launch(batch)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the loop must outlive any fault of one batch
                log.exception("forming a batch failed; its requests get the error, the next batch goes on")
                for p in self._forming:
                    _fail(p, RuntimeError(f"batching failed: {type(e).__name__}: {e}"))

    async def _next_batch(self) -> list[_Pending]:
        """Wait for queries (and a free worker), then take the next batch of live requests."""
        loop = asyncio.get_running_loop()
        await self._wake.wait()
        self._wake.clear()
        if not self._queue:
            return []
        deadline = loop.time() + (self.max_wait if self._free < self.workers else 0.0)
        while self._queued < self.max_batch_size and (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except TimeoutError:
                break
            self._wake.clear()
        while self._free == 0:  # wait for a worker; the queue keeps growing meanwhile
            self._freed.clear()
            await self._freed.wait()
        batch = [p for p in self._take() if not p.future.done()]  # a client that left: dropped
        if self._queue:
            self._wake.set()  # leftovers start the next batch right away
        return batch

    def _launch(self, batch: list[_Pending]) -> None:
        distinct = list(OrderedDict.fromkeys(q for p in batch for q in p.queries))
        chunks = max(1, min(self._free, len(distinct) // MIN_CHUNK))
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._search(loop, batch, distinct, chunks))
        self._free -= chunks
        self._searches.add(task)
        task.add_done_callback(lambda t, n=chunks: self._done(t, n))

    def _done(self, task: asyncio.Task, chunks: int) -> None:
        self._searches.discard(task)
        self._free += chunks
        self._freed.set()

    async def _search(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending], distinct: list[str],
                      chunks: int) -> None:
        if self.on_batch is not None:
            self.on_batch(len(batch), sum(p.size for p in batch), len(distinct))
        try:
            results = await self._answer(loop, batch, distinct, chunks)
        except Exception as e:  # noqa: BLE001
            if len(batch) == 1:
                log.exception("search failed")
                _fail(batch[0], e)
                return
            # one request's query may be what broke the call: each request alone, so only it fails
            log.warning("a batch of %d requests failed (%s: %s); searching them one at a time",
                        len(batch), type(e).__name__, e)
            for p in batch:
                if p.future.done():
                    continue
                try:
                    (r,) = await self._answer(loop, [p], list(dict.fromkeys(p.queries)), 1)
                except Exception as e1:  # noqa: BLE001
                    log.exception("search failed for a request of %d queries", p.size)
                    _fail(p, e1)
                else:
                    _succeed(p, r)
            return
        for p, r in zip(batch, results):
            _succeed(p, r)

    async def _answer(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending], distinct: list[str],
                      chunks: int) -> list[list[Hits]]:
        """Each request's hit lists: `distinct` searched in `chunks` parallel calls."""
        topk = max(p.topk for p in batch)
        bounds = [len(distinct) * i // chunks for i in range(chunks + 1)]
        parts = await asyncio.gather(*(loop.run_in_executor(self._executor, self.search_fn, distinct[lo:hi], topk)
                                       for lo, hi in zip(bounds, bounds[1:])))
        hits = [h for part in parts for h in part]
        if len(hits) != len(distinct):
            raise RuntimeError(f"search returned {len(hits)} hit lists for {len(distinct)} queries")
        where = {q: i for i, q in enumerate(distinct)}
        return [[hits[where[q]][:p.topk] for q in p.queries] for p in batch]


def _succeed(p: _Pending, result: list[Hits]) -> None:
    if not p.future.done():
        p.future.set_result(result)


def _fail(p: _Pending, error: BaseException) -> None:
    if not p.future.done():
        p.future.set_exception(error)


class LRUCache:
    """Bounded (query, topk) -> Hits cache; used from the event loop thread only (no lock)."""

    def __init__(self, size: int):
        self.size = size
        self._d: OrderedDict[tuple[str, int], Hits] = OrderedDict()

    def get(self, key: tuple[str, int]) -> Hits | None:
        if self.size <= 0:
            return None
        v = self._d.get(key)
        if v is not None:
            self._d.move_to_end(key)
        return v

    def put(self, key: tuple[str, int], value: Hits) -> None:
        if self.size <= 0:
            return
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)
