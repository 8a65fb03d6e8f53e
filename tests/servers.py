"""Real gunicorn processes for the tests, booted with the project's gunicorn.conf.py."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Gunicorn:
    """``gunicorn -c gunicorn.conf.py -w N -b 127.0.0.1:PORT`` with ``MAILSVC_*`` settings."""

    def __init__(self, settings: dict[str, str], workers: int = 3) -> None:
        self.port = free_port()
        self.env = {**os.environ, **settings}
        self.workers = workers
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Gunicorn:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "-c",
                "gunicorn.conf.py",
                "-w",
                str(self.workers),
                "-b",
                f"127.0.0.1:{self.port}",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    self.process.stderr.read().decode() if self.process.stderr else ""
                )
            try:
                status, _ = self.request("GET", "/")
                if status == 404:
                    return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("gunicorn did not start")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40.0) -> str:
        """Stop the server; returns what it wrote on stderr."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            _, stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, stderr = self.process.communicate()
        return stderr.decode(errors="replace") if stderr else ""

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            payload = json.dumps(body) if body is not None else None
            all_headers = {"Content-Type": "application/json", **(headers or {})}
            connection.request(method, path, body=payload, headers=all_headers)
            response = connection.getresponse()
            data = response.read()
            return response.status, json.loads(data) if data else None
        finally:
            connection.close()

    def many(
        self, requests: list[tuple[str, str, Any, dict[str, str]]], concurrency: int = 20
    ) -> list[tuple[int, Any]]:
        with ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(lambda r: self.request(*r), requests))
