"""The database clock, which every stored time and every window of the statistics uses."""

from __future__ import annotations

#: The database's ``now()``: the time of the statement's transaction on the server's clock.
DATABASE_NOW = "SELECT now()"
