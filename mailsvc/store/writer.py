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
    """The writer of one process: who commits, and the queue of what waits. Its threads start
    when first handed the queue, in the process that uses it (never carried across ``fork()``).

    :param commit_batch: commits the jobs in one transaction, handing each its ``result`` or
        its ``error``; a job's error is the job's alone (the others commit), an error of the
        commit is every job's.
    :param close: closes the write connection, if the backend keeps one (the next transaction
        opens it again).
    :param lanes: transactions under way at once, at most: 1 where the backend has one write
        connection (SQLite); a caller that finds a lane free runs its job at once, and jobs
        queue only while every lane is taken.
    """

    def __init__(
        self,
        commit_batch: Callable[[list[Job[Any]]], None],
        close: Callable[[], None] = lambda: None,
        lanes: int = 1,
    ) -> None:
        self._commit_batch = commit_batch
        self._close = close
        self._lanes = lanes
        self._lock = threading.Lock()
        self._handed_over = threading.Condition(self._lock)
        self._queue: deque[Job[object]] = deque()
        #: Lanes taken: a caller's transaction under way, or a thread's from when it is handed
        #: the queue until the queue is empty.
        self._under_way = 0
        #: Lanes handed to the threads and not yet taken up by one.
        self._handed = 0
        #: Threads running (in :attr:`_pid`), those waiting to be handed a lane, and whether
        #: they are to end once idle.
        self._threads = 0
        self._waiting = 0
        self._ending = False
        #: The write connection is to be closed when no transaction is under way.
        self._closing = False
        #: Every job is handed to the threads, none run on its caller's.
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
            free = self._under_way < self._lanes
            at_once = free and not self._always_handed
            if free:
                self._under_way += 1
            if not at_once:
                self._queue.append(job)  # type: ignore[arg-type]
                if free:
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
        """From now on, in this process, commit every job on the writer's threads, the first
        started now by the caller: it runs at the caller's priority, whatever the threads that
        hand it jobs run at (on Linux a thread's nice value is its own, and a thread starts
        with its creator's)."""
        with self._lock:
            self._this_process()
            self._always_handed = True
            if not self._threads:
                self._start_thread()

    def stop(self) -> None:
        """End the writer's threads once what waits is committed, and close the write
        connection once no transaction is under way; the next :meth:`run` opens it again."""
        with self._lock:
            self._this_process()
            if self._threads:
                self._ending = True
                self._handed_over.notify_all()
            if self._under_way:
                self._closing = True  # (whoever ends the last transaction under way closes it)
                return
            self._under_way += 1
        try:
            self._close()
        finally:
            self._done()

    def _done(self) -> None:
        """A transaction, or the close, is done: its lane goes to a thread, for what queued
        meanwhile, if anything did."""
        with self._lock:
            if self._queue:
                self._hand_over()
            else:
                self._idle()

    def queued(self) -> int:
        """Jobs waiting for a transaction (not those being committed)."""
        with self._lock:
            return len(self._queue)

    def _this_process(self) -> None:
        """A child of ``fork()`` starts with no queue, no transaction under way and no thread:
        those were its parent's (called holding the lock)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._queue = deque()
            self._under_way = self._handed = self._threads = self._waiting = 0
            self._ending = self._closing = False
            self._always_handed = False  # (the threads that would commit were the parent's)

    def _hand_over(self) -> None:
        """Hand a lane, with the queue, to a thread: one that waits, or a new one (called
        holding the lock)."""
        self._handed += 1
        self._ending = False
        if self._waiting >= self._handed:
            self._handed_over.notify()
        else:
            self._start_thread()

    def _start_thread(self) -> None:
        """Start a thread that commits what it is handed (called holding the lock)."""
        self._threads += 1
        threading.Thread(target=self._loop, name="mailsvc-writer", daemon=True).start()

    def _idle(self) -> None:
        """A lane's transaction is done and nothing waits (called holding the lock)."""
        self._under_way -= 1
        if self._closing and not self._under_way:
            self._closing = False
            self._close()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._handed and not self._ending:
                    self._waiting += 1
                    self._handed_over.wait()
                    self._waiting -= 1
                if not self._handed:  # ending, and idle
                    self._threads -= 1
                    if not self._threads:
                        self._ending = False
                    return
                self._handed -= 1
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
