"""The benchmark's report: a column a round, then the median of the rounds, which is what a
target is held to (issue 16's; D1 / D0, E2E / Pdkim and the PostgreSQL ratios, issues 33's and
34's)."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """A figure of the report: its value in a round (None: not measured), and its target."""

    name: str
    value: Callable[[dict], float | None]
    target: str = ""
    met: Callable[[float], bool] | None = None


def _relay(figure: str, case: str = "relay") -> Callable[[dict], float | None]:
    return lambda r: None if "skipped" in r[case] else r[case][figure]


def _postgres(figure: Callable[[dict], float]) -> Callable[[dict], float | None]:
    return lambda r: None if "skipped" in r["postgres"] else figure(r)


def _versus_postfix(case: str) -> Callable[[dict], float | None]:
    return lambda r: None if "skipped" in r[case] else r["http"]["E2E"][0] / r[case]["E2E"]


def _at_least(floor: float) -> tuple[str, Callable[[float], bool]]:
    return f">= {floor:g}", lambda v: v >= floor


def _at_most(ceiling: float) -> tuple[str, Callable[[float], bool]]:
    return f"<= {ceiling:g}", lambda v: v <= ceiling


def _read(name: str) -> Callable[[dict], float]:
    return lambda r: r["large"]["reads"][name]


ROWS = [
    Row("H1 no-op app, requests/s", lambda r: r["http"]["H1"]),
    Row("H2 accept, 1 recipient, emails/s", lambda r: r["http"]["H2"]),
    Row("H2 accept, 5 recipients, emails/s", lambda r: r["http"]["H2x5"]),
    Row("H2 / H1", lambda r: r["http"]["H2"] / r["http"]["H1"], *_at_least(0.25)),
    Row("H2down accept, relay down, emails/s", lambda r: r["more"]["down"]),
    Row("H2down / H1", lambda r: r["more"]["down"] / r["http"]["H1"], *_at_least(0.5)),
    Row("B batch accept (100/req), emails/s", lambda r: r["more"]["batch"]),
    Row("B / H2", lambda r: r["more"]["batch"] / r["http"]["H2"], *_at_least(8)),
    Row("accept latency p50 ms", lambda r: r["http"]["latency"][0]),
    Row("accept latency p99 ms", lambda r: r["http"]["latency"][1]),
    Row("accept-to-handoff p50 ms", lambda r: r["http"]["handoff"][0]),
    Row("accept-to-handoff p99 ms", lambda r: r["http"]["handoff"][1]),
    Row("D0 raw smtplib, msgs/s", lambda r: r["drain"]["D0"]),
    Row("D1 mailsvc drain, msgs/s", lambda r: r["drain"]["D1"]),
    Row("D1 / D0", lambda r: r["drain"]["D1"] / r["drain"]["D0"], *_at_least(0.5)),
    Row("E2E mailsvc end to end, msgs/s", lambda r: r["http"]["E2E"][0]),
    Row("P Postfix accept, msgs/s", _relay("accept")),
    Row("P Postfix end to end, msgs/s", _relay("E2E")),
    Row("E2E / P (mailsvc / Postfix)", _versus_postfix("relay"), *_at_least(1.0)),
    Row("Pdkim Postfix+OpenDKIM e2e, msgs/s", _relay("E2E", "signing")),
    Row("E2E / Pdkim", _versus_postfix("signing"), *_at_least(2.5)),
    Row("H2M accept, 1M in store, emails/s", lambda r: r["large"]["accept"]),
    Row("H2M / H2", lambda r: r["large"]["accept"] / r["http"]["H2"], *_at_least(0.9)),
    Row("GET ?to= p99 ms, 1M", _read("to"), *_at_most(20)),
    Row("GET ?tag= (1 in 3) p99 ms, 1M", _read("tag"), *_at_most(20)),
    Row("GET ?tag= (1 in 1000) p99 ms", _read("rare tag"), *_at_most(20)),
    Row("GET /v1/emails/{id} p99 ms, 1M", _read("id"), *_at_most(20)),
    Row("claim, 10 due, ms", lambda r: r["claim"]["small"] * 1000),
    Row("claim, 100,000 due, ms", lambda r: r["claim"]["large"] * 1000),
    Row("claim 100k / 10", lambda r: r["claim"]["large"] / r["claim"]["small"], *_at_most(2)),
    Row("quiet accept p99 ms", lambda r: r["more"]["quiet"]),
    Row("accept p99, noisy's burst, ms", lambda r: r["more"]["burst"]),
    Row("accept p99 beside noisy ms", lambda r: r["more"]["noisy"]),
    Row("noisy / quiet p99", lambda r: r["more"]["noisy"] / r["more"]["quiet"], *_at_most(2)),
    Row("H2pg accept on PostgreSQL", _postgres(lambda r: r["postgres"]["H2"])),
    Row("H2pg / H2", _postgres(lambda r: r["postgres"]["H2"] / r["http"]["H2"]), *_at_least(0.8)),
    Row("E2Epg end to end on PostgreSQL", _postgres(lambda r: r["postgres"]["E2E"][0])),
    Row(
        "E2Epg / E2E",
        _postgres(lambda r: r["postgres"]["E2E"][0] / r["http"]["E2E"][0]),
        *_at_least(0.8),
    ),
    Row("RSS per worker MB", lambda r: max(r["http"]["rss"]), *_at_most(45)),
    Row("PSS per worker MB", lambda r: max(r["http"]["pss"]), *_at_most(30)),
]


def report(args, rounds: list[dict]) -> None:
    print(
        f"mailsvc benchmark -- {platform.node()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, gunicorn -w {args.workers} (gunicorn.conf.py), "
        f"{len(rounds)} rounds, load: wrk (peak) + open-loop asyncio client"
    )
    heads = [f"round {n}" for n in range(1, len(rounds) + 1)] + ["median", "target", "met"]
    print(f"{'figure':<36}" + "".join(f"{head:>9}" for head in heads))
    for row in ROWS:
        values = [row.value(r) for r in rounds]
        measured = [v for v in values if v is not None]
        middle = statistics.median(measured) if measured else None
        met = "" if row.met is None or middle is None else ("yes" if row.met(middle) else "no")
        cells = [_cell(v) for v in (*values, middle)] + [row.target, met]
        print(f"{row.name:<36}" + "".join(f"{cell:>9}" for cell in cells))
    print("(RSS and PSS: the largest worker's, after the open-loop run)")
    for number, r in enumerate(rounds, start=1):
        _round_notes(args, number, r)


def _round_notes(args, number: int, r: dict) -> None:
    http, relay, more, large = r["http"], r["relay"], r["more"], r["large"]
    postfix_said = relay["skipped"] if "skipped" in relay else f"Postfix {relay['version']}"
    if "skipped" in r["signing"]:
        postfix_said += f"; Pdkim skipped: {r['signing']['skipped']}"
    if "skipped" in r["postgres"]:
        print(f"round {number}: PostgreSQL skipped: {r['postgres']['skipped']}")
    print(
        f"round {number}: open loop at {http['rate']:.0f}/s, {http['errors']} errors, "
        f"{http['handoff'][2]} of {http['handoff'][3]} accepted emails matched at the "
        f"sink; E2E {http['E2E'][1]} emails; D0/D1 {r['drain']['threads']} threads, "
        f"{args.drain} emails; P: {postfix_said}"
    )
    print(
        f"round {number}: noisy neighbour: the other account's open loop at "
        f"{more['noise_rate']:.0f}/s ({more['noisy_errors']} not 200); the noisy account was "
        f"answered {more['noise_answers']}; 1M store: {large['emails']} emails, read errors "
        f"{large['read_errors']}"
    )
    if "soak" in http:
        before, after, count = http["soak"]
        sizes = ", ".join(f"{b:.1f} -> {a:.1f}" for b, a in zip(before, after, strict=True))
        print(f"round {number}: RSS per worker over {count:.0f} more requests: {sizes} MB")


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:.0f}"
