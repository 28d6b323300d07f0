"""`GET /docs`: Swagger UI for the node's OpenAPI document, served by the node itself.

FastAPI's own `/docs` and `/redoc` pages load their scripts and styles from a public CDN, so on a
controller host without Internet access (the usual case) they render blank. The Swagger UI files
come from the `fastapi-offline` package instead (Swagger UI 5: FastAPI's documents are OpenAPI
3.1), under `/docs/static/`; only the three the page uses are served. Both paths are public, as
`/openapi.json` is: the page holds no data, and a call made from it carries the bearer token typed
into its "Authorize" dialog.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from starlette.exceptions import HTTPException

SWAGGER_UI_DIR = resources.files("fastapi_offline") / "static"

STATIC_PREFIX = "/docs/static/"
# file -> media type: what the page loads
STATIC_FILES = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
                "favicon.png": "image/png"}


def api_docs_router(title: str = "Electra controller API") -> APIRouter:
    router = APIRouter()

    @router.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=title,
                                   swagger_js_url=STATIC_PREFIX + "swagger-ui-bundle.js",
                                   swagger_css_url=STATIC_PREFIX + "swagger-ui.css",
                                   swagger_favicon_url=STATIC_PREFIX + "favicon.png")

    @router.get(STATIC_PREFIX + "{file}", include_in_schema=False)
    async def static(file: str):
        media_type = STATIC_FILES.get(file)
        if media_type is None:
            raise HTTPException(404)  # the API's one "no such endpoint" answer (api/app.py)
        return FileResponse(str(SWAGGER_UI_DIR / file), media_type=media_type,
                            headers={"Cache-Control": "public, max-age=86400"})

    return router
