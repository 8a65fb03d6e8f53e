"""Group commit: one writer thread per process runs everyone's write jobs, many to a transaction.

Request threads and delivery threads hand their work to the writer as a function of the
transaction and wait for its result. While one batch commits, the next one gathers, so under
load many jobs share one lock acquisition and one fsync, and only one thread in each process
competes for the database's write lock. Each job runs in a savepoint of its own: a job that
raises leaves no trace, and the others in its batch commit as if it had not been there.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Generic, TypeVar

from ..verbs import SqlVerbs

Result = TypeVar("Result")

#: Jobs in one transaction at most; enough to amortise the fsync, few enough to keep it short.
MAX_BATCH = 64


class _Job(Generic[Result]):
    __slots__ = ("work", "durable", "done", "result", "error", "queued_at")

    def __init__(self, work: Callable[[SqlVerbs], Result], durable: bool) -> None:
        self.work = work
        self.durable = durable
        self.queued_at = time.perf_counter()
        self.done = threading.Event()
        self.result: Result | None = None
        self.error: BaseException | None = None


class Writer:
    """The writer of one process; it starts on first use, in the process that uses it (so a
    thread is never carried across ``fork()``).

    :param transaction: opens a write transaction on the writer thread's connection.
    :param close: closes that connection, when the thread ends.
    :param observe: called with how long each job of a transaction waited for it.
    """

    def __init__(
        self,
        transaction: Callable[[bool], AbstractContextManager[SqlVerbs]],
        close: Callable[[], None],
        observe: Callable[[Sequence[float]], None] = lambda waits: None,
    ) -> None:
        self._transaction = transaction
        self._close = close
        self._observe = observe
        self._queue: queue.SimpleQueue[_Job[object] | None] = queue.SimpleQueue()
        self._pid: int | None = None
        self._start_lock = threading.Lock()
        #: The thread of the last start, and the process that started it.
        self._thread: tuple[threading.Thread, int] | None = None

    def run(self, work: Callable[[SqlVerbs], Result], durable: bool = True) -> Result:
        """Run ``work(tx)`` in the writer's next transaction; its result, or its exception.

        :param durable: the result is returned only once the commit is on disk. A batch is
            durable when any of its jobs asks for it.
        """
        self._ensure_started()
        job: _Job[Result] = _Job(work, durable)
        self._queue.put(job)  # type: ignore[arg-type]
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]

    def stop(self) -> None:
        """End the writer thread once the jobs before now are done; the next :meth:`run`
        starts a new one."""
        with self._start_lock:
            if self._pid == os.getpid():
                self._queue.put(None)
                self._pid = None

    def _ensure_started(self) -> None:
        if self._pid == os.getpid():
            return
        with self._start_lock:
            if self._pid != os.getpid():
                # A writer stopped in this process may still be committing its last jobs on
                # the one write connection, and closes it when done: the new one waits for it.
                last = self._thread
                if last and last[1] == os.getpid() and last[0] is not threading.current_thread():
                    last[0].join()
                self._queue = queue.SimpleQueue()
                thread = threading.Thread(target=self._loop, name="mailsvc-writer", daemon=True)
                thread.start()
                self._thread = (thread, os.getpid())
                self._pid = os.getpid()

    def _loop(self) -> None:
        jobs_queue = self._queue
        stopping = False
        try:
            while not stopping:
                first = jobs_queue.get()
                jobs = [first] if first is not None else []
                stopping = first is None
                # Gather what is waiting; when stopping, all of it, so no caller is stranded.
                while stopping or len(jobs) < MAX_BATCH:
                    try:
                        job = jobs_queue.get_nowait()
                    except queue.Empty:
                        break
                    if job is None:
                        stopping = True
                    else:
                        jobs.append(job)
                if jobs:
                    self._commit(jobs)
        finally:
            self._close()

    def _commit(self, jobs: list[_Job[object]]) -> None:
        try:
            with self._transaction(any(job.durable for job in jobs)) as tx:
                began = time.perf_counter()
                # Each waited for the writer, then the file lock.
                self._observe([began - job.queued_at for job in jobs])
                # A job alone needs no savepoint (two statements): when it raises, the whole
                # transaction is rolled back, and that is all it wrote.
                alone = len(jobs) == 1
                for job in jobs:
                    try:
                        with nullcontext() if alone else tx.savepoint():
                            job.result = job.work(tx)
                    except BaseException as exc:  # the job's own failure: handed to its caller
                        job.error = exc
                        if alone:
                            raise
        except BaseException as exc:  # the commit failed: nothing of the batch stands
            for job in jobs:
                job.error = job.error or exc
        finally:
            for job in jobs:
                job.done.set()
