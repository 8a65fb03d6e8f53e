"""Settings: one table of every knob, with its default and help line.

Layered: the defaults below, then ``MAILSVC_<NAME>`` environment variables, then an explicit
mapping from the caller (tests, embedding apps). A relay's URL is read here too
(:class:`RelayUrl`), for the setting and for delivery alike. The documented settings table is
tested against :data:`SETTINGS`, so a setting cannot exist undocumented.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

Number = TypeVar("Number", int, float)


class SettingsError(ValueError):
    """A setting has a value that cannot be used."""


# Each parser raises ValueError with what it expects; the message names the setting and the
# value too (see _parse).


def _whole(value: str, least: int) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise ValueError(f"a whole number, at least {least}") from None
    if number < least:
        raise ValueError(f"a whole number, at least {least}")
    return number


def _positive_int(value: str) -> int:
    return _whole(value, 1)


def _non_negative_int(value: str) -> int:
    return _whole(value, 0)


def _positive_float(value: str) -> float:
    try:
        number = float(value.strip())
    except ValueError:
        raise ValueError("a number greater than 0 (fractions allowed)") from None
    if not number > 0 or number == float("inf"):
        raise ValueError("a number greater than 0 (fractions allowed)")
    return number


def _within(
    value: str, kind: Callable[[str], Number], low: Number, high: Number, expected: str
) -> Number:
    """``value`` read as ``kind`` (int or float), from ``low`` to ``high``."""
    try:
        number = kind(value.strip())
    except ValueError:
        raise ValueError(expected) from None
    if not low <= number <= high:
        raise ValueError(expected)
    return number


def _look_seconds(value: str) -> float:
    return _within(value, float, 0.0, 60.0, "a number of seconds from 0 to 60 (fractions allowed)")


def _gather_ms(value: str) -> float:
    return _within(
        value, float, 0.0, 1000.0, "a number of milliseconds from 0 to 1000 (fractions allowed)"
    )


def _nice(value: str) -> int | None:
    """A nice value from 0 to 19, or None for ``auto`` (which
    :func:`mailsvc.delivery.process.delivery_nice` resolves)."""
    if value.strip().lower() == "auto":
        return None
    return _within(value, int, 0, 19, "auto, or a whole number from 0 to 19")


def _helpers(value: str) -> int | None:
    """Helpers from 0 to 16, or None for ``auto`` (which
    :func:`mailsvc.delivery.process.delivery_helpers` resolves by the cores)."""
    if value.strip().lower() == "auto":
        return None
    return _within(value, int, 0, 16, "auto, or a whole number from 0 to 16")


def _dkim_bits(value: str) -> int:
    if value.strip() not in ("1024", "2048", "3072", "4096"):
        raise ValueError("1024, 2048, 3072 or 4096")
    return int(value)


def _boolean(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("true or false")


def _schedule(value: str) -> tuple[float, ...]:
    """``"0, 5, 300"``: seconds from an event to each attempt after the first."""
    expected = "seconds (0 or more) separated by commas, such as 0,5,300"
    try:
        delays = tuple(float(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise ValueError(expected) from None
    if not delays or any(not 0 <= delay < float("inf") for delay in delays):
        raise ValueError(expected)
    return delays


_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"


def _domain_name(value: str) -> str:
    name = value.strip().lower().rstrip(".")
    if name and not re.fullmatch(rf"{_LABEL}(\.{_LABEL})+", name):
        raise ValueError("a domain name such as bounces.example.com, or nothing")
    return name


def _secret(value: str) -> str:
    if value and len(value) < 16:
        raise ValueError("at least 16 characters (or nothing: one is made)")
    return value


def _log_format(value: str) -> str:
    lowered = value.strip().lower()
    if lowered not in ("text", "json"):
        raise ValueError("text or json")
    return lowered


def _synchronous(value: str) -> str:
    upper = value.strip().upper()
    if upper not in ("FULL", "NORMAL", "EXTRA"):
        raise ValueError("FULL, EXTRA or NORMAL")
    return upper


def _relay_url(value: str) -> str:
    if value.strip():
        try:
            RelayUrl.parse(value.strip())
        except SettingsError:
            raise ValueError(
                "smtp://[user:password@]host[:port][?starttls=1] or smtps://..., or nothing"
            ) from None
    return value.strip()


def _database(value: str) -> str:
    if not value.strip():
        raise ValueError("a path to an SQLite file, or postgresql://user:password@host/db")
    return value.strip()


def _bind(value: str) -> str:
    host, colon, port = value.strip().rpartition(":")
    if not (value.startswith("unix:") or (colon and host and port.isdigit())):
        raise ValueError("host:port, such as 127.0.0.1:8000 (or unix:/path)")
    return value.strip()


def _listen(value: str) -> str:
    host, colon, port = value.strip().rpartition(":")
    if not (colon and host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError("host:port, such as 127.0.0.1:2587")
    return value.strip()


@dataclass(frozen=True)
class RelayUrl:
    """``smtp://[user:password@]host[:port][?starttls=1]`` or ``smtps://...``."""

    host: str
    port: int
    implicit_tls: bool
    starttls: bool
    username: str | None
    password: str | None

    @classmethod
    def parse(cls, url: str) -> RelayUrl:
        """:raises SettingsError: the URL is not of that form."""
        parts = urlsplit(url)
        if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
            raise SettingsError("MAILSVC_SMTP_URL: expected smtp://host[:port] or smtps://host")
        try:
            port = parts.port
        except ValueError:
            raise SettingsError("MAILSVC_SMTP_URL: port is not a number") from None
        query = parse_qs(parts.query)
        return cls(
            host=parts.hostname,
            port=port or (465 if parts.scheme == "smtps" else 25),
            implicit_tls=parts.scheme == "smtps",
            starttls=query.get("starttls", ["0"])[0].lower() in ("1", "true", "yes"),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
        )


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    help: str
    parse: Callable[[str], Any] = str

    @property
    def env_name(self) -> str:
        return "MAILSVC_" + self.name.upper()


