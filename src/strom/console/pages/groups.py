"""The groups page (to be written in this issue)."""

from starlette.routing import BaseRoute

NAV: str | None = "Groups"
routes: list[BaseRoute] = []
