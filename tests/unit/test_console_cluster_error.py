"""The console with no cluster behind it: a page says what the cluster did not answer (503, the
client's error, a way back), not a bare 500; a live fragment answers 503 so console.js keeps what
it shows. The console's real app and admin client, pointed at a port nothing listens on."""

from __future__ import annotations

import asyncio
import socket

import httpx

from strom.console.app import ConsoleConfig, create_app


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_page_whose_cluster_cannot_be_reached_says_so() -> None:
    bootstrap = f"127.0.0.1:{closed_port()}"
    app = create_app(ConsoleConfig(bootstrap, client_config={"default.api.timeout.ms": "300"}))

    async def get_twice() -> tuple[httpx.Response, httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
                page = await client.get("/cluster")
                fragment = await client.get("/cluster", headers={"X-Fragment": "1"})
                return page, fragment

    page, fragment = asyncio.run(get_twice())
    assert page.status_code == 503
    assert "The cluster did not answer this page" in page.text
    assert f"<code>{bootstrap}</code>" in page.text
    assert 'href="/topics"' in page.text  # the navigation is still there
    assert 'class="error">' in page.text and "Internal Server Error" not in page.text

    assert fragment.status_code == 503
    assert fragment.headers["content-type"].startswith("text/plain")
    assert fragment.text and "<" not in fragment.text