SETTINGS: tuple[Setting, ...] = (
    Setting("bind", "127.0.0.1:8000", "Address gunicorn listens on (`-b` overrides it).", _bind),
    Setting("workers", 2, "gunicorn worker processes (`-w` overrides it).", _positive_int),
    Setting(
        "threads",
        32,
        "Request threads in each gunicorn worker (`--threads` overrides it). A client that "
        "sends its request slowly holds one while it does; put nginx in front of an "
        "internet-facing deployment (see Deploy).",
        _positive_int,
    ),
    Setting(
        "pin_cores",
        "true",
        "Run each gunicorn worker, and each `mailsvc submission` process that takes messages "
        "(with MAILSVC_SUBMISSION_PROCESSES above one), on one CPU core of those the server may "
        "use, in turn (one hyperthread of each physical core first); the process that delivers "
        "runs on any. A process's threads then never move between cores (see Performance). "
        "`false`: the kernel places every thread.",
        _boolean,
    ),
    Setting(
        "database",
        "./var/mailsvc.sqlite3",
        "The store and the queue: an SQLite file, or `postgresql://user:password@host:5432/db` "
        "for several hosts on one PostgreSQL (see Past one machine).",
        _database,
    ),
    Setting(
        "postgres_pool_size",
        10,
        "PostgreSQL connections each worker process keeps at most.",
        _positive_int,
    ),
    Setting(
        "postgres_wait_seconds",
        2.0,
        "Longest a request waits for a PostgreSQL connection (a new one's connect timeout, or a "
        "free one of the pool) before it is answered 503 with `Retry-After`.",
        _positive_float,
    ),
    Setting(
        "postgres_statement_timeout_seconds",
        10.0,
        "PostgreSQL `statement_timeout` on the service's connections: a statement that runs "
        "longer is canceled and its request answered 503.",
        _positive_float,
    ),
    Setting(
        "postgres_lock_timeout_seconds",
        2.0,
        "PostgreSQL `lock_timeout`: a statement that waits longer for a row another "
        "transaction holds is canceled and its request answered 503.",
        _positive_float,
    ),
    Setting(
        "postgres_idle_in_transaction_seconds",
        30.0,
        "PostgreSQL `idle_in_transaction_session_timeout`: a connection left in a transaction "
        "this long (a process stopped mid-job) is closed by the server, its locks freed.",
        _positive_float,
    ),
    Setting(
        "postgres_network_timeout_seconds",
        5.0,
        "Longest the service waits on a PostgreSQL server that has gone silent (a network "
        "partition, a host gone without closing its connections): TCP keepalives and "
        "`tcp_user_timeout`, at both ends, drop the connection, and its request is answered "
        "503.",
        _positive_float,
    ),
    Setting(
        "sqlite_synchronous",
        "FULL",
        "SQLite `synchronous` for writes that accept mail (FULL, EXTRA or NORMAL). FULL and "
        "EXTRA: such a write is on disk before it returns (the write-ahead log synced once "
        "the write lock is let go, so other writes do not wait for the sync); NORMAL: not "
        "synced, and a power cut may lose the last writes.",
        _synchronous,
    ),
    Setting(
        "store_min_free_mb",
        128,
        "Free space kept on the SQLite store's file system, in MiB: below it, requests that "
        "would add to the store are refused with 503 and `Retry-After`, and what is left lets "
        "delivery record its outcomes (as Postfix's `queue_minfree`). 0: none kept.",
        _non_negative_int,
    ),
    Setting(
        "smtp_url",
        "",
        "Relay, as `smtp://[user:password@]host[:port][?starttls=1]` or `smtps://...`. "
        "Empty: deliver into the Maildir at `MAILSVC_OUTBOX`.",
        _relay_url,
    ),
    Setting(
        "smtp_ca_file",
        "",
        "PEM bundle of the CAs that sign the relay's TLS certificate. Empty: the system's CAs.",
    ),
    Setting("outbox", "./var/outbox", "Maildir that receives mail when no relay is set."),
    Setting("smtp_timeout_seconds", 30.0, "Timeout of each SMTP command.", _positive_float),
    Setting(
        "delivery_process",
        "true",
        "Under gunicorn, deliver (mail, webhooks, the purge) in a process of its own that the "
        "master starts beside the workers and starts again if it dies, not in every worker: "
        "requests and deliveries then never wait for each other's interpreter lock.",
        _boolean,
    ),
    Setting(
        "delivery_nice",
        "auto",
        "How much lower the process that delivers runs than those that answer clients (a "
        "nice value, added to theirs): on a busy machine, requests and SMTP transactions are "
        "answered first and delivery has the CPU they leave; a burst is delivered as soon, a "
        "load that never lets up leaves mail queued until it does. `auto`: 10, on either "
        "backend (see Performance). 0: the same priority. Threads that deliver inside a worker "
        "(MAILSVC_DELIVERY_PROCESS=false, one submission process) keep the worker's.",
        _nice,
    ),
    Setting(
        "delivery_helpers",
        "auto",
        "Processes beside the one that delivers that help it drain a backlog: they claim mail "
        "only while at least 64 emails are due and none is being queued (a burst's tail, a "
        "relay back after an outage), so they never take the cores or the store from the "
        "processes that take mail, and mail that comes one at a time is the delivering "
        "process's. They run 19 nice steps down. `auto`: one where the service may use more "
        "than one core, else none (on one core, one process keeps the core busy). 0: none. "
        "Only with a delivering process (MAILSVC_DELIVERY_PROCESS, or more than one "
        "MAILSVC_SUBMISSION_PROCESSES).",
        _helpers,
    ),
    Setting(
        "delivery_threads",
        4,
        "Delivery threads of the process that delivers (each worker's, with "
        "MAILSVC_DELIVERY_PROCESS=false).",
        _positive_int,
    ),
    Setting(
        "delivery_run",
        8,
        "Emails a delivery thread sends one after the other while the relay takes each, "
        "before it records them in one transaction. A crash in a run sends again those the "
        "relay took (same Message-ID); 1 keeps that to one email a thread.",
        _positive_int,
    ),
    Setting(
        "delivery_gather_ms",
        20.0,
        "While mail comes an email at a time, how long after a claim the delivering process "
        "waits before it claims again, so that what came meanwhile goes as one run (claimed in "
        "one transaction, recorded in one): the most an email waits for that. An email after "
        "a quiet spell this long is claimed at once, and a backlog as fast as threads free up. "
        "0: each email is claimed as it comes.",
        _gather_ms,
    ),
    Setting(
        "lease_seconds",
        120.0,
        "How long a claim on an email lasts before another process may take it over.",
        _positive_float,
    ),
    Setting(
        "poll_seconds",
        1.0,
        "How often idle delivery threads look for mail queued by other processes, and how "
        "often one email tries a relay that cannot be reached.",
        _positive_float,
    ),
    Setting(
        "retry_first_seconds",
        60.0,
        "Delay before the first retry of a temporary failure; it doubles with each attempt.",
        _positive_float,
    ),
    Setting("retry_max_seconds", 3600.0, "Largest delay between two attempts.", _positive_float),
    Setting(
        "retry_lifetime_seconds",
        86400.0,
        "Age at which an email still failing temporarily is given up (`failed`).",
        _positive_float,
    ),
    Setting(
        "dns_servers",
        "",
        "Nameservers for domain checks, as `host` or `host:port`, comma-separated. "
        "Empty: the system's.",
    ),
    Setting("dns_timeout_seconds", 3.0, "Time allowed for one DNS look-up.", _positive_float),
    Setting(
        "spf_record",
        "v=spf1 mx ~all",
        "The SPF record recommended to domains; it depends on the relay you send through.",
    ),
    Setting("dmarc_record", "v=DMARC1; p=none", "The DMARC record recommended to domains."),
    Setting("dkim_key_bits", 2048, "Size of the RSA DKIM key made for a new domain.", _dkim_bits),
    Setting(
        "idempotency_ttl_seconds",
        86400.0,
        "How long the answer to a request with an `Idempotency-Key` is kept for replay.",
        _positive_float,
    ),
    Setting(
        "body_min_bytes_per_second",
        32_768,
        "Least rate a request body must arrive at, on average, after its first "
        "`MAILSVC_BODY_GRACE_SECONDS`; a slower one is refused with 408 and its connection "
        "closed, so that a client that trickles its body cannot hold a thread (or a place for a "
        "large body) for long.",
        _positive_int,
    ),
    Setting(
        "body_grace_seconds",
        10.0,
        "How long a request body (or a message over SMTP) may take before it must keep arriving "
        "at `MAILSVC_BODY_MIN_BYTES_PER_SECOND`.",
        _positive_float,
    ),
    Setting(
        "max_body_bytes",
        1048576,
        "Largest request body accepted, but on the routes that send mail.",
        _positive_int,
    ),
    Setting(
        "max_send_body_bytes",
        16777216,
        "Largest body of `POST /v1/emails` and `POST /v1/emails/batch`: room for 10 MB of "
        "attachments, which base64 makes a third larger.",
        _positive_int,
    ),
    Setting(
        "large_body_mb_per_minute",
        100,
        "Megabytes of bodies over `MAILSVC_MAX_BODY_BYTES` (sends with files or long html, "
        "and SMTP messages of that size) that one account may send in a minute, on every "
        "worker and host together (a bucket in the store that holds at most a minute's "
        "worth); a body the bucket does not hold is refused with 429 until it refills. An "
        "account's own: `mailsvc limits set --group large_body_mb`.",
        _positive_int,
    ),
    Setting(
        "large_bodies_per_process",
        4,
        "Bodies over `MAILSVC_MAX_BODY_BYTES` (or chunked) that one process works on at once, "
        "two per account at most; another is refused with a `Retry-After`. Each costs about "
        "three times its size in memory while it runs.",
        _positive_int,
    ),
    Setting(
        "attachments_max_bytes",
        10_000_000,
        "Largest total of one email's attachments, decoded (10 MB, as Postmark).",
        _positive_int,
    ),
    Setting("attachments_max_count", 20, "Most attachments one email may carry.", _positive_int),
    Setting(
        "schedule_max_days",
        30.0,
        "How far ahead `scheduledAt` may be, in days.",
        _positive_float,
    ),
    Setting(
        "template_max_source_chars",
        100_000,
        "Largest template part (subject, html or text), in characters. Gmail clips a message "
        "over 102 KB, so a bigger template is a mistake or an attack.",
        _positive_int,
    ),
    Setting(
        "template_max_output_chars",
        1_000_000,
        "Largest rendered template part, in characters: what a request body may carry.",
        _positive_int,
    ),
    Setting(
        "template_render_cpu_ms",
        100,
        "CPU time one render (all parts of a template) may take; a usual email template "
        "renders in 1 to 5 ms.",
        _positive_int,
    ),
    Setting(
        "template_cpu_ms_per_minute",
        20_000,
        "CPU time all of an account's template renders may take in a minute, on every worker "
        "and host together (a bucket in the store that holds at most a minute's worth); once "
        "it is spent, a render is refused with 429 until it refills. An account's own: "
        "`mailsvc limits set --group template_cpu_ms`.",
        _positive_int,
    ),
    Setting(
        "template_cache_bytes",
        16_000_000,
        "Memory each worker process may keep compiled templates in (an estimate: twice the "
        "source and 200 bytes a node).",
        _positive_int,
    ),
    Setting(
        "return_path_domain",
        "",
        "Domain of the envelope sender (`b+TOKEN@` it), whose MX is your MTA, which hands bounces "
        "to `mailsvc inbound`. The token names the email and the recipient, with a MAC. Empty: "
        "the envelope sender is the `from` address, and bounces are matched by `Message-ID`.",
        _domain_name,
    ),
    Setting(
        "return_path_secret",
        "",
        "Key of the MAC in return-path tokens (at least 16 characters). Empty: one is made at "
        "first start and kept in the store, the same for every host.",
        _secret,
    ),
    Setting(
        "webhook_retry_seconds",
        "0,5,300,1800,7200,18000,36000,50400,72000,86400",
        "When a webhook delivery is tried again after each failure, in seconds, comma-separated "
        "(by default at once, 5 s, 5 min, 30 min, 2, 5, 10, 14, 20 and 24 h); less up to 20 % of "
        "jitter. After the last, the delivery has failed.",
        _schedule,
    ),
    Setting(
        "webhook_disable_after_seconds",
        432000.0,
        "An endpoint whose deliveries have all failed for this long is disabled (five days).",
        _positive_float,
    ),
    Setting(
        "webhook_timeout_seconds",
        15.0,
        "Time one webhook request may take, connecting, sending and answering.",
        _positive_float,
    ),
    Setting(
        "webhook_threads",
        4,
        "Webhook delivery threads of the process that delivers (apart from mail delivery's).",
        _positive_int,
    ),
    Setting(
        "webhook_ca_file",
        "",
        "PEM bundle of the CAs that sign webhook endpoints' TLS certificates. Empty: the "
        "system's CAs.",
    ),
    Setting(
        "webhook_allow_http",
        "false",
        "Allow `http://` webhook URLs (else `https://` only).",
        _boolean,
    ),
    Setting(
        "webhook_allow_private",
        "false",
        "Allow webhook URLs whose host is a loopback, private, link-local or multicast address "
        "(else refused at creation and at every connection).",
        _boolean,
    ),
    Setting(
        "dashboard",
        "true",
        "Serve the dashboard (`/dashboard`: pages for people, signed in with an API key).",
        _boolean,
    ),
    Setting(
        "dashboard_idle_minutes",
        30.0,
        "A dashboard session unused this long has ended.",
        _positive_float,
    ),
    Setting(
        "dashboard_lifetime_hours",
        12.0,
        "A dashboard session has ended this long after its sign-in, used or not.",
        _positive_float,
    ),
    Setting(
        "dashboard_signins_per_minute",
        10,
        "Sign-in attempts one client address may make a minute, on every worker and host.",
        _positive_int,
    ),
    Setting(
        "submission_listen",
        "127.0.0.1:2587",
        "Address `mailsvc submission` (SMTP submission) listens on (`--listen` overrides it).",
        _listen,
    ),
    Setting(
        "submission_tls_cert",
        "",
        "PEM certificate (with its chain) that SMTP submission offers with STARTTLS. Empty: no "
        "TLS, and AUTH only with `MAILSVC_SUBMISSION_ALLOW_PLAINTEXT`.",
    ),
    Setting("submission_tls_key", "", "PEM private key of `MAILSVC_SUBMISSION_TLS_CERT`."),
    Setting(
        "submission_implicit_tls",
        "false",
        "TLS from the first byte (port 465's way) instead of STARTTLS.",
        _boolean,
    ),
    Setting(
        "submission_allow_plaintext",
        "false",
        "Offer AUTH without TLS (for a trusted loopback or private network only: the password "
        "is an API key).",
        _boolean,
    ),
    Setting(
        "submission_max_connections",
        100,
        "SMTP connections one submission process serves at once; another is answered `421` "
        "and closed.",
        _positive_int,
    ),
    Setting(
        "submission_max_connections_per_client",
        50,
        "SMTP connections from one IP address at once (as Postfix's "
        "`smtpd_client_connection_count_limit`).",
        _positive_int,
    ),
    Setting(
        "submission_timeout_seconds",
        60.0,
        "How long SMTP submission waits for a client's next command before it closes the "
        "connection.",
        _positive_float,
    ),
    Setting(
        "submission_threads",
        8,
        "Threads of a submission process that read the store and take messages (the SMTP "
        "sessions themselves share one event loop).",
        _positive_int,
    ),
    Setting(
        "submission_processes",
        1,
        "Processes of `mailsvc submission` that take messages, each with its own event loop and "
        "threads, on one listening socket (as gunicorn's workers): one a core for the most "
        "messages a second. The connection limits are each process's. One process delivers; "
        "above one, that is one more process of their own.",
        _positive_int,
    ),
    Setting(
        "submission_look_seconds",
        1.0,
        "How long after a MAIL FROM that read the store a session's next MAIL FROM may be "
        "answered from what it found (its rate-limit bucket and credit as the session left "
        "them, its verified domain); such a message is queued only if its key is found live, "
        "and its token in the bucket, in the transaction that queues it. 0: every MAIL FROM "
        "reads the store.",
        _look_seconds,
    ),
    Setting(
        "submission_hostname",
        "",
        "The name SMTP submission gives in its greeting and EHLO. Empty: the machine's name.",
    ),
    Setting(
        "metrics_token",
        "",
        "Bearer token that `GET /metrics` asks for. Empty: metrics are not served.",
    ),
    Setting(
        "log_format",
        "text",
        "`text` or `json`: one line per request (the access log), per delivery attempt, and "
        "per change of the relay's health, on standard error.",
        _log_format,
    ),
    Setting(
        "retention_days",
        30.0,
        "Days a final email (sent, failed, canceled, bounced...) is kept, with its recipients, "
        "events, attachments and webhook deliveries; fractions allowed. Queued, deferred and "
        "scheduled mail is never purged.",
        _positive_float,
    ),
    Setting(
        "purge_interval_seconds",
        3600.0,
        "How often one process (of every worker and host) purges mail older than its "
        "retention, in small batches.",
        _positive_float,
    ),
    Setting("credits_per_recipient", 1, "Credit charged for each recipient.", _non_negative_int),
    Setting("rate_send_per_minute", 100, "Rate limit of `POST /v1/emails`.", _positive_int),
    Setting("rate_list_per_minute", 300, "Rate limit of `GET /v1/emails...`.", _positive_int),
    Setting("rate_other_per_minute", 60, "Rate limit of every other endpoint.", _positive_int),
    Setting(
        "caller_cache_seconds",
        1.0,
        "How long a process uses what it read of an API key (its account's rate limit and "
        "bucket, whether it suppresses anyone) for further requests that write: their write "
        "confirms the key live, so a revoked key writes nothing, and a suppression added "
        "since is honoured; a change of an account's own rate limit applies within this. 0: "
        "every request reads its key (one more round trip a request on PostgreSQL).",
        lambda value: _within(value, float, 0.0, 60.0, "seconds, from 0 to 60"),
    ),
)

