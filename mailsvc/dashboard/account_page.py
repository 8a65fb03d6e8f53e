"""The account: credit, rate limits, and its last 14 days as an SVG chart drawn here and a
table of the same numbers."""

from __future__ import annotations

from typing import Any

from werkzeug.wrappers import Request, Response

from ..routes import (
    GET_ACCOUNT,
)
from ..store import OUTCOMES
from ..timestamps import iso_time
from .pages import Dashboard
from .sessions import SignedIn

#: The chart's series: the outcomes the store counts a day (see ``Reads.daily_outcomes``).
SERIES = OUTCOMES


CHART_DAYS = 14


def account(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    shown = dash.service.act(signed_in.record.key_id, GET_ACCOUNT)
    today = int(dash.service.clock() // 86400) * 86400
    since = today - 86400 * (CHART_DAYS - 1)
    counted = dash.service.store.reads.daily_outcomes(shown["id"], since, CHART_DAYS)
    days = [
        {
            "date": str(iso_time(since + 86400 * number))[:10],
            **{name: day.get(name, 0) for name in SERIES},
        }
        for number, day in enumerate(counted)
    ]
    return dash.render("account.html", signed_in=signed_in, account=shown, days=days,
                       chart=_chart(days))  # fmt: skip


def _chart(days: list[dict[str, Any]]) -> dict[str, Any]:
    """The bars of the chart, drawn on the server: a group of four a day, to scale."""
    width, height, group = 700, 180, 50
    top = max([1] + [day[name] for day in days for name in SERIES])
    bars = []
    for number, day in enumerate(days):
        for index, name in enumerate(SERIES):
            tall = round(day[name] / top * (height - 30), 1)
            x = 10 + number * group + index * 10
            bars.append({"x": x, "y": height - 20 - tall, "height": tall, "series": name,
                         "label": f"{day['date']}: {day[name]} {name}"})  # fmt: skip
    labels = [
        {"x": 10 + number * group, "text": day["date"][5:]} for number, day in enumerate(days)
    ]
    return {"width": width, "height": height, "bars": bars, "labels": labels, "top": top,
            "series": list(SERIES)}  # fmt: skip
