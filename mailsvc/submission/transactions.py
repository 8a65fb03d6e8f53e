"""The rules of a mail transaction over SMTP: the HTTP API's, checked in SMTP's order.

AUTH
    PLAIN or LOGIN; any user name, the password is an API key, checked as the API checks a
    bearer key (``535 5.7.8`` when it is unknown or revoked). Nothing but its form is checked
    before the store is asked, and nothing is done for a session without a key (aiosmtpd
    answers ``530 5.7.0`` to ``MAIL`` without ``AUTH``).
MAIL FROM
    The key again (revoked since?), with the state of its ``send`` rate-limit bucket, in one
    read: no token is ``451 4.7.1`` with the wait. Then the key's scope and sender domain, and
    the envelope sender's domain must be verified for the account (``550 5.7.1``); a store
    whose disk is nearly full takes nothing (``451 4.3.0``). Within
    ``MAILSVC_SUBMISSION_LOOK_SECONDS`` of those reads (1 s), the session's next MAIL from a
    domain they found verified is answered from them (:class:`Look`: its bucket as the session
    left it, its credit less what it spent), without the store and without a hand-off to a
    thread; that message's write finds the key live in its own transaction, and takes the
    token from the bucket as the store has it, before it queues anything.
RCPT TO
    The address, as strict as the API's (``553 5.1.3``); at most
    :data:`~mailsvc.api.sending.MAX_RECIPIENTS` (``452 4.5.3``: the rest in another message); a
    suppressed address is refused on its own (``550 5.7.1``), the others go on; and the credit
    must cover every recipient so far (``452 4.3.1``, checked again when the email is queued).
DATA
    The message becomes the API's send request (:mod:`.mime`), checked by the API's schema and
    parser, and is carried out by the API's own write path (:func:`mailsvc.api.writes.carry_out`):
    queued with its credit and its rate-limit token in one transaction, durably, before the
    ``250 2.0.0`` that names the email. A client that sends the same message again (the same
    ``Message-ID``, within the idempotency window) gets the same email.

A transaction takes one token of the account's ``send`` bucket, the HTTP sends' own, whatever
becomes of it, but for one refused for the rate limit: a message queued takes it with the email,
any other end (a refusal, ``RSET``, a dropped connection) in a short write of its own.

Everything that reads the store, parses or writes runs in the server's threads, never on the
event loop that serves every session.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TypeVar

from aiosmtpd.smtp import MISSING, Envelope, Session

from ..api.sending import MAX_RECIPIENTS, SendRequest
from ..api.sending import suppressed as suppressed_of
from ..api.writes import carry_out
from ..app import MailService
from ..errors import DomainNotVerified, Forbidden, NotAuthenticated, RateLimited, ValidationFailed
from ..http import idempotency
from ..http.auth import Principal, Token, authenticate, key_token, require_scope
from ..http.endpoints import SEND
from ..http.idempotency import Claim
from ..http.inputs import check_document
from ..limits.ratelimit import Admission
from ..mail.addresses import parse_address
from ..ops import metrics
from ..routes import SEND_EMAIL
from ..store import Caller
from .mime import BadMessage, read_message
from .replies import Reply, reply_for

log = logging.getLogger("mailsvc.submission")
T = TypeVar("T")


class Account:
    """What a session knows of who it is: the key it authenticated with."""

    def __init__(self, token: Token, principal: Principal) -> None:
        self.token = token
        self.principal = principal


@dataclass
class Look:
    """What a MAIL's reads of the store found, to answer the session's next MAILs from until
    ``until`` (``MAILSVC_SUBMISSION_LOOK_SECONDS`` later, by the monotonic clock): the key's
    caller, with its ``send`` bucket as this session has left it since; the sender domains
    found verified; the account's credit, less what the session's messages have spent since.

    A client sends one message after another on a connection; each MAIL's reads and the
    hand-off to a thread that makes them were an eighth of its message's time (0.37 of 2.9 ms
    on one connection, by the client's clock). What they find is checked again where the
    message is queued, in the same transaction: the key must be live (a revocation committed
    before it is seen), the token is taken (the last one goes to one taker only), the credit
    too, and the ``From`` header's domain is checked as the API's; and the store's room is
    looked at before it. (Reading the key and its bucket again at DATA, in a read of its own,
    was a fifteenth of the process's CPU a message.) What a MAIL from the look
    cannot know is a change of the last second to the envelope sender's domain, or to the
    account's suppressions (a recipient suppressed since is left out at sending, as over HTTP).
    """

    until: float
    caller: Caller
    domains: set[str]
    credits: int

    def took(self, admission: Admission) -> None:
        """The bucket as a transaction of the session leaves it: its token taken."""
        self.caller = replace(self.caller, bucket=(admission.tokens - 1.0, admission.now))


class Login(Session):
    """aiosmtpd's session state, with the account it authenticated as."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.account: Account | None = None
        self.look: Look | None = None

    @property
    def sender(self) -> Account:
        """The account (aiosmtpd lets no mail command in before AUTH)."""
        assert self.account is not None
        return self.account


class Transaction(Envelope):
    """A mail transaction, with what the rules hold of it between commands."""

    def __init__(self) -> None:
        super().__init__()
        self.admission: Admission | None = None
        #: The account's credit when the transaction began, and what its recipients cost.
        self.credits = 0
        self.charged = 0
        self.started = time.perf_counter()
        #: Places held for the transaction (a large message's).
        self.held = contextlib.ExitStack()
        self.held_large = False
        #: Its message is being taken (the take settles its token itself).
        self.taking = False
        #: Its MAIL was answered from the session's :class:`Look`.
        self.from_look = False
        #: The credit its message spent (none when it was the same as an earlier one).
        self.spent = 0


class MailTransactions:
    """aiosmtpd's handler: the hooks of AUTH, MAIL, RCPT and EHLO, and the message of DATA.

    :param service: the service whose store, rules and delivery threads it uses.
    :param executor: the threads that do the work (the store, parsing).
    """

    def __init__(self, service: MailService, executor: Executor) -> None:
        self.service = service
        self.settings = service.settings
        self.executor = executor

    async def _run(self, work: Callable[..., T], *arguments: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, partial(work, *arguments)
        )

    # -- EHLO and AUTH -------------------------------------------------------------------

    async def handle_EHLO(  # noqa: N802 (aiosmtpd's name)
        self, server: Any, session: Login, envelope: Envelope, hostname: str, lines: list[str]
    ) -> list[str]:
        session.host_name = hostname
        return [*lines[:-1], "250-PIPELINING", "250-ENHANCEDSTATUSCODES", lines[-1]]

    async def handle_AUTH(  # noqa: N802 (aiosmtpd's name)
        self, server: Any, session: Login, envelope: Envelope, args: list[str]
    ) -> str | None:
        password = await _password(server, args)
        if password is None:
            return None  # the exchange was refused already (bad base64, aborted)
        token = key_token(password)
        if token is None:
            metrics.SUBMISSION_AUTH.labels("refused").inc()
            return "535 5.7.8 the password must be an API key (ms_...)"
        try:
            principal = await self._run(self._authenticate, token)
        except NotAuthenticated:
            metrics.SUBMISSION_AUTH.labels("refused").inc()
            return "535 5.7.8 the API key is unknown or revoked"
        except Exception as exc:  # the store cannot be read now: the client may try again
            return reply_for(exc).lines()
        metrics.SUBMISSION_AUTH.labels("accepted").inc()
        session.authenticated = True
        session.account = Account(token, principal)
        return "235 2.7.0 authenticated"

    def _authenticate(self, token: Token) -> Principal:
        principal, _ = authenticate(token, self.service.store.reads, SEND)
        return principal

    # -- MAIL and RCPT -------------------------------------------------------------------

    async def handle_MAIL(  # noqa: N802 (aiosmtpd's name)
        self,
        server: Any,
        session: Login,
        envelope: Transaction,
        address: str,
        options: list[str],
    ) -> str:
        account = session.sender
        looked = self._from_look(session, address)
        if looked is not None:
            sender, admission = looked
            envelope.from_look = True
        else:
            try:
                sender, admission, credits, caller = await self._run(self._begin, account, address)
            except Exception as exc:
                return self._refused(exc, account, envelope).lines()
            domain = sender.rpartition("@")[2]
            until = time.monotonic() + self.settings.submission_look_seconds
            session.look = Look(until, caller, {domain}, credits)
        declared = _declared_size(options)
        if declared > self.settings.max_body_bytes:  # refused before a byte of it is sent
            try:
                await self._run(self._admit_large, admission, declared)
            except Exception as exc:
                return self._refused(exc, account, envelope).lines()
            admission.large_body = None  # (charged at the end of data, its size as sent)
        look = session.look
        assert look is not None
        look.took(admission)
        envelope.mail_from = sender
        envelope.mail_options.extend(options)
        envelope.admission = admission
        envelope.credits = look.credits
        return "250 2.1.0 sender ok"

    def _from_look(self, session: Login, address: str) -> tuple[str, Admission] | None:
        """The sender and admission of a MAIL answered from the session's :class:`Look`, or
        None when it cannot be: none, or out of date, or a sender it did not find verified,
        or a bucket it left empty (the store is then read, and says why)."""
        look = session.look
        if look is None or time.monotonic() >= look.until:
            return None
        principal = session.sender.principal
        try:
            sender = parse_address(address, "MAIL FROM")
        except ValidationFailed:
            return None
        domain = sender.rpartition("@")[2]
        if domain not in look.domains or principal.scope not in SEND_EMAIL.scopes:
            return None
        if principal.domain is not None and domain != principal.domain:
            return None
        deps = self.service.deps
        try:
            return sender, deps.limiter.admit(look.caller, principal, SEND, deps.clock())
        except RateLimited:
            return None

    def _begin(self, account: Account, address: str) -> tuple[str, Admission, int, Caller]:
        """Who sends, whether they may send now and from there: the transaction's admission,
        the account's credit, and the key's caller."""
        store = self.service.store
        admission, caller = self._admit(account)
        principal = account.principal
        try:
            require_scope(principal, SEND_EMAIL.scopes)
            sender = parse_address(address, "MAIL FROM")
            domain = sender.rpartition("@")[2]
            if principal.domain is not None and domain != principal.domain:
                raise Forbidden(f"MAIL FROM: this API key may only send from {principal.domain}")
            if not store.reads.is_domain_verified(principal.account_id, domain):
                raise DomainNotVerified(
                    f"MAIL FROM: sender domain {domain} is not verified for this account"
                )
            self._check_room()
            credits = self._credits(account)
        except Exception:
            self._settle(admission)
            raise
        return sender, admission, credits, caller

    async def handle_RCPT(  # noqa: N802 (aiosmtpd's name)
        self,
        server: Any,
        session: Login,
        envelope: Transaction,
        address: str,
        options: list[str],
    ) -> str:
        try:
            recipient = parse_address(address, "RCPT TO")
        except ValidationFailed as exc:
            return f"553 5.1.3 {exc.message}"
        if recipient in envelope.rcpt_tos:
            return "250 2.1.5 recipient ok (named before)"
        if len(envelope.rcpt_tos) >= MAX_RECIPIENTS:
            return (
                f"452 4.5.3 at most {MAX_RECIPIENTS} recipients a message; send to the others "
                "in another message"
            )
        account = session.sender
        try:
            # (None to look up, and no hand-off to a thread, when the account suppressed no
            # address when its key was last read, by a MAIL or a DATA; one suppressed since is
            # left out at sending, as over HTTP.)
            suppressed = (
                await self._run(
                    suppressed_of, self.service.store.reads, account.principal, [recipient]
                )
                if account.principal.suppresses
                else {}
            )
        except Exception as exc:
            return reply_for(exc).lines()
        if suppressed:
            found = suppressed[recipient]
            return (
                f"550 5.7.1 {recipient} is on this account's suppression list ({found.reason}); "
                "no mail is sent to it until the suppression is removed"
            )
        cost = (envelope.charged + 1) * self.settings.credits_per_recipient
        if cost > envelope.credits and envelope.from_look:  # only the store refuses
            try:
                envelope.credits = await self._run(self._credits, account)
            except Exception as exc:
                return reply_for(exc).lines()
            if session.look is not None:
                session.look.credits = envelope.credits
        if cost > envelope.credits:
            return (
                f"452 4.3.1 not enough credit to send to every recipient (credits: {cost} "
                f"needed, {envelope.credits} available)"
            )
        envelope.charged += 1
        envelope.rcpt_tos.append(recipient)
        envelope.rcpt_options.extend(options)
        return "250 2.1.5 recipient ok"

    def _credits(self, account: Account) -> int:
        found = self.service.store.reads.get_account(account.principal.account_id)
        return found.credits if found is not None else 0

    # -- DATA ----------------------------------------------------------------------------

    def hold_large(self, session: Login, envelope: Transaction) -> None:
        """Hold a place for a large message of the session's account until the transaction
        ends. :raises TooManyLargeBodies: none is free."""
        account = session.sender
        envelope.held.enter_context(
            self.service.deps.large_bodies.hold(account.principal.account_id)
        )

    async def take(
        self, session: Login, envelope: Transaction, raw: bytes, eight_bit: bool, alone: bool
    ) -> Reply:
        """The reply to a message whose data arrived whole: queued, or why not. ``alone``: the
        process serves this connection only, and the event loop has nothing else to do while
        the message is taken; it is taken on the loop's thread, without the hand-off to a
        thread and back (a tenth of one connection's time a message)."""
        account = session.sender
        started = time.perf_counter()
        envelope.taking = True
        try:
            if alone:
                reply, email_id = self._take(account, envelope, raw, eight_bit)
            else:
                reply, email_id = await self._run(self._take, account, envelope, raw, eight_bit)
        finally:
            envelope.taking = False
            envelope.held.close()
        if email_id is None:
            metrics.SUBMISSION_MESSAGES.labels(_outcome(reply)).inc()
        else:
            metrics.SUBMISSION_MESSAGES.labels("accepted").inc()
        look, admission = session.look, envelope.admission
        if envelope.from_look and email_id is None:
            session.look = None  # what changed since is the store's to say, at the next MAIL
        elif look is not None and admission is not None:  # the look, as the message left it
            look.took(admission)
            look.credits -= envelope.spent
        metrics.SUBMISSION_DURATION.observe(time.perf_counter() - started)
        _log_message(session, envelope, reply, email_id)
        return reply

    def _take(
        self, account: Account, envelope: Transaction, raw: bytes, eight_bit: bool
    ) -> tuple[Reply, str | None]:
        service = self.service
        admission = envelope.admission
        assert admission is not None
        try:
            if envelope.from_look:
                self._check_room()
            if len(raw) > service.settings.max_body_bytes:
                self._admit_large(admission, len(raw))
            if eight_bit and "BODY=8BITMIME" not in envelope.mail_options:
                raise BadMessage(
                    "the message has 8-bit bytes, and MAIL FROM did not say BODY=8BITMIME"
                )
            submitted = read_message(raw, envelope.rcpt_tos)
            checked = check_document(
                submitted.document, SEND_EMAIL, service.schemas, service.settings
            )
            assert isinstance(checked, SendRequest)
            request = _with_message_id(checked, submitted.message_id)
            service.deps.keyring.load()  # never from inside a read transaction (see keyring)
            principal = account.principal
            require_scope(principal, SEND_EMAIL.scopes)
            assert SEND_EMAIL.permits is not None
            SEND_EMAIL.permits(service.store.reads, principal, body=request)
            claim = self._claim(principal, submitted.message_id, submitted.document)
            admission.now = service.deps.clock()
            written = carry_out(
                service.store,
                service.deps,
                service.wakers,
                SEND_EMAIL,
                principal,
                admission,
                {"body": request},
                claim,
                key_read_before=not envelope.from_look,
            )
        except NotAuthenticated as exc:  # the key revoked since: nothing is taken
            admission.taken = True
            return reply_for(exc), None
        except RateLimited as exc:  # no token left: what else it cost is charged (a large body)
            self._settle(admission, limited=True)
            return reply_for(exc), None
        except Exception as exc:
            self._settle(admission)
            return reply_for(exc), None
        # (a replay's email is the one its stored answer names)
        email_id = written.accepted[0] if written.accepted else json.loads(written.body)["id"]
        if not written.replayed:
            envelope.spent = envelope.charged * service.settings.credits_per_recipient
        again = " (sent before with this Message-ID: the same email)" if written.replayed else ""
        return Reply(250, "2.0.0", f"queued as {email_id}{again}"), email_id

    def _admit_large(self, admission: Admission, size: int) -> None:
        """Let in a large message, read but not parsed, if the account's bucket of large bodies
        holds it (:mod:`mailsvc.limits.large_body`).

        :raises RateLimited: it does not (the message then takes no token, as over HTTP).
        """
        try:
            self.service.deps.limiter.admit_large_body(self.service.store.reads, admission, size)
        except RateLimited:
            admission.taken = True
            raise

    def _admit(self, account: Account) -> tuple[Admission, Caller]:
        """The key read again (revoked since?) with its ``send`` bucket, in one read: the
        transaction's admission, and the key's caller.

        :raises NotAuthenticated: the key is unknown or revoked.
        :raises RateLimited: the bucket has no token.
        """
        store, deps = self.service.store, self.service.deps
        principal, caller = authenticate(account.token, store.reads, SEND)
        account.principal = principal
        return deps.limiter.admit(caller, principal, SEND, deps.clock()), caller

    def _check_room(self) -> None:
        """:raises StoreOutage: the store's disk is nearly full (it takes nothing)."""
        self.service.store.check_room(self.settings.store_min_free_mb * 2**20)

    def _claim(
        self, principal: Principal, message_id: str | None, document: dict[str, Any]
    ) -> Claim | None:
        """A retry of a message (its ``Message-ID`` again) gets the first one's email."""
        if message_id is None:
            return None
        return Claim(
            principal.account_id,
            f"smtp {message_id}",
            idempotency.fingerprint("SMTP", "DATA", document),
            self.service.deps.clock(),
            self.settings.idempotency_ttl_seconds,
        )

    # -- the end of a transaction ------------------------------------------------------

    def refuse(self, session: Login, envelope: Transaction, reply: Reply) -> Reply:
        """A message the session refused before it was read whole (too large, too long a
        line, no place for it): its token is taken, its line logged."""
        if envelope.admission is not None:
            self.executor.submit(self._settle, envelope.admission)
        metrics.SUBMISSION_MESSAGES.labels(_outcome(reply)).inc()
        _log_message(session, envelope, reply, None)
        return reply

    def end(self, envelope: Transaction) -> None:
        """The transaction is over (its message taken or refused, RSET, a new EHLO, the
        connection closed): its places are given back, and its token taken if it was not."""
        if envelope.taking:
            return  # (the take gives back its places and settles its token itself)
        envelope.held.close()
        if envelope.admission is not None and not envelope.admission.taken:
            self.executor.submit(self._settle, envelope.admission)

    def _settle(self, admission: Admission, limited: bool = False) -> None:
        """Take the transaction's token, unless it was taken; one refused for its rate limit
        (``limited``) takes none, but is charged its large body."""
        with contextlib.suppress(RateLimited):  # the last token went to another meanwhile
            try:
                self.service.deps.limiter.settle(self.service.store, admission, limited)
            except Exception:
                log.exception("a refused transaction's rate-limit token could not be taken")
        admission.taken = True

    def _refused(self, exc: BaseException, account: Account, envelope: Transaction) -> Reply:
        reply = reply_for(exc)
        metrics.SUBMISSION_MESSAGES.labels(_outcome(reply)).inc()
        if log.isEnabledFor(logging.INFO):
            log.info(
                "MAIL refused %d %s account=%s",
                reply.code,
                reply.status,
                account.principal.account_id,
                extra={
                    "status": reply.code,
                    "account": account.principal.account_id,
                    "reply": reply.text,
                },
            )
        return reply


def _declared_size(options: list[str]) -> int:
    """The size of the message as ``MAIL FROM`` declared it (``SIZE=``, RFC 1870), or 0."""
    for option in options:
        name, _, value = option.partition("=")
        if name == "SIZE" and value.isdigit():
            return int(value)
    return 0


def _with_message_id(request: SendRequest, message_id: str | None) -> SendRequest:
    return request if message_id is None else replace(request, message_id=message_id)


def _outcome(reply: Reply) -> str:
    return "accepted" if reply.accepted else "deferred" if reply.temporary else "refused"


def _log_message(session: Login, envelope: Transaction, reply: Reply, email_id: str | None) -> None:
    """The access log's line of one message: its account, email, recipients and outcome."""
    if not log.isEnabledFor(logging.INFO):
        return
    account = session.account
    account_id = account.principal.account_id if account is not None else None
    milliseconds = (time.perf_counter() - envelope.started) * 1000
    log.info(
        "message %d %s %.1fms account=%s email=%s recipients=%d",
        reply.code,
        reply.status,
        milliseconds,
        account_id or "-",
        email_id or "-",
        len(envelope.rcpt_tos),
        extra={
            "status": reply.code,
            "duration_ms": round(milliseconds, 2),
            "account": account_id,
            "email": email_id,
            "recipients": len(envelope.rcpt_tos),
            "peer": session.peer[0] if isinstance(session.peer, tuple) else None,
            **({} if reply.accepted else {"reply": reply.text}),
        },
    )


async def _password(server: Any, args: list[str]) -> str | None:
    """The password of an AUTH PLAIN or LOGIN exchange, or None when the client's answer was
    refused (the reply is sent)."""
    mechanism = args[0].upper()
    if mechanism == "PLAIN":
        if len(args) == 2:
            answer: Any = _decoded(args[1])
            if answer is None:
                await server.push("501 5.5.2 cannot decode base64")
                return None
        else:
            answer = await server.challenge_auth("")
            if answer is MISSING:
                return None
        parts = answer.split(b"\x00")
        if len(parts) != 3:
            await server.push("501 5.5.2 AUTH PLAIN is authzid NUL user NUL password")
            return None
        password = parts[2]
    else:  # LOGIN
        if len(args) == 2:
            if _decoded(args[1]) is None:
                await server.push("501 5.5.2 cannot decode base64")
                return None
        else:
            user = await server.challenge_auth("Username:")
            if user is MISSING:
                return None
        password = await server.challenge_auth("Password:")
        if password is MISSING:
            return None
    try:
        return str(password.decode("ascii"))
    except UnicodeDecodeError:
        return ""  # no API key, then


def _decoded(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
