"""Micro-batcher and LRU cache: pure logic with a recording search function."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from retriever_server.batcher import LRUCache, MicroBatcher


def fake_search(calls):
    def search(queries, topk):
        calls.append((list(queries), topk, threading.current_thread().name))
        time.sleep(0.02)  # long enough for the next requests to queue up
        # deterministic per query: rows derived from the text, best first
        return [[(hash(q) % 1000 + j, 1.0 - j / 10) for j in range(topk)] for q in queries]
    return search


def test_concurrent_requests_share_batches_and_get_their_own_results():
    calls = []

    async def run():
        b = MicroBatcher(fake_search(calls), max_batch_size=8, max_wait_ms=5)
        b.start()
        reqs = [([f"q{i}", f"q{i + 1}"], 1 + i % 3) for i in range(20)]  # overlapping queries, mixed topk
        out = await asyncio.gather(*(b.submit(qs, k) for qs, k in reqs))
        await b.stop()
        return reqs, out

    reqs, out = asyncio.run(run())
    ref = fake_search([])
    for (qs, k), res in zip(reqs, out):
        assert res == ref(qs, k)  # own queries, in order, own topk (prefix of the batch's max)
    assert all(name.startswith("retrieve") for _, _, name in calls)  # off the event loop
    assert len(calls) < len(reqs)  # requests were gathered
    for qs, _, _ in calls:
        assert len(qs) == len(set(qs)) and len(qs) <= 8  # de-duplicated, bounded


def test_oversized_request_and_errors_propagate_to_their_batch_only():
    def search(queries, topk):
        if "boom" in queries:
            raise RuntimeError("index exploded")
        return [[(len(q), 0.5)] * topk for q in queries]

    async def run():
        b = MicroBatcher(search, max_batch_size=4, max_wait_ms=1)
        b.start()
        big = await b.submit([f"q{i}" for i in range(10)], 1)  # larger than max_batch_size: one batch
        with pytest.raises(RuntimeError, match="exploded"):
            await b.submit(["boom"], 2)
        after = await b.submit(["fine"], 1)
        empty = await b.submit([], 3)
        await b.stop()
        return big, after, empty

    big, after, empty = asyncio.run(run())
    assert big == [[(2, 0.5)]] * 10
    assert after == [[(4, 0.5)]] and empty == []


def test_lru_cache_is_bounded_and_recency_ordered():
    c = LRUCache(2)
    c.put(("a", 3), [(1, 1.0)])
    c.put(("b", 3), [(2, 1.0)])
    assert c.get(("a", 3)) == [(1, 1.0)]  # a is now most recent
    c.put(("c", 3), [(3, 1.0)])
    assert c.get(("b", 3)) is None and c.get(("a", 3)) is not None and len(c) == 2
    assert c.get(("a", 5)) is None  # topk is part of the key
    off = LRUCache(0)
    off.put(("a", 3), [])
    assert off.get(("a", 3)) is None and len(off) == 0


def test_two_workers_search_two_batches_at_once():
    """workers=2: a second batch starts while the first is still searching (the server's CPU
    default, so the cores are not idle between batches); each request still gets its own hits."""
    active, peak, lock = [0], [0], threading.Lock()

    def search(queries, topk):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return [[(len(q), 1.0)] * topk for q in queries]

    async def run(workers):
        b = MicroBatcher(search, max_batch_size=4, workers=workers)
        b.start()
        out = await asyncio.gather(*(b.submit([f"q{'x' * i}"], 1) for i in range(12)))
        await b.stop()
        return out

    for workers, want_peak in ((1, 1), (2, 2)):
        peak[0] = 0
        out = asyncio.run(run(workers))
        assert out == [[[(1 + i, 1.0)]] for i in range(12)]
        assert peak[0] == want_peak, (workers, peak[0])


def test_a_backend_returning_too_few_lists_fails_the_batch_not_the_server():
    """A search function that returns fewer hit lists than queries used to end the batcher's
    task with an IndexError, after which every request waited for ever."""
    def search(queries, topk):
        return [[(0, 1.0)]] if len(queries) > 1 else [[(1, 1.0)] * topk for _ in queries]

    async def run():
        b = MicroBatcher(search, max_batch_size=8)
        b.start()
        with pytest.raises(RuntimeError, match="1 hit lists for 2 queries"):
            await asyncio.wait_for(b.submit(["a", "b"], 1), 5)
        after = await asyncio.wait_for(b.submit(["c"], 1), 5)  # the server keeps serving
        await b.stop()
        return after

    assert asyncio.run(run()) == [[(1, 1.0)]]


def test_one_large_request_is_cut_between_free_workers():
    """A single request of 40 queries with two idle workers: two chunks searched at once (Search-R1
    sends a turn's queries in one request), the answers in request order."""
    calls, lock = [], threading.Lock()

    def search(queries, topk):
        with lock:
            calls.append(list(queries))
        time.sleep(0.05)
        return [[(int(q[1:]), 1.0)] * topk for q in queries]

    async def run():
        b = MicroBatcher(search, max_batch_size=64, workers=2)
        b.start()
        t = time.perf_counter()
        out = await b.submit([f"q{i}" for i in range(40)], 2)
        small = await b.submit([f"q{i}" for i in range(9)], 1)  # fewer than 2 * MIN_CHUNK: one chunk
        await b.stop()
        return out, small, time.perf_counter() - t

    out, small, _ = asyncio.run(run())
    assert out == [[(i, 1.0)] * 2 for i in range(40)] and small == [[(i, 1.0)] for i in range(9)]
    assert sorted(map(len, calls)) == [9, 20, 20] and calls[0][0] in ("q0", "q20")
