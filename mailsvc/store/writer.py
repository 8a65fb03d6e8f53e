"""Group commit: a write that finds none under way commits at once on its caller's thread; the
writes that come meanwhile are committed, many to a transaction, by the process's writer thread.

Request threads and delivery threads hand their work to the writer as a function of the
transaction. A caller that finds no transaction under way runs its job at once, on its own
thread: no hand-off to another thread and back (each a wake-up of a sleeping thread, about
0.1 ms of CPU on a virtual machine, and its wait for the interpreter's lock). The callers that
come while a transaction is under way queue and wait; the writer thread, handed the queue,
commits what waits in batches until nothing does, so under load many jobs share one
transaction: on SQLite one acquisition of the database's write lock and one fsync, on
PostgreSQL one round trip, one commit and one flush of the log. How a batch is committed is the
backend's (``commit_batch``): it hands each job its result or its error, and a job that fails
leaves no trace while the others in its batch commit as if it had not been there.

A process whose other threads run at a lower priority than the process that answers requests
(the delivering process and its helpers, ``MAILSVC_DELIVERY_NICE``) has every job committed by
the writer thread instead (:meth:`Writer.commit_on_its_own_thread`), started before the others
are lowered: a low-priority thread that held the write lock would hold it for as long as the
scheduler let the machine's other work go first (a job of 1 ms of CPU held it 4 ms, and
20 ms at the worst, while requests waited for it).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .contract import Writes

Result = TypeVar("Result")

#: Jobs in one transaction at most; enough to amortise the fsync, few enough to keep it short.
MAX_BATCH = 64


class Job(Generic[Result]):
    """A caller's work for a transaction, and, once done, its result or its error."""

    __slots__ = ("work", "durable", "_pending", "result", "error", "queued_at")

    def __init__(self, work: Callable[[Writes], Result], durable: bool) -> None:
        self.work = work
        self.durable = durable
        self.queued_at = time.perf_counter()
        #: Held until the job is done; its caller waits by taking it (a lock, not an Event: an
        #: Event is a Condition written in Python, and every write makes one).
        self._pending = threading.Lock()
        self._pending.acquire()
        self.result: Result | None = None
        self.error: BaseException | None = None

    def wait(self) -> None:
        """Until the job is done, by whichever thread committed it."""
        self._pending.acquire()

    def done(self) -> None:
        self._pending.release()


class Writer:
    """The writer of one process: who commits, and the queue of what waits. Its thread starts
    when first handed a queue, in the process that uses it (never carried across ``fork()``).

    :param commit_batch: commits the jobs in one transaction, handing each its ``result`` or
        its ``error``; a job's error is the job's alone (the others commit), an error of the
        commit is every job's.
    :param close: closes the write connection, if the backend keeps one (the next transaction
        opens it again).
    """

    def __init__(
        self,
        commit_batch: Callable[[list[Job[Any]]], None],
        close: Callable[[], None] = lambda: None,
    ) -> None:
        self._commit_batch = commit_batch
        self._close = close
        self._lock = threading.Lock()
        self._handed_over = threading.Condition(self._lock)
        self._queue: deque[Job[object]] = deque()
        #: A transaction is under way, a caller's or the thread's (the thread's from when it
        #: is handed the queue until the queue is empty).
        self._busy = False
        #: The thread is to commit what waits.
        self._handed = False
        #: The thread runs (in :attr:`_pid`), and is to end once idle.
        self._running = False
        self._ending = False
        #: The write connection is to be closed when the transaction under way is done.
        self._closing = False
        #: Every job is handed to the thread, none run on its caller's.
        self._always_handed = False
        self._pid: int | None = None

    def run(self, work: Callable[[Writes], Result], durable: bool = True) -> Result:
        """Run ``work(tx)`` in the writer's next transaction; its result, or its exception.

        :param durable: the result is returned only once the commit is on disk. A batch is
            durable when any of its jobs asks for it.
        """
        job: Job[Result] = Job(work, durable)
        with self._lock:
            self._this_process()
            at_once = not self._busy and not self._always_handed
            if at_once:
                self._busy = True
            else:
                self._queue.append(job)  # type: ignore[arg-type]
                if not self._busy:
                    self._busy = True
                    self._hand_over()
        if at_once:
            try:
                self._commit([job])  # type: ignore[list-item]
            finally:
                self._done()
        else:
            job.wait()
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]

    def commit_on_its_own_thread(self) -> None:
        """From now on, in this process, commit every job on the writer thread, started now
        by the caller: it runs at the caller's priority, whatever the threads that hand it
        jobs run at (on Linux a thread's nice value is its own, and a thread starts with its
        creator's)."""
        with self._lock:
            self._this_process()
            self._always_handed = True
            if not self._running:
                self._start_thread()

    def stop(self) -> None:
        """End the writer thread once what waits is committed, and close the write connection
        once the transaction under way is done; the next :meth:`run` opens it again."""
        with self._lock:
            self._this_process()
            if self._running:
                self._ending = True
                self._handed_over.notify()
            if self._busy:
                self._closing = True  # (whoever ends the transaction under way closes it)
                return
            self._busy = True
        try:
            self._close()
        finally:
            self._done()

    def _done(self) -> None:
        """The transaction under way, or the close, is done: the thread is handed what queued
        meanwhile, if anything did."""
        with self._lock:
            if self._queue:
                self._hand_over()
            else:
                self._idle()

    def queued(self) -> int:
        """Jobs waiting for a transaction (not the one being committed)."""
        with self._lock:
            return len(self._queue)

    def _this_process(self) -> None:
        """A child of ``fork()`` starts with no queue, no transaction under way and no thread:
        those were its parent's (called holding the lock)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._queue = deque()
            self._busy = self._handed = self._running = self._ending = self._closing = False
            self._always_handed = False  # (the thread that would commit was the parent's)

    def _hand_over(self) -> None:
        """Hand the queue to the thread, started if need be (called holding the lock)."""
        self._handed, self._ending = True, False
        if self._running:
            self._handed_over.notify()
            return
        self._start_thread()

    def _start_thread(self) -> None:
        """Start the thread that commits what it is handed (called holding the lock)."""
        self._running = True
        threading.Thread(target=self._loop, name="mailsvc-writer", daemon=True).start()

    def _idle(self) -> None:
        """The transaction under way is done and nothing waits (called holding the lock)."""
        if self._closing:
            self._closing = False
            self._close()
        self._busy = False

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._handed and not self._ending:
                    self._handed_over.wait()
                if not self._handed:  # ending, and idle
                    self._running = self._ending = False
                    return
                self._handed = False
            while True:
                with self._lock:
                    if not self._queue:
                        self._idle()
                        break
                    jobs = [self._queue.popleft() for _ in range(min(MAX_BATCH, len(self._queue)))]
                self._commit(jobs)

    def _commit(self, jobs: list[Job[object]]) -> None:
        try:
            self._commit_batch(jobs)
        except BaseException as exc:  # (a committer hands each job its outcome; in case not)
            for job in jobs:
                job.error = job.error or exc
        finally:
            for job in jobs:
                job.done()
