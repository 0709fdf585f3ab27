"""The pipelines page (to be written in this issue)."""

from starlette.routing import BaseRoute

NAV: str | None = "Pipelines"
routes: list[BaseRoute] = []
