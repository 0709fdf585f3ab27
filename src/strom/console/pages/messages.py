"""The messages page (to be written in this issue)."""

from starlette.routing import BaseRoute

NAV: str | None = None
routes: list[BaseRoute] = []
