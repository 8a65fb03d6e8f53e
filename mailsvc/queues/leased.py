"""Work that several processes and hosts share through the store, leased a piece at a time: the
lifecycle that mail delivery and webhook delivery have in common.

One claimer thread leases due work, as many pieces at a time as there are idle workers, in one
job of the store's writer, and hands them over; each worker thread does one piece and records
its outcome (if the process still holds the lease), in a job that may lease the worker its next
run of pieces, which it does one after the other and records together. A wake from this
process starts a claim at once (a condition); the claimer also looks every ``poll_seconds``
for work other processes made or left behind, and sooner when it knows that something falls
due before then. While work comes a piece at a time (the last claim found some, but fewer than
it wanted), a claim for news waits until ``gather_seconds`` after that one began, and what
came meanwhile goes to one worker as a run (or, when a piece takes long, to several, as
:meth:`LeasedPool.gathered_run` says): one claim and one record for the run, where each piece
had one of each (work after a quiet spell that long is claimed at once). A keeper thread
renews the leases the process holds every third of a lease, so slow work is never taken over,
and done twice, by another process; an outcome that meets a store outage is written once the
store is back, not dropped. On a graceful stop, claiming stops, the work in hand is finished
(within the timeout), and what was claimed but not started is given back.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from functools import partial
from typing import Any, Generic, TypeVar

from ..ids import new_id
from ..store import Store, StoreOutage, Writes

log = logging.getLogger("mailsvc.delivery")

#: What a thread that is not a worker holds while it records (nothing).
_NOT_A_WORKER = nullcontext()

Item = TypeVar("Item")
Result = TypeVar("Result")
#: The longest a worker waits between two tries to record an outcome while the store is out.
RECORD_RETRY_MAX_SECONDS = 5.0


class LeasedPool(Generic[Item]):
    """Subclasses say how to claim, do, give back and renew a piece of work.

    :param name: names the threads (``mailsvc-<name>-claimer``, ...).
    :param threads: worker threads.
    :param lease_seconds: how long a claim lasts unless renewed.
    :param poll_seconds: the longest the claimer sleeps without news.
    :param gather_seconds: while work comes a piece at a time, the shortest time between two
        claims for news (0: none).
    :param gather_run: the most pieces such a claim takes (as one worker's run, or one run
        each of :meth:`gathered_run` pieces for several).
    """

    def __init__(
        self,
        store: Store,
        clock: Callable[[], float],
        name: str,
        threads: int,
        lease_seconds: float,
        poll_seconds: float,
        gather_seconds: float = 0.0,
        gather_run: int = 1,
    ) -> None:
        self.store = store
        self.clock = clock
        self.name = name
        self.threads = threads
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self.gather_seconds = gather_seconds
        self.gather_run = gather_run
        #: When the claimer's last claim that found work began (monotonic).
        self._last_claim = float("-inf")
        self.owner = ""
        self._threads: list[threading.Thread] = []
        self._helpers: list[threading.Thread] = []
        self._running = False
        self._wakeup = threading.Condition()
        self._signalled = False
        #: No claim before this (monotonic) time: what :meth:`admits` said when it held back.
        self._held_back_until = 0.0
        self._idle = 0
        #: The pieces this process holds leases on, each counted once for every run or batch
        #: that holds it. A piece a run gave back may be claimed again, for another thread of
        #: this process (same owner), before the run has let go of it: the count keeps it held
        #: (renewed, never given back as unknown) until that thread lets go too.
        self._held: Counter[int] = Counter()
        self._held_lock = threading.Lock()
        self._stopped = threading.Event()
        self._handoff: queue.SimpleQueue[list[Item] | None] = queue.SimpleQueue()
        #: When this pool last found the store working (its clock); while its writes meet an
        #: outage, that time; once it is over, leases that ran out since then are left alone
        #: until a monotonic time. Every write tells (claims, outcomes, renewals): a pool whose
        #: workers are all busy makes no claim, and would otherwise not know of an outage, and
        #: take at once, in an outcome's job, a lease that ran out in it while its holder
        #: waited to record the piece it had done.
        self._store_seen_at = 0.0
        self._outage_began: float | None = None
        self._outage_leases: tuple[float, float] | None = None
        self._outage_lock = threading.Lock()
        #: Set when the store answers again after an outage this pool saw: a claim of its own
        #: may have committed while its answer was lost (the server could not be asked), its
        #: leases known to nobody until they run out. The claimer, woken at once, gives back
        #: every lease of :attr:`owner` the pool does not hold, while no worker's outcome
        #: (whose job may claim the worker's next piece) is on its way.
        self._leases_in_doubt = False
        #: Each worker's own lock, held while its outcome's job is on its way; the claimer
        #: takes them all to give back. One a worker, so that workers never wait on each other
        #: (a shared lock taken for every outcome cost 5% of delivery's CPU on PostgreSQL).
        self._worker_locks: list[threading.Lock] = []
        self._this_worker = threading.local()
        #: Claims this pool has made (each a look at the store, whatever it found): what a
        #: caller waits on to know the pool has looked since some moment.
        self.claims = 0
        #: Every new piece, this process's or another's, is announced to this pool
        #: (:meth:`wake`): then a worker's outcome need not look for its next run while nothing
        #: was announced since a claim found fewer pieces than it wanted and nothing has fallen
        #: due since (mail that comes one at a time is claimed once an email, not twice). The
        #: claimer claims whatever is announced, as always.
        self.hears_all_news = False
        #: Wakes so far; after a claim that found fewer pieces than it wanted, the wakes before
        #: it began and when its next piece falls due (:attr:`clock`; None: nothing waits).
        self._news = 0
        self._quiet: tuple[int, float | None] | None = None

    # -- what a subclass says --------------------------------------------------------------

    def claim(self, tx: Writes, wanted: int) -> tuple[list[Item], float | None]:
        """Lease up to ``wanted`` pieces to :attr:`owner`; with fewer, when the next falls due."""
        raise NotImplementedError

    def admits(self, wanted: int) -> tuple[int, float]:
        """How many of ``wanted`` pieces may be claimed now (where the work goes may be known to
        be down), and when none, the monotonic time to ask again."""
        return wanted, 0.0

    def gathered_run(self) -> int:
        """The most pieces of a gathered claim one worker does as a run (see
        :attr:`gather_seconds`); the rest go to other idle workers, a run each."""
        return self.gather_run

    def keeps_claiming(self) -> bool:
        """Whether a worker's outcome may claim its next run (what :meth:`admits` said last,
        without asking again: the question is asked in a job of the store's writer)."""
        return True

    def unclaimed(self, count: int) -> None:
        """``count`` of the pieces :meth:`admits` let through were not there to claim."""

    def key(self, item: Item) -> int:
        """The piece's sequence number, by which its lease is renewed or given back."""
        raise NotImplementedError

    def do(self, run: list[Item], state: Any) -> list[Item]:
        """Do a run of pieces (one, as the claimer hands them, or those the job that recorded
        the worker's last run claimed) and record their outcomes; give back those of the run it
        did not start. ``state`` is the worker's own. Returns the worker's next run, claimed by
        the job that recorded this one (see :meth:`claim_next`; held as :meth:`record` with
        ``claims`` returned it), or none."""
        raise NotImplementedError

    def claim_next(self, tx: Writes, count: int = 1) -> list[Item]:
        """In the job that records a worker's outcomes: lease the worker its next run of up to
        ``count`` pieces, so that it goes on without waiting for the claimer (one transaction,
        not two, a run). Nothing while the pool is stopping, or when nothing is due; nor while
        work comes a piece at a time and the claimer is gathering it (``gather_seconds``
        since the last claim that gathered have not passed): what came since goes with what
        comes until then, as one run, where each worker would record a piece or two at a time,
        a durable commit each. Once they have passed, this claim is the gathering's."""
        if not self._running or self._nothing_new() or not self.keeps_claiming():
            return []
        gathering, began = self._gathers(), time.monotonic()
        if gathering and began < self._gather_until():
            return []
        news = self._news
        batch, next_due = self.claim(tx, wanted=count)
        self.claims += 1
        self._saw_queue(news, len(batch) < count, next_due)
        if gathering and batch:
            self._last_claim = began
        return batch

    def _saw_queue(self, news: int, short: bool, next_due: float | None) -> None:
        """A claim that began after ``news`` wakes found fewer pieces than it wanted, or not."""
        self._quiet = (news, next_due) if short else None

    def _nothing_new(self) -> bool:
        """Nothing can be due that the last claim did not see: no wake since it found the
        queue short, and nothing it knew of has fallen due (see :attr:`hears_all_news`)."""
        quiet = self._quiet
        if not self.hears_all_news or quiet is None or quiet[0] != self._news:
            return False
        return quiet[1] is None or self.clock() < quiet[1]

    def give_back(self, tx: Writes, keys: Sequence[int]) -> None:
        """Give back pieces leased but never started, due at once for anyone."""
        raise NotImplementedError

    def renew(self, tx: Writes, keys: Sequence[int], until: float) -> int:
        raise NotImplementedError

    def give_back_unknown(self, tx: Writes, held: set[int]) -> int:
        """Give back the pieces leased to :attr:`owner` but not in ``held``; how many."""
        raise NotImplementedError

    def open_worker(self) -> Any:
        """What one worker thread keeps between pieces (a connection); closed when it ends."""
        return None

    def close_worker(self, state: Any) -> None:
        pass

    def helpers(self) -> list[Callable[[threading.Event], None]]:
        """More threads to run while started, each given the run's stop event."""
        return []

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the threads; call after ``fork()``, in the process that will do the work."""
        if self._threads:
            return
        self._running = True
        self.owner = f"{socket.gethostname()}/{os.getpid()}/{new_id('lease')}"
        self._handoff = queue.SimpleQueue()
        self._idle = 0
        self._held_back_until = 0.0
        self._held = Counter()
        self._stopped = threading.Event()
        claimer = threading.Thread(
            target=self._claim_loop, name=f"mailsvc-{self.name}-claimer", daemon=True
        )
        workers = [
            threading.Thread(
                target=self._work_loop, name=f"mailsvc-{self.name}-{number}", daemon=True
            )
            for number in range(self.threads)
        ]
        self._threads = [claimer, *workers]
        self._helpers = [
            threading.Thread(
                target=helper,
                args=(self._stopped,),
                name=f"mailsvc-{self.name}-{helper.__name__.strip('_').removesuffix('_loop')}",
                daemon=True,
            )
            for helper in [self._keep_leases_loop, *self.helpers()]
        ]
        for thread in [*self._threads, *self._helpers]:
            thread.start()

    @property
    def alive(self) -> bool:
        """Started, and every thread still running."""
        return bool(self._threads) and all(t.is_alive() for t in [*self._threads, *self._helpers])

    def wake(self) -> None:
        """Tell the claimer that there is new work. (Once signalled, it needs no second wake: it
        is claiming, or waits for an idle worker, for claims to resume, or for the end of a
        gathering, each of which it would wait for anyway.)"""
        with self._wakeup:
            self._news += 1
            if not self._signalled:
                self._signalled = True
                self._wakeup.notify_all()

    def resume(self) -> None:
        """Claims held back by :meth:`admits` may resume at once (where the work goes is back)."""
        with self._wakeup:
            self._held_back_until = 0.0
            self._news += 1
            self._signalled = True
            self._wakeup.notify_all()

    def stop(self, graceful: bool = True, timeout: float | None = None) -> None:
        """Stop claiming. When graceful, wait (up to ``timeout``) for the work in hand; what
        was claimed but not started is given back at once."""
        if not self._threads:
            return
        self._running = False
        with self._wakeup:
            self._wakeup.notify_all()
        claimer, *workers = self._threads
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        # The claimer first, so that whatever it handed over stands before the workers' ends.
        claimer.join(left() if graceful else 0)
        for _ in workers:
            self._handoff.put(None)
        if graceful:
            for worker in workers:
                worker.join(left())
        self._stopped.set()
        for helper in self._helpers:
            helper.join(left() if graceful else 0)
        self._threads, self._helpers = [], []

    def leases_cutoff(self) -> float | None:
        """For a claim: leases that ran out at this time or later are not taken, for a lease
        after a store outage this process saw (those that ran out while the store was out,
        since their holders could not renew them; they renew them, or record the outcome,
        once it is back). None: every lease that ran out may be taken."""
        if self._outage_began is not None:  # the first claim since the outage began
            return self._outage_began
        window = self._outage_leases
        if window is None or time.monotonic() > window[1]:
            return None
        return window[0]

    def record(self, job: Callable[[Writes], Result], claims: bool = False) -> Result:
        """Write a piece's outcome, waiting out a store outage rather than dropping it (an
        outcome lost is work done again, mail sent twice, once the lease expires; the keeper
        renews the lease when the store is back). Raises the outage only once the pool has
        stopped. ``claims``: the job may lease the worker its next run (its result, a list),
        held from the moment the job is done."""
        wait = 0.1
        while True:
            try:
                with getattr(self._this_worker, "lock", _NOT_A_WORKER):
                    result = self.store.write(job)
                    if claims and result:
                        self._hold(result)  # type: ignore[arg-type]
                        self._this_worker.next_run = result
            except StoreOutage:
                self._store_out()
                if self._stopped.wait(wait):
                    raise
                wait = min(wait * 2, RECORD_RETRY_MAX_SECONDS)
            else:
                self._store_working()
                return result

    def _store_out(self) -> None:
        """A write of this pool met a store outage."""
        with self._outage_lock:
            if self._outage_began is None:
                self._outage_began = self._store_seen_at

    def _store_working(self) -> None:
        """A write of this pool went through: an outage it saw is over. The claimer is woken
        to give back the leases in doubt at once: while the queue is long, each worker's
        outcome claims its next piece, no worker is idle, and the claimer would not wake."""
        if self._outage_began is None:  # (as nearly always: no lock taken)
            self._store_seen_at = self.clock()
            return
        with self._outage_lock:
            began = self._outage_began
            if began is not None:
                ends = time.monotonic() + self.lease_seconds
                self._outage_leases = (began, ends)
                self._outage_began = None
                self._leases_in_doubt = True
            self._store_seen_at = self.clock()
        if began is not None:
            with self._wakeup:
                self._wakeup.notify_all()

    def _give_back_leases_in_doubt(self) -> None:
        """Give back the leases of :attr:`owner` this pool does not hold (see
        :attr:`_leases_in_doubt`); called by the claimer, which makes no claim meanwhile."""
        with self._held_lock:
            locks = list(self._worker_locks)
        for lock in locks:
            lock.acquire()
        try:
            with self._held_lock:
                held = set(self._held)
            # Tried once a time the store comes back: an outage meanwhile sets it again.
            self._leases_in_doubt = False
            given = self.store.write(lambda tx: self.give_back_unknown(tx, held))
            if given:
                log.warning(
                    "%s: gave back %d leases claimed as the store went out (their claim's "
                    "answer was lost)",
                    self.name,
                    given,
                )
        except StoreOutage:  # logged by the store, once
            self._store_out()
        except Exception:
            log.exception("%s: giving back leases in doubt failed", self.name)
        finally:
            for lock in locks:
                lock.release()

    # -- threads -----------------------------------------------------------------------------

    def _claim_loop(self) -> None:
        next_poll = time.monotonic()
        while True:
            if self._leases_in_doubt:  # whether or not a worker is idle (see _store_working)
                self._give_back_leases_in_doubt()
            with self._wakeup:
                while (
                    self._running and not self._leases_in_doubt and not self._claim_now(next_poll)
                ):
                    self._wakeup.wait(self._sleep(next_poll))
                if not self._running:
                    return
                if self._leases_in_doubt:
                    continue
                gathered = self._gathers()
                run_length = self.gathered_run() if gathered else 1
                wanted, self._held_back_until = self.admits(
                    min(self.gather_run, self._idle * run_length) if gathered else self._idle
                )
                if not wanted:
                    continue  # the signal, if any, stays for when claims may resume
                self._signalled = False
            next_due, news, began = None, self._news, time.monotonic()
            try:
                # A claim lost with the power only means it is made again: no fsync for it.
                batch, next_due = self.store.write(partial(self.claim, wanted=wanted), False)
            except StoreOutage:  # logged by the store, once
                self._store_out()
                batch = []
            except Exception:
                log.exception("%s: claiming failed; trying again at the next poll", self.name)
                batch = []
            else:
                self._store_working()
                self._saw_queue(news, len(batch) < wanted, next_due)
            self.claims += 1
            if len(batch) < wanted:
                self.unclaimed(wanted - len(batch))
            if batch and not self._running:
                self._give_back(batch)
                return
            self._hold(batch)
            if batch:
                self._last_claim = began
            runs = [batch[at : at + run_length] for at in range(0, len(batch), run_length)]
            with self._wakeup:
                self._idle -= len(runs)
                if len(batch) == wanted:
                    self._signalled = True  # more may be due: claim again as workers free up
                else:  # the next poll, or sooner if something falls due before then
                    wait = self.poll_seconds
                    if next_due is not None:
                        # (not under 50 ms: a due row another host's claim has locked is
                        # passed over until that claim commits)
                        wait = min(wait, max(0.05, next_due - self.clock()))
                    next_poll = time.monotonic() + wait
            for run in runs:
                self._handoff.put(run)

    def _claim_now(self, next_poll: float) -> bool:
        """Whether to claim: a worker is idle, claims are not held back, and there is news or
        the poll is due (called holding the wake-up condition)."""
        now = time.monotonic()
        return (
            self._idle > 0
            and now >= self._held_back_until
            and ((self._signalled and now >= self._gather_until()) or now >= next_poll)
        )

    def _gathers(self) -> bool:
        """Whether the claim about to be made gathers what came since the last: mail comes
        one piece at a time (the last claim found the queue short)."""
        return self.gather_seconds > 0 and self._quiet is not None

    def _gather_until(self) -> float:
        """No claim for news before this monotonic time: while mail comes one piece at a
        time, a claim waits until ``gather_seconds`` after the last that found some began, and
        takes what came meanwhile as one run."""
        return self._last_claim + self.gather_seconds if self._gathers() else 0.0

    def _sleep(self, next_poll: float) -> float | None:
        """How long the claimer may sleep unless woken: until a worker is idle, or until claims
        may resume and it is time to look."""
        if self._idle == 0:
            return None
        look = max(time.monotonic(), self._gather_until()) if self._signalled else next_poll
        return max(0.0, max(look, self._held_back_until) - time.monotonic())

    def _work_loop(self) -> None:
        state = self.open_worker()
        self._this_worker.lock = threading.Lock()
        with self._held_lock:
            self._worker_locks.append(self._this_worker.lock)
        try:
            while True:
                with self._wakeup:
                    self._idle += 1
                    if self._idle == 1:  # (the claimer waits for an idle worker only if none was)
                        self._wakeup.notify_all()
                run = self._handoff.get()
                if run is None:
                    return
                while run:  # and the runs its outcomes' jobs claimed after it
                    run = self._do_run(run, state)
        finally:
            with self._held_lock:
                self._worker_locks.remove(self._this_worker.lock)
            self.close_worker(state)

    def _do_run(self, run: list[Item], state: Any) -> list[Item]:
        following: list[Item] = []
        keys = [self.key(item) for item in run]
        #: What the job that records this run claims for this thread next (see :meth:`record`).
        self._this_worker.next_run = []
        try:
            if not self._running:
                self._give_back(run)
            else:
                following = self.do(run, state)
        except Exception as exc:
            if not isinstance(exc, StoreOutage):  # (logged by the store, once)
                log.exception(
                    "%s: %s failed; the lease will expire", self.name, ", ".join(map(str, keys))
                )
            self._forsake(self._this_worker.next_run)
        finally:
            self._let_go(keys)  # (what ``following`` holds, the job's claim took: see record)
        return following

    def _forsake(self, claimed: list[Item]) -> None:
        """A run failed after its job had claimed the thread's next run: given back, due at
        once for anyone (or, if the store cannot take that now, no longer renewed: their leases
        expire), not held by a thread that will never do them."""
        if not claimed:
            return
        self._let_go(self.key(item) for item in claimed)
        try:
            self._give_back(claimed)
        except Exception:
            log.exception("%s: giving back a failed run's next run failed", self.name)
        else:
            LeasedPool.wake(self)

    def _hold(self, items: Iterable[Item]) -> None:
        with self._held_lock:
            self._held.update(self.key(item) for item in items)

    def _let_go(self, keys: Iterable[int]) -> None:
        with self._held_lock:
            self._held -= Counter(keys)  # (a count that reaches 0 is dropped)

    def _keep_leases_loop(self, stopped: threading.Event) -> None:
        """Every third of a lease, extend the leases this process holds by a whole lease."""
        lease = self.lease_seconds
        while not stopped.wait(lease / 3):
            with self._held_lock:
                keys = sorted(self._held)
            if not keys:
                continue
            try:
                # A renewal lost with the power goes with the process that held the lease.
                self.store.write(partial(self._renew, keys=keys), False)
            except StoreOutage:  # logged by the store, once
                self._store_out()
            except Exception:
                log.exception("%s: renewing leases failed; again in %.0f s", self.name, lease / 3)
            else:
                self._store_working()

    def _renew(self, tx: Writes, keys: Sequence[int]) -> int:
        return self.renew(tx, keys, self.clock() + self.lease_seconds)

    def _give_back(self, items: Sequence[Item]) -> None:
        keys = [self.key(item) for item in items]
        self.store.write(lambda tx: self.give_back(tx, keys))
