"""The cluster page (to be written in this issue)."""

from starlette.routing import BaseRoute

NAV: str | None = "Cluster"
routes: list[BaseRoute] = []
