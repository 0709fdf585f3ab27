"""The console's ASGI application: one AsyncAdminClient shared by every page, the page modules'
routes, the static files, and read-only mode."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from strom.client.admin import AsyncAdminClient
from strom.client.config import ADMIN, ConfigKey
from strom.client.errors import KafkaException

HERE = Path(__file__).parent
# Each module in strom.console.pages has ``routes`` (its Starlette routes) and ``NAV`` (the
# label of its entry in the navigation bar, or None), in the order the bar shows them.
PAGES = ("cluster", "topics", "messages", "groups", "pipelines", "transactions")
# Methods that only read. In read-only mode every other request is refused, unless its route
# is named in ``READ_ONLY_SAFE`` (a search is a POST that writes nothing).
READING_METHODS = frozenset({"GET", "HEAD"})
READ_ONLY_SAFE: set[str] = set()


@dataclass
class ConsoleConfig:
    bootstrap_servers: str
    read_only: bool = False
    # Any further client configs (security.protocol, sasl.*, ...) for the console's clients.
    client_config: dict[str, str] = field(default_factory=dict)

    def client(self, definitions: tuple[ConfigKey, ...], **overrides: Any) -> dict[str, Any]:
        """The config for one of the console's clients, of the keys ``definitions`` (ADMIN,
        PRODUCER, CONSUMER) holds: the command line gives admin configs, such as
        default.api.timeout.ms, that a producer refuses."""
        names = {key.name for key in definitions}
        given = {name: value for name, value in self.client_config.items() if name in names}
        return {"bootstrap.servers": self.bootstrap_servers, **given, **overrides}


@dataclass
class Console:
    """What the pages share, as ``request.app.state.console``."""

    config: ConsoleConfig
    templates: Jinja2Templates
    admin: AsyncAdminClient
    # What pages started in the background (a lag sampler, ...): awaited when the console stops.
    on_close: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def render(self, request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
        return self.templates.TemplateResponse(request, template, context, status_code=status_code)


def console(request: Request) -> Console:
    found: Console = request.app.state.console
    return found


class ReadOnly(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        state: Console = request.app.state.console
        if state.config.read_only and request.method not in READING_METHODS:
            # Middleware runs before routing: find the route that would serve this request.
            name = None
            for candidate in request.app.routes:
                match, _ = candidate.matches(request.scope)
                if match == Match.FULL:
                    name = getattr(candidate, "name", None)
                    break
            if name not in READ_ONLY_SAFE:
                return state.render(
                    request, "read_only.html", status_code=403, method=request.method, path=request.url.path
                )
        return await call_next(request)


def page_routes() -> tuple[list[BaseRoute], list[tuple[str, str]]]:
    routes: list[BaseRoute] = []
    nav: list[tuple[str, str]] = []
    for name in PAGES:
        module = importlib.import_module(f"strom.console.pages.{name}")
        routes.extend(module.routes)
        if module.NAV is not None:
            nav.append((module.NAV, f"/{name}"))
    return routes, nav


def create_app(config: ConsoleConfig) -> Starlette:
    templates = Jinja2Templates(directory=HERE / "templates")
    routes, nav = page_routes()
    templates.env.globals.update(nav=nav, read_only=config.read_only, bootstrap=config.bootstrap_servers)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        admin = AsyncAdminClient(config.client(ADMIN, **{"client.id": "strom-console"}))
        app.state.console = Console(config=config, templates=templates, admin=admin)
        try:
            yield
        finally:
            for close in app.state.console.on_close:
                await close()
            await admin.close()

    async def home(request: Request) -> Response:
        return RedirectResponse("/cluster")

    async def cluster_error(request: Request, exc: Exception) -> Response:
        """What a page could not get from the cluster (unreachable, timed out, refused): a page
        saying so, not a bare 500; a live fragment keeps what it shows (console.js)."""
        message = str(exc) or type(exc).__name__
        if request.headers.get("x-fragment") == "1":
            return PlainTextResponse(message, status_code=503)
        return console(request).render(request, "cluster_error.html", status_code=503, message=message)

    return Starlette(
        routes=[
            Route("/", home),
            *routes,
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        middleware=[Middleware(ReadOnly)],
        exception_handlers={KafkaException: cluster_error},
        lifespan=lifespan,
    )
