"""gunicorn settings for mailsvc: ``gunicorn -c gunicorn.conf.py``.

``-b`` and ``-w`` on the command line override what is set here, as gunicorn always allows.
The master checks the settings and opens the store (migrating it) before it forks; a setting
that cannot work is one line on stderr and a non-zero exit. Delivery threads start in each
worker after fork and stop, gracefully, when the worker exits.
"""

from mailsvc.settings import SettingsError, load_settings
from mailsvc.startup import check_or_exit, fail

try:
    _settings = load_settings()
except SettingsError as exc:
    fail(str(exc))

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


def on_starting(server):
    check_or_exit(_settings)


def post_worker_init(worker):
    # Another app (the benchmark's no-op floor) may run under this same configuration.
    start = getattr(worker.wsgi, "start", None)
    if start is not None:
        start()


def worker_exit(server, worker):
    stop = getattr(getattr(worker, "wsgi", None), "stop", None)
    if stop is not None:
        stop(graceful=True, timeout=server.cfg.graceful_timeout - 1)
