"""The micro-batcher: one asyncio worker that merges concurrent requests into one model call.

A request is a job of `size` examples under a `key` (jobs merge only with jobs of the same
key: text with text, pairs with pairs, images with images). The worker takes the oldest job,
then keeps taking queued jobs of its key until the batch holds `max_batch` examples or
`max_wait_s` has passed since it took the first one, runs `run_batch(key, payloads)` once
in a worker thread (the event loop keeps accepting requests meanwhile), and hands each job
its own result. A job never splits: one larger than `max_batch` runs alone (the Predictor
then feeds it in slices of `max_batch`).

A merged batch that fails is run again job by job, so one bad request (a text with no real
token) fails alone, with the error its own call raises, and never takes its neighbours down.

`stop()` drains: it refuses new jobs, finishes every queued one, then ends the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

# (key, payloads) -> one result per payload, in order
RunBatch = Callable[[Hashable, list[Any]], list[Any]]


class ShuttingDown(Exception):
    """The batcher is stopping (or not started) and takes no new jobs."""


@dataclass
class _Job:
    key: Hashable
    payload: Any
    size: int
    future: asyncio.Future[Any]


class MicroBatcher:
    """Merge concurrent `submit` calls into `run_batch` calls of up to `max_batch` examples,
    each waiting at most `max_wait_s` for company."""

    def __init__(self, run_batch: RunBatch, max_batch: int, max_wait_s: float) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be 0 or more, not {max_wait_s}")
        self.run_batch = run_batch
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        # counters (read by /healthz and the tests)
        self.requests = 0  # jobs submitted
        self.batches = 0  # merged batches formed
        self.calls = 0  # run_batch calls (a failed merged batch adds one per job rerun)
        self.largest = 0  # most examples in one batch
        self._pending: deque[_Job] = deque()
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closing = False

    @property
    def accepting(self) -> bool:
        """Started, not stopping, and its worker alive."""
        return self._task is not None and not self._task.done() and not self._closing

    async def start(self) -> None:
        """Start the worker on the running event loop."""
        if self._task is not None:
            raise RuntimeError("the batcher is already started")
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="uqc-predict")
        self._task = asyncio.get_running_loop().create_task(self._work(), name="uqc-batcher")

    async def submit(self, key: Hashable, payload: Any, size: int) -> Any:
        """Queue one request of `size` examples; its result, or the exception its run raised."""
        if size < 1:
            raise ValueError(f"a job holds at least one example, not {size}")
        if not self.accepting or self._wakeup is None:
            raise ShuttingDown("the server is shutting down")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append(_Job(key, payload, size, future))
        self.requests += 1
        self._wakeup.set()
        return await future

    async def stop(self) -> None:
        """Refuse new jobs, finish every queued one, then end the worker and its thread."""
        self._closing = True
        if self._wakeup is not None:
            self._wakeup.set()
        if self._task is not None:
            await self._task
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        for job in self._pending:  # only if the worker died: never leave a caller waiting
            if not job.future.done():
                job.future.set_exception(ShuttingDown("the server is shutting down"))
        self._pending.clear()

    # -- the worker -----------------------------------------------------------------------

    async def _work(self) -> None:
        assert self._wakeup is not None
        while True:
            while not self._pending and not self._closing:
                self._wakeup.clear()
                await self._wakeup.wait()
            if not self._pending:  # closing and drained
                return
            await self._run(await self._collect(self._pending.popleft()))

    def _take(self, batch: list[_Job], total: int) -> int:
        """Move queued jobs of the batch's key that still fit into it (oldest first; the rest
        keep their places); returns the batch's examples."""
        key, kept = batch[0].key, deque[_Job]()
        while self._pending and total < self.max_batch:
            job = self._pending.popleft()
            if job.future.done():  # its client went away
                continue
            if job.key == key and total + job.size <= self.max_batch:
                batch.append(job)
                total += job.size
            else:
                kept.append(job)
        self._pending.extendleft(reversed(kept))
        return total

    async def _collect(self, first: _Job) -> list[_Job]:
        """The batch that starts with `first`: queued jobs of its key up to `max_batch`
        examples, waiting up to `max_wait_s` for more (not once stopping: nothing more comes)."""
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        batch, total = [first], first.size
        while True:
            total = self._take(batch, total)
            remaining = deadline - loop.time()
            if total >= self.max_batch or remaining <= 0 or self._closing:
                return batch
            self._wakeup.clear()
            # on a timeout: one last look at the queue, then the batch runs
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), remaining)

    async def _run(self, batch: list[_Job]) -> None:
        batch = [job for job in batch if not job.future.done()]  # cancelled while it waited
        if not batch:
            return
        self.batches += 1
        self.largest = max(self.largest, sum(job.size for job in batch))
        try:
            results = await self._call(batch[0].key, [job.payload for job in batch])
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0], exc=exc)
                return
            for job in batch:  # find the request that failed: each alone, with its own error
                if job.future.done():
                    continue
                try:
                    _settle(job, result=(await self._call(job.key, [job.payload]))[0])
                except Exception as alone:
                    _settle(job, exc=alone)
            return
        for job, result in zip(batch, results, strict=True):
            _settle(job, result=result)

    async def _call(self, key: Hashable, payloads: list[Any]) -> list[Any]:
        self.calls += 1
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(self._executor, self.run_batch, key, payloads)
        if len(results) != len(payloads):
            raise RuntimeError(
                f"run_batch returned {len(results)} results for {len(payloads)} requests"
            )
        return results


def _settle(job: _Job, result: Any = None, exc: BaseException | None = None) -> None:
    if job.future.done():  # cancelled while its batch ran
        return
    if exc is not None:
        job.future.set_exception(exc)
    else:
        job.future.set_result(result)
