"""What one render may spend, and the render running in this thread (no Jinja2 here: importing
this costs nothing, so a worker that never renders a template never loads Jinja2)."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

#: A render gives up the GIL after this much of its own CPU time, for its first
#: HEAVY_AFTER_SECONDS; after that, every HEAVY_YIELD_EVERY_SECONDS. Yielding every 1 ms
#: throughout, another account's accept p99 went from 11 to 76 ms beside a template burning its
#: CPU limit in a loop (the bench's noisy case); every 0.1 ms, it stayed within 2x of quiet. A
#: yield costs about 70 us of wall time (the timer slack of ``sleep(0)``), so the usual template
#: (1 to 5 ms) yields every 1 ms and only a heavy one pays for yielding often. A heavy render
#: also sleeps as long as it ran (``sleep(0)`` lets a waiting thread have the GIL only if the
#: operating system wakes it before the render takes it back): with four clients rendering at
#: their limit, another account's p99 went from 3.6 to 2.2 times quiet (``tests.bench.hostile``,
#: burner, held); such a render takes twice its CPU time in wall time.
YIELD_EVERY_SECONDS = 0.001
HEAVY_AFTER_SECONDS = 0.005
HEAVY_YIELD_EVERY_SECONDS = 0.0001


#: Items of a list or mapping that a template may build or be given, and that a filter which
#: sorts, groups or goes through them one by one may take: sorting 1,000 texts case-blind (a
#: key computed in Python for each, between two checks of the deadline) takes about 3 ms; at
#: 10,000, 30 ms, in which no other thread of the worker gets the interpreter.
MAX_ITEMS = 1_000


class _FullCollections(threading.local):
    """The CPU time this thread has spent in full garbage collections (generation 2)."""

    spent = 0.0
    started: float | None = None


_FULL_COLLECTIONS = _FullCollections()


def _count_full_collection(phase: str, info: dict[str, Any]) -> None:
    if info["generation"] != 2:
        return
    if phase == "start":
        _FULL_COLLECTIONS.started = time.thread_time()
    elif _FULL_COLLECTIONS.started is not None:
        _FULL_COLLECTIONS.spent += time.thread_time() - _FULL_COLLECTIONS.started
        _FULL_COLLECTIONS.started = None


gc.callbacks.append(_count_full_collection)


def cpu_now() -> float:
    """This thread's CPU time (``time.thread_time``) less what it spent in full garbage
    collections. A full collection walks the whole process's heap, whichever thread happens to
    allocate when it is due: it costs what the worker holds (100 ms and more in a large one),
    not what the render did, so it is neither a render's CPU nor its account's. The young
    generations, which a render's own allocations fill, count."""
    return time.thread_time() - _FULL_COLLECTIONS.spent


class RenderLimit(Exception):
    """A render went over one of its limits; the message names it."""


class AccountCpuSpent(Exception):
    """A render used what was left of its account's template CPU time (a 429, not the
    template's fault: :mod:`mailsvc.limits.template_cpu`)."""


@dataclass
class Budget:
    """What one render may still spend: CPU time (a :func:`cpu_now` deadline) and text."""

    cpu_deadline: float
    cpu_limit_ms: int
    chars_left: int
    chars_limit: int
    next_yield: float = 0.0
    #: The deadline is what the account had left, sooner than the render's own limit.
    account_bound: bool = False
    #: When the render began (:func:`cpu_now`).
    started: float = 0.0
    #: The longest text one step may make (the output limit: a longer one cannot be printed).
    max_text: int = 1_000_000

    def tick(self) -> None:
        now = cpu_now()
        if now > self.cpu_deadline:
            if self.account_bound:
                raise AccountCpuSpent()
            raise RenderLimit(
                f"the template used more than {self.cpu_limit_ms} ms of CPU "
                f"(MAILSVC_TEMPLATE_RENDER_CPU_MS)"
            )
        if now > self.next_yield:
            # Let the process's other threads have the GIL: each of their SQLite calls gives it
            # up and must get it back, and would otherwise wait for the switch interval (5 ms)
            # every time, so one busy render would slow every other request of its worker (and
            # its writer, which holds the store's write lock while it waits).
            spent = now - self.started
            heavy = spent > HEAVY_AFTER_SECONDS
            self.next_yield = now + (HEAVY_YIELD_EVERY_SECONDS if heavy else YIELD_EVERY_SECONDS)
            time.sleep(2 * HEAVY_YIELD_EVERY_SECONDS if heavy else 0)

    def charge(self, size: int) -> None:
        self.chars_left -= size
        if self.chars_left < 0:
            raise RenderLimit(
                f"the template made more than {self.chars_limit} characters of text while "
                f"rendering (8 times MAILSVC_TEMPLATE_MAX_OUTPUT_CHARS)"
            )

    def afford(self, size: int) -> None:
        """Refuse, before doing it, a step that would make a text (or list) of ``size``
        characters."""
        if size > self.max_text:
            raise RenderLimit(f"the template made a text of more than {self.max_text} characters")
        if size > self.chars_left:
            self.charge(size)


_BUDGET: ContextVar[Budget | None] = ContextVar("mailsvc_render_budget", default=None)


def budget() -> Budget:
    """The budget of the render running in this thread.

    :raises RenderLimit: none is running: the template is being compiled, and nothing of it
        may be evaluated then (Jinja then leaves the expression to run time).
    """
    current = _BUDGET.get()
    if current is None:
        raise RenderLimit("not evaluated at compile time")
    return current


def run_with(limits: Budget, work: Callable[[], Any]) -> Any:
    token = _BUDGET.set(limits)
    try:
        return work()
    finally:
        _BUDGET.reset(token)
