"""Micro-batcher and LRU cache: pure logic with a recording search function."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from retriever_server.batcher import LRUCache, MicroBatcher, QueueFull


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


def test_oversized_request_and_errors_fail_their_own_request_only():
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


def test_a_bad_query_fails_its_own_request_not_its_batch_mates():
    """Requests batched with a query that breaks the backend used to fail with it."""
    calls = []

    def search(queries, topk):
        calls.append(list(queries))
        time.sleep(0.01)
        if "boom" in queries:
            raise RuntimeError("index exploded")
        return [[(len(q), 0.5)] * topk for q in queries]

    async def run():
        b = MicroBatcher(search, max_batch_size=64, max_wait_ms=1)
        b.start()
        await b.submit(["warm"], 1)
        first = asyncio.ensure_future(b.submit(["slow"], 1))  # holds the worker: the next ones queue up
        await asyncio.sleep(0)
        out = await asyncio.wait_for(asyncio.gather(*(b.submit(qs, 1) for qs in (["a"], ["boom", "b"], ["cc"])),
                                                    return_exceptions=True), 5)
        await first
        await b.stop()
        return out

    a, bad, cc = asyncio.run(run())
    assert a == [[(1, 0.5)]] and cc == [[(2, 0.5)]]
    assert isinstance(bad, RuntimeError) and "exploded" in str(bad)
    assert ["a", "boom", "b", "cc"] in calls  # they were one batch, then searched apart


def test_an_error_while_forming_a_batch_fails_that_batch_and_the_loop_goes_on():
    """Any exception outside the search function used to end the batcher's task: every later
    request then waited for ever (while /health said ok)."""
    def search(queries, topk):
        return [[(len(q), 1.0)] * topk for q in queries]

    async def run():
        b = MicroBatcher(search, max_batch_size=8)
        take, broken = b._take, [True]

        def flaky_take():
            if broken:
                broken.clear()
                taken = take()
                raise KeyError("corrupted queue entry")
            return take()

        b._take = flaky_take
        b.start()
        with pytest.raises(RuntimeError, match="corrupted queue entry"):
            await asyncio.wait_for(b.submit(["a"], 1), 5)
        after = await asyncio.wait_for(b.submit(["bb"], 1), 5)
        alive = b.alive
        await b.stop()
        return after, alive, b.alive

    after, alive, alive_after_stop = asyncio.run(run())
    assert after == [[(2, 1.0)]] and alive and not alive_after_stop


def test_a_request_whose_client_left_is_not_searched():
    """A cancelled request (its client disconnected) is dropped from the queue, not searched."""
    calls = []

    def search(queries, topk):
        calls.append(list(queries))
        time.sleep(0.05)
        return [[(1, 1.0)] * topk for _ in queries]

    async def run():
        b = MicroBatcher(search, max_batch_size=64, max_wait_ms=1)
        b.start()
        first = asyncio.ensure_future(b.submit(["busy"], 1))
        await asyncio.sleep(0.01)  # the worker is searching "busy"
        gone = asyncio.ensure_future(b.submit(["left"], 1))
        stays = asyncio.ensure_future(b.submit(["stays"], 1))
        await asyncio.sleep(0)
        gone.cancel()
        await first
        await stays
        await b.stop()

    asyncio.run(run())
    assert calls == [["busy"], ["stays"]]


def test_the_queue_is_bounded():
    def search(queries, topk):
        time.sleep(0.05)
        return [[(1, 1.0)] * topk for _ in queries]

    async def run():
        b = MicroBatcher(search, max_batch_size=64, max_wait_ms=1, max_queued=4)
        b.start()
        first = asyncio.ensure_future(b.submit(["busy"], 1))
        await asyncio.sleep(0.01)
        waiting = [asyncio.ensure_future(b.submit([f"q{i}", f"r{i}"], 1)) for i in range(2)]
        await asyncio.sleep(0)
        assert b.queued == 4
        with pytest.raises(QueueFull, match="4 queries are waiting"):
            await b.submit(["one more"], 1)
        await asyncio.gather(first, *waiting)
        after = await b.submit(["fine"], 1)  # room again
        await b.stop()
        return after

    assert asyncio.run(run()) == [[(1, 1.0)]]


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
