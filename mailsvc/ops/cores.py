"""The CPU core each serving process runs on (``MAILSVC_PIN_CORES``).

A gunicorn worker, and a process of ``mailsvc submission`` that takes messages, runs Python on
one thread at a time (the interpreter lock), and its threads take turns all the time: a request
thread waits for the store's commit, the writer wakes it, the event loop hands a message to a
thread and is woken by it. Left to the kernel, each of those wake-ups may land on another core:
the woken thread starts with cold caches, and the wake-up itself costs an interrupt between
cores (on a virtual machine, a trip through the hypervisor). Pinned to one core each, taken in
turn from the cores the server may use, a process keeps its threads together, and loses nothing
it could have run at once. The process that delivers, and everything else on the machine, is
left to the kernel, which moves it to whichever core is free.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterable, Sequence


def usable() -> list[int]:
    """The cores this process may run on (its affinity, as ``taskset`` or a cgroup's cpuset set
    it), in order; empty where the system cannot say."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (not Linux)
        return []


def next_core(cores: Sequence[int], taken: Iterable[int | None], start: int = 0) -> int | None:
    """The core for one more serving process: the one that the fewest of ``taken`` (the cores of
    the others that run) run on, the first such in turn from the ``start``-th (an offset, so
    that two servers on one machine do not both begin on the first core). None when there is
    at most one core to choose from: nothing to pin.
    """
    if len(cores) < 2:
        return None
    counts = Counter(core for core in taken if core is not None)
    first = start % len(cores)
    in_turn = [*cores[first:], *cores[:first]]
    return min(in_turn, key=lambda core: counts[core])


def pin(core: int | None) -> None:
    """Run the calling thread, and every thread it starts from now on, on ``core`` (called in a
    new process before it starts a thread: the whole process, then)."""
    if core is not None:
        with contextlib.suppress(OSError):  # (a core taken away since it was counted)
            os.sched_setaffinity(0, {core})
