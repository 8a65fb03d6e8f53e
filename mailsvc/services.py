"""What a handler may depend on besides the store: the settings and the clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .settings import Settings


@dataclass(frozen=True)
class Services:
    settings: Settings
    #: Seconds since the epoch; injected so tests move time instead of sleeping.
    clock: Callable[[], float]
