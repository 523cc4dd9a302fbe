"""The micro-batcher of `uqc serve` (serve/batching.py), on a stand-in model: merging,
its bounds, keys, per-request failures, cancellation and the drain on stop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Hashable
from typing import Any

import pytest

from uqcompress.serve.batching import MicroBatcher, ShuttingDown


class Model:
    """Records each call's key, payloads and thread; doubles every number of a payload."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[tuple[Hashable, list[Any]]] = []
        self.threads: set[str] = set()
        self.delay = delay

    def __call__(self, key: Hashable, payloads: list[Any]) -> list[Any]:
        self.calls.append((key, list(payloads)))
        self.threads.add(threading.current_thread().name)
        if self.delay:
            time.sleep(self.delay)
        if any(p == ["bad"] for p in payloads):
            raise ValueError("a bad payload")
        return [[2 * x for x in p] for p in payloads]


async def _submit_all(batcher: MicroBatcher, jobs: list[tuple[Hashable, list[Any]]]) -> list[Any]:
    return await asyncio.gather(
        *(batcher.submit(key, payload, len(payload)) for key, payload in jobs),
        return_exceptions=True,
    )


def _run(model: Model, jobs: list[tuple[Hashable, list[Any]]], **kw: Any) -> list[Any]:
    async def main() -> list[Any]:
        batcher = MicroBatcher(model, **kw)
        await batcher.start()
        try:
            return await _submit_all(batcher, jobs)
        finally:
            await batcher.stop()

    return asyncio.run(main())


def test_concurrent_requests_are_merged_into_one_call_and_each_gets_its_own_slice() -> None:
    model = Model()
    jobs: list[tuple[Hashable, list[Any]]] = [("t", [i, 10 * i]) for i in range(10)]
    results = _run(model, jobs, max_batch=100, max_wait_s=0.2)
    assert results == [[2 * i, 20 * i] for i in range(10)]
    assert len(model.calls) == 1
    assert model.calls[0][1] == [p for _, p in jobs]  # in arrival order
    # the model ran in the batcher's thread, never on the event loop's
    assert model.threads == {"uqc-predict_0"}


def test_a_batch_holds_at_most_max_batch_examples() -> None:
    model = Model()
    jobs: list[tuple[Hashable, list[Any]]] = [("t", [i, i, i]) for i in range(10)]
    results = _run(model, jobs, max_batch=7, max_wait_s=0.2)
    assert results == [[2 * i] * 3 for i in range(10)]
    sizes = [sum(len(p) for p in payloads) for _, payloads in model.calls]
    assert max(sizes) <= 7 and sum(sizes) == 30
    assert len(model.calls) == 5  # two 3-example requests per batch


def test_a_request_larger_than_max_batch_runs_alone() -> None:
    model = Model()
    results = _run(model, [("t", list(range(9))), ("t", [1])], max_batch=4, max_wait_s=0.1)
    assert results == [[2 * i for i in range(9)], [2]]
    assert [payloads for _, payloads in model.calls] == [[list(range(9))], [[1]]]


def test_requests_of_different_keys_never_share_a_call() -> None:
    model = Model()
    jobs: list[tuple[Hashable, list[Any]]] = [("ab"[i % 2], [i]) for i in range(8)]
    results = _run(model, jobs, max_batch=64, max_wait_s=0.1)
    assert results == [[2 * i] for i in range(8)]
    assert sorted(key for key, _ in model.calls) == ["a", "b"]
    for key, payloads in model.calls:
        assert payloads == [[i] for i in range(8) if "ab"[i % 2] == key]


def test_a_failing_request_fails_alone_with_its_own_error() -> None:
    model = Model()
    jobs: list[tuple[Hashable, list[Any]]] = [("t", [1]), ("t", ["bad"]), ("t", [3])]
    results = _run(model, jobs, max_batch=64, max_wait_s=0.1)
    assert results[0] == [2] and results[2] == [6]
    assert isinstance(results[1], ValueError) and str(results[1]) == "a bad payload"
    # one merged call that failed, then each request alone
    assert [len(payloads) for _, payloads in model.calls] == [3, 1, 1, 1]


def test_with_no_wait_a_lone_request_runs_at_once() -> None:
    async def main() -> tuple[list[Any], float]:
        batcher = MicroBatcher(model, max_batch=64, max_wait_s=0.0)
        await batcher.start()
        start = time.perf_counter()
        first = await batcher.submit("t", [1], 1)
        second = await batcher.submit("t", [2], 1)
        took = time.perf_counter() - start
        await batcher.stop()
        return [first, second], took

    model = Model()
    results, took = asyncio.run(main())
    assert results == [[2], [4]]
    assert len(model.calls) == 2  # one after the other: nothing to merge
    assert took < 1.0


def test_requests_queued_while_a_batch_runs_form_the_next_batch() -> None:
    """With no wait at all, requests that arrive while the model is busy still merge."""

    async def main() -> list[Any]:
        batcher = MicroBatcher(model, max_batch=64, max_wait_s=0.0)
        await batcher.start()
        first = asyncio.ensure_future(batcher.submit("t", [0], 1))
        await asyncio.sleep(0.05)  # the first call is running (0.3 s)
        rest = [asyncio.ensure_future(batcher.submit("t", [i], 1)) for i in range(1, 6)]
        results = await asyncio.gather(first, *rest)
        await batcher.stop()
        return list(results)

    model = Model(delay=0.3)
    assert asyncio.run(main()) == [[2 * i] for i in range(6)]
    assert [len(payloads) for _, payloads in model.calls] == [1, 5]


def test_a_cancelled_request_is_not_run() -> None:
    async def main() -> list[Any]:
        batcher = MicroBatcher(model, max_batch=64, max_wait_s=0.2)
        await batcher.start()
        gone = asyncio.ensure_future(batcher.submit("t", [7], 1))
        kept = asyncio.ensure_future(batcher.submit("t", [8], 1))
        await asyncio.sleep(0.01)
        gone.cancel()
        result = await kept
        await batcher.stop()
        return [gone.cancelled(), result]

    model = Model()
    assert asyncio.run(main()) == [True, [16]]
    assert model.calls == [("t", [[8]])]


def test_stop_drains_queued_requests_then_refuses_new_ones() -> None:
    async def main() -> tuple[list[Any], bool]:
        batcher = MicroBatcher(model, max_batch=2, max_wait_s=0.5)
        await batcher.start()
        pending = [asyncio.ensure_future(batcher.submit("t", [i], 1)) for i in range(5)]
        await asyncio.sleep(0)  # queued, none run yet
        await batcher.stop()
        assert all(task.done() for task in pending)
        results = [task.result() for task in pending]
        with pytest.raises(ShuttingDown):
            await batcher.submit("t", [9], 1)
        return results, batcher.accepting

    model = Model()
    results, accepting = asyncio.run(main())
    assert results == [[2 * i] for i in range(5)]
    assert not accepting
    assert sum(len(p) for _, p in model.calls) == 5 and all(len(p) <= 2 for _, p in model.calls)


def test_a_batcher_not_started_refuses_work_and_bad_bounds_are_refused() -> None:
    async def main() -> None:
        with pytest.raises(ShuttingDown):
            await MicroBatcher(Model(), max_batch=4, max_wait_s=0.0).submit("t", [1], 1)

    asyncio.run(main())
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        MicroBatcher(Model(), max_batch=0, max_wait_s=0.0)
    with pytest.raises(ValueError, match="max_wait_s must be 0 or more"):
        MicroBatcher(Model(), max_batch=1, max_wait_s=-1.0)
