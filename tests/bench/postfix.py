"""A private Postfix instance for the benchmark's P case: it listens on a loopback port and
relays everything to the sink. Its own configuration, queue and log live in a folder of the
benchmark's; the machine's own Postfix configuration is neither read nor changed.

For the Pdkim case, a private OpenDKIM (Debian's ``opendkim``, as a milter on a Unix socket,
as Debian sets it up) signs each message as Postfix takes it, with the key and selector
mailsvc signs with: the work a Postfix that sends an application's mail does, which mailsvc
does too.

Postfix's defaults stand except where a private loopback relay needs otherwise: every queue
file is fsynced before the 250, as Postfix always does; the SMTP client caches connections on
demand; at most 20 deliveries run in parallel to the one destination.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from ..servers import cpu_seconds, free_port, proc_stat, process_tree

# One line per service Postfix needs to relay; none of them chrooted (the folder is private).
_MASTER_CF = """\
127.0.0.1:{port} inet n - n - - smtpd
pickup unix n - n 60 1 pickup
cleanup unix n - n - 0 cleanup
qmgr unix n - n 300 1 qmgr
rewrite unix - - n - - trivial-rewrite
bounce unix - - n - 0 bounce
defer unix - - n - 0 bounce
trace unix - - n - 0 bounce
verify unix - - n - 1 verify
flush unix n - n 1000? 0 flush
proxymap unix - - n - - proxymap
smtp unix - - n - - smtp
relay unix - - n - - smtp
showq unix n - n - - showq
error unix - - n - - error
retry unix - - n - - error
discard unix - - n - - discard
anvil unix - - n - 1 anvil
scache unix - - n - 1 scache
postlog unix-dgram n - n - 1 postlogd
"""

_MAIN_CF = """\
compatibility_level = 3.6
queue_directory = {folder}/spool
data_directory = {folder}/data
meta_directory = /etc/postfix
mail_owner = postfix
setgid_group = postdrop
myhostname = bench.localhost
mydestination =
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
smtpd_relay_restrictions = permit_mynetworks, reject
relayhost = [127.0.0.1]:{relay_port}
smtp_dns_support_level = disabled
alias_maps =
alias_database =
local_recipient_maps =
maillog_file_prefixes = {folder}
maillog_file = {folder}/maillog
"""

_MILTER_CF = """\
smtpd_milters = unix:{socket}
non_smtpd_milters =
milter_default_action = tempfail
"""

# relaxed/relaxed and rsa-sha256, as mailsvc signs; OpenDKIM's default header list.
_OPENDKIM_CONF = """\
Mode s
Domain {domain}
Selector {selector}
KeyFile {key_file}
Canonicalization relaxed/relaxed
SignatureAlgorithm rsa-sha256
Socket local:{socket}
UMask 000
RequireSafeKeys false
Syslog no
"""


def available(signing: bool = False) -> str | None:
    """Why the P case (``signing``: the Pdkim case) cannot run here, or None when it can."""
    if not shutil.which("postfix"):
        return "not installed"
    if os.geteuid() != 0:
        return "needs root"  # Postfix's master runs as root and hands its queue to 'postfix'
    if signing and not shutil.which("opendkim"):
        return "OpenDKIM not installed"
    return None


class OpenDkim:
    """``opendkim -f`` signing as ``domain`` with ``selector`` and the PEM key, on a Unix
    socket, until :meth:`stop`.

    Not on a loopback port: there, every message of a connection waited about 90 ms (a
    delayed ACK of the milter's small writes), so one connection took 11 messages a second.
    """

    def __init__(self, folder: Path, domain: str, selector: str, private_pem: str) -> None:
        self.folder = folder / "opendkim"
        self.socket = self.folder / "opendkim.sock"
        self.domain, self.selector, self.private_pem = domain, selector, private_pem
        self.log = self.folder / "opendkim.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> OpenDkim:
        self.folder.mkdir(parents=True, exist_ok=True)
        key_file = self.folder / "key.pem"
        key_file.write_text(self.private_pem)
        key_file.chmod(0o600)
        conf = self.folder / "opendkim.conf"
        conf.write_text(
            _OPENDKIM_CONF.format(
                domain=self.domain, selector=self.selector, key_file=key_file, socket=self.socket
            )
        )
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                ["opendkim", "-f", "-x", str(conf)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"OpenDKIM did not start:\n{self.log.read_text()}")
            time.sleep(0.1)
        # Postfix's smtpd, as the 'postfix' user, must reach the socket.
        for folder in (self.folder, *self.folder.parents):
            if folder == Path("/tmp") or folder == Path(tempfile.gettempdir()):
                break
            folder.chmod(0o755)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)


class Postfix:
    """``postfix -c FOLDER/etc start`` relaying to ``127.0.0.1:relay_port``."""

    def __init__(self, folder: Path, relay_port: int, milter: Path | None = None) -> None:
        self.folder = folder / "postfix"
        self.port = free_port()
        self.relay_port = relay_port
        self.milter = milter

    def version(self) -> str:
        return subprocess.run(
            ["postconf", "-c", str(self.folder / "etc"), "-h", "mail_version"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    def start(self) -> Postfix:
        for part in ("etc", "spool", "data"):
            (self.folder / part).mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder.parent, 0o755)  # the 'postfix' user must reach its own folders
        shutil.chown(self.folder / "data", "postfix")
        main_cf = _MAIN_CF.format(folder=self.folder, relay_port=self.relay_port)
        if self.milter is not None:
            main_cf += _MILTER_CF.format(socket=self.milter)
        (self.folder / "etc" / "main.cf").write_text(main_cf)
        (self.folder / "etc" / "master.cf").write_text(_MASTER_CF.format(port=self.port))
        self._control("start")
        deadline = time.monotonic() + 30
        while not _listening(self.port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"Postfix did not start:\n{self.log()}")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        self._control("stop")

    def cpu_seconds(self) -> float:
        """The CPU time (user and system) of the instance so far: its master's, its live
        children's, and that of the children it has reaped (Postfix starts a process when work
        comes and lets it go when idle)."""
        master = int((self.folder / "spool" / "pid" / "master.pid").read_text().split()[0])
        fields = proc_stat(master)
        reaped = (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime
        return cpu_seconds(process_tree(master)) + reaped

    def log(self) -> str:
        path = self.folder / "maillog"
        return path.read_text() if path.exists() else ""

    def _control(self, command: str) -> None:
        # Postfix writes its errors to the log file (and to a terminal only, never to a pipe).
        result = subprocess.run(
            ["postfix", "-c", str(self.folder / "etc"), command], capture_output=True
        )
        if result.returncode != 0:
            raise RuntimeError(f"postfix {command} failed:\n{self.log()}")


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0
