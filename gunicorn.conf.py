"""gunicorn settings for mailsvc: ``gunicorn -c gunicorn.conf.py``.

``-b`` and ``-w`` on the command line override what is set here, as gunicorn always allows.
The master checks the settings, opens the store (migrating it) and imports the app before it
forks (the workers share what it loaded); a setting that cannot work is one line on stderr and a
non-zero exit, an unknown ``MAILSVC_*`` variable a warning. Delivery runs in a process of its
own that the master starts once it is ready (``MAILSVC_DELIVERY_PROCESS``; see
mailsvc/delivery/process.py) and stops, gracefully, as it exits; with the setting off, delivery
threads start in each worker after fork and stop when the worker exits. Metrics of every
process are counted together (prometheus_client's multiprocess mode).
"""

import ctypes
import gc
import os
import shutil
import tempfile
from multiprocessing.sharedctypes import RawValue

# prometheus_client reads this when it is first imported, so before anything of mailsvc's; a
# folder of our own unless the operator names one, emptied at every start.
_MADE_METRICS_FOLDER = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
_METRICS_FOLDER = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(
    prefix="mailsvc-metrics-"
)
os.environ["PROMETHEUS_MULTIPROC_DIR"] = _METRICS_FOLDER
os.makedirs(_METRICS_FOLDER, exist_ok=True)

import gunicorn.util  # noqa: E402

from mailsvc.delivery import process as delivery_process  # noqa: E402
from mailsvc.errors import raw_error_response  # noqa: E402
from mailsvc.ops import cores, logs, metrics  # noqa: E402
from mailsvc.ops.startup import check_or_exit, fail, warn  # noqa: E402
from mailsvc.settings import SettingsError, load_settings, unknown_variables  # noqa: E402

try:
    _settings = load_settings()
except SettingsError as exc:
    fail(str(exc))
for _warning in unknown_variables():
    warn(_warning)
logs.configure(_settings.log_format)
# gunicorn's own lines in the same format (with MAILSVC_LOG_FORMAT=json, every line is JSON);
# mailsvc writes the access line (mailsvc.access), gunicorn none.
logconfig_dict = logs.gunicorn_logging(_settings.log_format)
logger_class = "mailsvc.ops.gunicorn_log.Logger"
# The store is checked (and migrated) here, before gunicorn imports the app (preload_app).
check_or_exit(_settings)


def _write_error(sock, status_int, reason, mesg):
    # What gunicorn refuses itself, before the app sees the request (a request line over 4094
    # bytes, headers too large, a malformed request), is answered in the service's error
    # format too, not as gunicorn's HTML page. gunicorn's workers call util.write_error.
    gunicorn.util.write_nonblock(sock, raw_error_response(status_int, reason, mesg))


gunicorn.util.write_error = _write_error

wsgi_app = "mailsvc.wsgi:app"
bind = _settings.bind
workers = _settings.workers
worker_class = "gthread"
threads = _settings.threads
# gunicorn's control socket has one default path for every instance on the machine; mailsvc
# does not use gunicornc, and several servers (tests, side-by-side benchmarks) must not collide.
control_socket_disable = True
# Time a stopping worker has to finish its requests and the SMTP transactions in flight.
graceful_timeout = 30
# The app is imported once, in the master, before the workers fork, so the code and objects it
# loads are shared by every worker (copy-on-write) instead of loaded again in each. Building it
# opens nothing (no database connection, no thread), so nothing crosses the fork.
preload_app = True


def on_starting(server):
    # Counts of an earlier run are not this one's; but the folder may be shared with a
    # `mailsvc submission` process beside gunicorn (its counts are in /metrics too): only the
    # files of processes that are gone are removed.
    metrics.forget_the_dead(_METRICS_FOLDER)


#: glibc's ``mallopt`` option that caps its malloc arenas.
_M_ARENA_MAX = -8


#: The cores the workers may be pinned to: the master's own (MAILSVC_PIN_CORES; see
#: mailsvc/ops/cores.py). The process that delivers is forked by the master too, and keeps them all.
_CORES = cores.usable() if _settings.pin_cores else []


def pre_fork(server, worker):
    # What the master has loaded lives as long as it does: out of the garbage collector's sight,
    # so that a worker's collections do not write to the pages it shares (and copy them).
    gc.freeze()
    # Each worker on the core fewest of the running ones are on (a worker that died leaves its
    # core to the one that replaces it), in turn from an offset of the master's own, so that
    # several servers on one machine do not all begin on the first core.
    taken = [getattr(other, "mailsvc_core", None) for other in server.WORKERS.values()]
    worker.mailsvc_core = cores.next_core(_CORES, taken, start=os.getpid())


def post_fork(server, worker):
    cores.pin(worker.mailsvc_core)  # (before the worker starts a thread: every one of them)
    # glibc gives each thread that meets contention a malloc arena of its own (up to 8 per
    # core), each keeping freed memory; a worker's threads share two, unless the operator set
    # MALLOC_ARENA_MAX. Set before the worker starts its threads.
    if "MALLOC_ARENA_MAX" not in os.environ:
        mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # None: not glibc
        if mallopt is not None:
            mallopt(_M_ARENA_MAX, 2)


#: The pid of the process that delivers, which its supervisor writes and the workers read (in
#: memory the master shares with every process it forks), and the supervisor's.
_DELIVERING = RawValue(ctypes.c_int, 0)
_supervisor = 0


def when_ready(server):
    global _supervisor
    if _settings.delivery_process:
        from mailsvc.app import MailService

        _supervisor = delivery_process.start_supervisor(
            lambda: MailService(_settings),
            lambda pid: setattr(_DELIVERING, "value", pid),
            delivery_process.delivery_nice(_settings),
            delivery_process.delivery_helpers(_settings),
        )


def post_worker_init(worker):
    # Another app (the benchmark's no-op floor) may run under this same configuration.
    start = getattr(worker.wsgi, "start", None)
    if start is None:
        return
    if _settings.delivery_process:
        worker.wsgi.deliver_elsewhere(lambda: delivery_process.running(_DELIVERING.value))
    else:
        start()


def worker_exit(server, worker):
    stop = getattr(getattr(worker, "wsgi", None), "stop", None)
    if stop is not None:
        stop(graceful=True, timeout=server.cfg.graceful_timeout - 1)


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    if _supervisor:  # (after the workers: what they accepted last is announced)
        delivery_process.stop_supervisor(_supervisor, graceful_timeout)
    if _MADE_METRICS_FOLDER:
        shutil.rmtree(_METRICS_FOLDER, ignore_errors=True)
