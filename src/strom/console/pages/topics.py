"""The topics page (to be written in this issue)."""

from starlette.routing import BaseRoute

NAV: str | None = "Topics"
routes: list[BaseRoute] = []
