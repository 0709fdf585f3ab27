"""The transactions page (to be written in this issue)."""

from starlette.routing import BaseRoute

NAV: str | None = "Transactions"
routes: list[BaseRoute] = []
