"""Prometheus metrics: what each process counts, and what the store says when scraped.

Counters and histograms are ``prometheus_client``'s, in its multiprocess mode under gunicorn
(``PROMETHEUS_MULTIPROC_DIR``, which ``gunicorn.conf.py`` sets before anything imports this), so a
scrape that one worker answers counts every worker. The queue's depth by status and the age of
its oldest due email are read from the store at each scrape (the store is shared; a gauge kept in
a process would be one process's view).
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

# A folder named for a process beside gunicorn (``mailsvc submission``) may not exist yet:
# prometheus_client opens its files there as the metrics below are made.
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)

from prometheus_client import (  # noqa: E402
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

if TYPE_CHECKING:
    from ..store import Store

REQUESTS = Counter(
    "mailsvc_http_requests",
    "HTTP requests answered, by route and status",
    ["method", "route", "status"],
)
LATENCY = Histogram(
    "mailsvc_http_request_duration_seconds",
    "Time to answer a request, by route",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
ACCEPTED = Counter("mailsvc_emails_accepted", "Emails accepted (each email of a batch counts)")
ATTEMPTS = Counter(
    "mailsvc_delivery_attempts",
    "Delivery attempts, by the status they left the email in",
    ["outcome"],
)
WEBHOOKS = Counter(
    "mailsvc_webhook_deliveries",
    "Webhook requests, by outcome: succeeded, retried (failed, tried again later) or failed",
    ["outcome"],
)
LARGE_BODIES = Gauge(
    "mailsvc_large_bodies_in_progress",
    "Requests with a large body (over MAILSVC_MAX_BODY_BYTES, or chunked) being worked on now, "
    "in every worker",
    multiprocess_mode="livesum",
)
RENDERS = Gauge(
    "mailsvc_template_renders_in_progress",
    "Template renders running now, in every worker",
    multiprocess_mode="livesum",
)


def forget_the_dead(folder: str, kinds: tuple[str, ...] = ("",)) -> None:
    """Remove the files of the multiprocess ``folder`` (those whose names begin with one of
    ``kinds``) that belong to processes that are gone: each file's name ends in its pid. A file
    not named so is not this module's, and is removed too when every kind is asked for."""
    for entry in os.listdir(folder):
        if not entry.startswith(kinds):
            continue
        pid = entry.rsplit("_", 1)[-1].removesuffix(".db")
        if pid.isdigit() and _alive(int(pid)):
            continue
        if pid.isdigit() or kinds == ("",):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, entry))


def _begun(folder: str) -> list[str]:
    """The multiprocess ``folder``'s files that their processes have begun to write. A process
    that starts creates its file empty and sizes it a moment later; prometheus_client's merge
    fails on a file read in between (``struct.error``: a 500 of ``/metrics`` while a worker or a
    submission process starts). A file removed meanwhile (a gone process's) is left out too."""
    begun = []
    for path in glob.glob(os.path.join(folder, "*.db")):
        with contextlib.suppress(OSError):
            if os.path.getsize(path) > 0:
                begun.append(path)
    return begun


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's process: alive)
        return True
    return True


SUBMISSION_CONNECTIONS = Gauge(
    "mailsvc_submission_connections",
    "SMTP submission connections open now, in every submission process",
    multiprocess_mode="livesum",
)
SUBMISSION_AUTH = Counter(
    "mailsvc_submission_auth",
    "SMTP AUTH attempts, by outcome: accepted or refused",
    ["outcome"],
)
SUBMISSION_MESSAGES = Counter(
    "mailsvc_submission_messages",
    "Messages (mail transactions) over SMTP submission, by outcome: accepted, deferred (4xx) "
    "or refused (5xx)",
    ["outcome"],
)
SUBMISSION_DURATION = Histogram(
    "mailsvc_submission_take_seconds",
    "Time from a message's end of data to its reply (read, checked and stored)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
WRITE_WAIT = Histogram(
    "mailsvc_store_write_wait_seconds",
    "Time a write waited for the store's write lock (SQLite: its writer and the file lock; "
    "PostgreSQL: a connection of the pool)",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0),
)
WRITE_HELD = Histogram(
    "mailsvc_store_write_held_seconds",
    "Time a write transaction held what the store's other writes wait for (SQLite: the "
    "database's write lock, from BEGIN until it is let go; PostgreSQL: its pooled connection, "
    "from the job's start until its COMMIT is answered)",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0),
)
WRITE_BATCH = Histogram(
    "mailsvc_store_write_batch_jobs",
    "Jobs committed in one transaction (SQLite's writer commits many at once)",
    buckets=(1, 2, 4, 8, 16, 32, 64),
)


ROW_WAITS = Counter(
    "mailsvc_store_row_waits",
    "Writes done again alone because their shared write transaction waited too long for a row "
    "another transaction held (PostgreSQL)",
)


def observe_row_wait(jobs: int) -> None:
    """Jobs of a write transaction done again alone: it waited too long for a row."""
    ROW_WAITS.inc(jobs)


def observe_commit(waits: Sequence[float], held: float) -> None:
    """A write transaction committed: how long each of its jobs waited for it, and how long it
    held what other writes wait for."""
    for wait in waits:
        WRITE_WAIT.observe(wait)
    WRITE_HELD.observe(held)
    WRITE_BATCH.observe(len(waits))


class _Scrape:
    """What one scrape reports: the counters (of every process) and the store's gauges."""

    def __init__(self, store: Store, now: float) -> None:
        self.store = store
        self.now = now

    def collect(self) -> Iterator[Metric]:
        folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if folder:
            yield from MultiProcessCollector.merge(_begun(folder), accumulate=True)
        else:
            yield from REGISTRY.collect()
        depth, oldest_due = self.store.reads.queue_depth(self.now)
        queue = GaugeMetricFamily(
            "mailsvc_queue_emails", "Emails not yet final, by status", labels=["status"]
        )
        for status in ("scheduled", "queued", "sending", "deferred"):
            queue.add_metric([status], depth.get(status, 0))
        yield queue
        yield GaugeMetricFamily(
            "mailsvc_queue_oldest_due_age_seconds",
            "How long the oldest email that is due (queued or deferred) has waited",
            value=max(0.0, self.now - oldest_due) if oldest_due is not None else 0.0,
        )


def exposition(store: Store, now: float) -> tuple[bytes, str]:
    """The text a scrape gets, and its content type."""
    return generate_latest(_Scrape(store, now)), CONTENT_TYPE_LATEST  # type: ignore[arg-type]
