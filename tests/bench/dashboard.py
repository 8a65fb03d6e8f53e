"""The dashboard's pages at a million emails: the time the app takes to answer each (server
time, the WSGI call in-process, one thread), beside the API request it makes.

    python -m tests.bench.dashboard [--emails 1000000] [--requests 50]

The store is filled as the full bench's H2M case fills it (:func:`.scale.fill`: one account,
its emails created over the last 30 days, each with a recipient and two tags). Each page and each
API route is asked ``--requests`` times, interleaved; the report gives the median and p99 in ms.
Not a test: run it by hand; numbers are for this machine.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from werkzeug.test import Client

from mailsvc import create_app

from . import scale
from .parts import DOMAIN, percentile, prepare

LOOPBACK = {"REMOTE_ADDR": "127.0.0.1"}


def signed_in(app, key: str) -> Client:
    browser = Client(app)
    form = browser.get("/dashboard", environ_base=LOOPBACK).get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', form).group(1)
    answered = browser.post(
        "/dashboard/sign-in", data={"key": key, "csrf_token": token},
        headers={"Origin": "http://localhost"}, environ_base=LOOPBACK,
    )  # fmt: skip
    assert answered.status_code == 303, answered.get_data(as_text=True)
    return browser


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--emails", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mailsvc-bench-dashboard-"))
    try:
        database = str(folder / "million.sqlite3")
        account_id, key = prepare(database)
        filled = scale.fill(database, account_id, DOMAIN, args.emails)
        print(f"filled {filled.count} emails in {filled.seconds:.0f} s", flush=True)
        app = create_app({"database": database, "store_min_free_mb": 0})
        browser, api = signed_in(app, key), Client(app)
        headers = {"Authorization": f"Bearer {key}"}
        middle = filled.middle_id
        cases = {
            "page /emails": (browser, "/dashboard/emails", {}),
            "API  /v1/emails": (api, "/v1/emails", headers),
            "page /emails?to=": (browser, "/dashboard/emails?to=user7@example.org", {}),
            "API  /v1/emails?to=": (api, "/v1/emails?to=user7@example.org", headers),
            "page /emails?tag=": (browser, "/dashboard/emails?tag=plan:p7", {}),
            "API  /v1/emails?tag=": (api, "/v1/emails?tag=plan:p7", headers),
            "page /emails/{id}": (browser, f"/dashboard/emails/{middle}", {}),
            "API  /v1/emails/{id}": (api, f"/v1/emails/{middle}", headers),
            "page /account (chart)": (browser, "/dashboard/account", {}),
            "API  /v1/account": (api, "/v1/account", headers),
            "page /domains": (browser, "/dashboard/domains", {}),
            "page /keys": (browser, "/dashboard/keys", {}),
        }
        timings: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.requests):
            for name, (client, path, extra) in cases.items():
                started = time.perf_counter()
                answered = client.get(path, headers=extra, environ_base=LOOPBACK)
                timings[name].append((time.perf_counter() - started) * 1000)
                assert answered.status_code == 200, (name, answered.status_code)
        print(f"{'case':<24} {'median ms':>10} {'p99 ms':>8}")
        for name, values in timings.items():
            median = statistics.median(values)
            print(f"{name:<24} {median:>10.1f} {percentile(values, 0.99):>8.1f}")
        app.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
