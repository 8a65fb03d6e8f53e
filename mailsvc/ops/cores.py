"""The CPU core each serving process runs on (``MAILSVC_PIN_CORES``).

A gunicorn worker, and a process of ``mailsvc submission`` that takes messages, runs Python on
one thread at a time (the interpreter lock), and its threads take turns all the time: a request
thread waits for the store's commit, the writer wakes it, the event loop hands a message to a
thread and is woken by it. Left to the kernel, each of those wake-ups may land on another core:
the woken thread starts with cold caches, and a wake-up across cores costs more (on a virtual
machine, it goes through the hypervisor). Pinned to one core each, taken in turn from the cores
the server may use (one hyperthread of each physical core first), a process keeps its threads
together, and loses little it could have run at once. The process that delivers, and
everything else on the machine, is left to the kernel, which moves it to whichever core is
free. docs/performance.md has the measurements.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path


def usable() -> list[int]:
    """The cores this process may run on (its affinity, as ``taskset`` or a cgroup's cpuset set
    it), in the order of :func:`spread`; empty where the system cannot say."""
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # (not Linux)
        return []
    return spread(cpus, {cpu: _sibling_rank(cpu) for cpu in cpus})


def spread(cpus: Iterable[int], rank: Mapping[int, int]) -> list[int]:
    """The logical CPUs in the order processes are pinned to them: one of each physical core
    first (two hyperthreads of a core share its caches and its units), then their siblings. A
    CPU's ``rank`` is its place among its core's hyperthreads (0: the first)."""
    return sorted(cpus, key=lambda cpu: (rank.get(cpu, 0), cpu))


def _sibling_rank(cpu: int) -> int:
    """The CPU's place among the hyperthreads of its physical core, as the kernel lists them
    (0 where it does not say)."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text()
    except OSError:
        return 0
    siblings = sorted(cpu_list(text))
    return siblings.index(cpu) if cpu in siblings else 0


def cpu_list(text: str) -> set[int]:
    """The CPUs of a list as the kernel writes one (``0-3,8,10-11``); what cannot be read of it,
    none."""
    found: set[int] = set()
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            found.update(range(int(first), int(last or first) + 1))
    return found


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