_BY_NAME = {setting.name: setting for setting in SETTINGS}


class Settings(dict[str, Any]):
    """The resolved settings, readable as attributes (``settings.database``).

    Each is an attribute of the object too, set with its item, so that reading one is a plain
    attribute lookup: a ``__getattr__`` that looked it up in the dict took 0.86 us a read (the
    lookup that fails first, then a call), and an accept reads nine. No setting is named as a
    method of ``dict`` (a test holds that)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        super().__init__(values)
        self.__dict__.update(values)

    def __setitem__(self, name: str, value: Any) -> None:
        super().__setitem__(name, value)
        self.__dict__[name] = value

    def update(self, *args: Any, **kwargs: Any) -> None:  # (each through __setitem__)
        for name, value in dict(*args, **kwargs).items():
            self[name] = value

    def __getattr__(self, name: str) -> Any:  # (not a setting: the attribute lookup failed)
        raise AttributeError(name)


def load_settings(
    overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Resolve every setting: defaults, then ``MAILSVC_*`` environment, then ``overrides``.

    :param overrides: values by setting name (``{"database": "/tmp/x.sqlite3"}``); they win.
    :param environ: the environment to read, ``os.environ`` when not given.
    :raises SettingsError: for an unknown name or a value that does not parse.
    """
    environ = os.environ if environ is None else environ
    # A default written as text (a schedule) is read as the environment's value would be.
    resolved = Settings(
        {
            setting.name: setting.parse(setting.default)
            if isinstance(setting.default, str)
            else setting.default
            for setting in SETTINGS
        }
    )
    for setting in SETTINGS:
        if setting.env_name in environ:
            resolved[setting.name] = _parse(setting, environ[setting.env_name], setting.env_name)
    for name, value in (overrides or {}).items():
        if name not in _BY_NAME:
            raise SettingsError(f"unknown setting {name!r}")
        setting = _BY_NAME[name]
        resolved[name] = (
            _parse(setting, value, setting.env_name) if isinstance(value, str) else value
        )
    return resolved


def _parse(setting: Setting, raw: str, source: str) -> Any:
    try:
        return setting.parse(raw)
    except ValueError as exc:
        raise SettingsError(f"{source}={_shown(setting, raw)}: expected {exc}") from None


def _shown(setting: Setting, raw: str) -> str:
    """A value as an error message may repeat it: never a secret, nor a URL's password."""
    if setting.parse is _secret:
        return "(not shown: a secret)"
    return repr(re.sub(r"(//[^/@:]*:)[^@]*(@)", r"\1***\2", raw))


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """A warning for each ``MAILSVC_*`` variable that is no setting (a typo, most likely),
    naming the closest setting there is. (``MAILSVC_TEST_*`` are the test suite's.)"""
    import difflib

    environ = os.environ if environ is None else environ
    known = [setting.env_name for setting in SETTINGS]
    warnings = []
    for name in sorted(environ):
        if (
            name.startswith("MAILSVC_")
            and name not in known
            and not name.startswith("MAILSVC_TEST_")
        ):
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]}?" if close else ""
            warnings.append(f"{name} is not a setting of mailsvc, and is ignored{hint}")
    return warnings
