"""Group commit: a write that finds none under way commits at once on its caller's thread; the
writes that come meanwhile are committed, many to a transaction, by the process's writer thread.

Request threads and delivery threads hand their work to the writer as a function of the
transaction. A caller that finds no transaction under way runs its job at once, on its own
thread, on the process's one write connection: no hand-off to another thread and back (each a
wake-up of a sleeping thread, about 0.1 ms of CPU on a virtual machine, and its wait for the
interpreter's lock). The callers that come while a transaction is under way queue and wait;
the writer thread, handed the queue, commits what waits in batches until nothing does, so under
load many jobs share one lock acquisition and one fsync, and only one thread in each process
competes for the database's write lock. The fsync comes once the lock is let go (the store's
``sync``), before the batch's callers are answered: other processes' writes do not wait for it.
Each job of a batch runs in a savepoint of its own: a job that raises leaves no trace, and the
others in its batch commit as if it had not been there.

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
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Generic, TypeVar

from ..verbs import SqlVerbs

Result = TypeVar("Result")

#: Jobs in one transaction at most; enough to amortise the fsync, few enough to keep it short.
MAX_BATCH = 64


class _Job(Generic[Result]):
    __slots__ = ("work", "durable", "_pending", "result", "error", "queued_at")

    def __init__(self, work: Callable[[SqlVerbs], Result], durable: bool) -> None:
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

    :param transaction: opens a write transaction on the process's write connection, under
        the database's write lock; committed when it ends, not yet on disk.
    :param sync: makes every transaction committed so far durable; called after a transaction
        with a durable job in it has let the write lock go, before its jobs return.
    :param close: closes that connection (the next transaction opens it again).
    :param observe: called, once a transaction has committed and let the file lock go, with
        how long each of its jobs waited for it and how long it held the lock.
    """

    def __init__(
        self,
        transaction: Callable[[], AbstractContextManager[SqlVerbs]],
        sync: Callable[[], None],
        close: Callable[[], None],
        observe: Callable[[Sequence[float], float], None] = lambda waits, held: None,
    ) -> None:
        self._transaction = transaction
        self._sync = sync
        self._close = close
        self._observe = observe
        self._lock = threading.Lock()
        self._handed_over = threading.Condition(self._lock)
        self._queue: deque[_Job[object]] = deque()
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

    def run(self, work: Callable[[SqlVerbs], Result], durable: bool = True) -> Result:
        """Run ``work(tx)`` in the writer's next transaction; its result, or its exception.

        :param durable: the result is returned only once the commit is on disk. A batch is
            durable when any of its jobs asks for it.
        """
        job: _Job[Result] = _Job(work, durable)
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

    def _commit(self, jobs: list[_Job[object]]) -> None:
        try:
            with self._transaction() as tx:
                began = time.perf_counter()
                # Each waited for the writer, then the file lock.
                waits = [began - job.queued_at for job in jobs]
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
            held = time.perf_counter() - began  # (from BEGIN until the lock was let go)
            if any(job.durable for job in jobs):
                self._sync()
        except BaseException as exc:  # the commit (or its sync) failed: no job's result stands
            for job in jobs:
                job.error = job.error or exc
        else:
            self._observe(waits, held)
        finally:
            for job in jobs:
                job.done()
