"""Pages served by ``dq serve`` itself: the dashboard at ``/ui/`` and Swagger UI at ``/docs``.

A browser opening the server's bare address (``GET /`` asking for HTML) is sent to the
dashboard; ``/`` itself belongs to SQS's ``POST`` (``server/sqs``), so any other ``GET /``
still answers 405, as it did before the redirect existed.

Everything comes from installed packages, never from a CDN: the dashboard's HTML, CSS and
ES modules are package data of ``server/ui/`` (hand-written, no build step), and Swagger
UI's files come from the ``swagger-ui-bundle-v2`` package. Invariant: these pages hold no
data; with ``DQ_TOKENS`` set they only show a sign-in form until the browser holds a
token, since every figure they show comes from /v1 routes that require one. The OpenAPI
document declares the bearer scheme on every /v1 route so Swagger UI's "Authorize" works.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from dq.server.errors import error_response

__all__ = ["BEARER", "UI_DIR", "install_pages", "wants_html"]

UI_DIR = Path(__file__).with_name("ui")
BEARER = "HTTPBearer"
_BEARER_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "a token from DQ_TOKENS (needed only when the server has tokens set)",
}


def install_pages(app: FastAPI) -> None:
    """Mount the dashboard, the local Swagger UI and the bearer-aware OpenAPI document."""
    from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

    app.mount("/ui/", StaticFiles(directory=UI_DIR, html=True), name="ui")

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def root(request: Request) -> Response:
        # Only SQS's POST is served at "/": a browser is sent to the dashboard, anything
        # else (curl, a health probe) gets the 405 it got before this route existed.
        if wants_html(request.headers.get("accept", "")):
            return RedirectResponse("/ui/", status_code=307)
        return error_response(405, "method_not_allowed", "Method Not Allowed", {"Allow": "POST"})

    app.mount("/docs/assets", StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - API docs",
            swagger_js_url="/docs/assets/swagger-ui-bundle.js",
            swagger_css_url="/docs/assets/swagger-ui.css",
            swagger_favicon_url="/docs/assets/favicon-32x32.png",
            swagger_ui_parameters={"persistAuthorization": True},
        )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = with_bearer(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    description=app.description,
                    routes=app.routes,
                )
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def wants_html(accept: str) -> bool:
    """True when an ``Accept`` header names ``text/html`` with a non-zero quality, as
    every browser's navigation does (``*/*`` alone, curl's default, is not a browser)."""
    for media_range in accept.split(","):
        kind, *params = (part.strip() for part in media_range.split(";"))
        if kind.lower() != "text/html":
            continue
        quality = next((p[2:] for p in params if p.lower().startswith("q=")), "1")
        try:
            return float(quality) > 0
        except ValueError:
            return False
    return False


def with_bearer(doc: dict[str, Any]) -> dict[str, Any]:
    """Declare the bearer scheme and require it on every /v1 operation."""
    schemes = doc.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes.setdefault(BEARER, _BEARER_SCHEME)
    for path, operations in doc.get("paths", {}).items():
        if not path.startswith("/v1/"):
            continue
        for op in operations.values():
            if isinstance(op, dict):
                op.setdefault("security", [{BEARER: []}])
    return doc
