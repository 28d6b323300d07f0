"""Server-sent event streams that hold a slot (a watcher's, a dashboard viewer's) and give it back.

A stream's generator may never start: Starlette cancels the response when the client is gone
before its first chunk, and a generator that never ran never runs its `finally`. So the slot is
released by the response, however it ends.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from electra.state.codes import Code


class EventStream(StreamingResponse):
    """`text/event-stream` of `body`; `release()` runs once the response ends, whatever ended it."""

    def __init__(self, body, release: Callable[[], None], headers: dict[str, str] | None = None) -> None:
        super().__init__(body, media_type="text/event-stream", headers=headers)
        self.release = release

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()


def refuse_http10(request: Request) -> JSONResponse | None:
    """505 for an HTTP/1.0 client, None for the others.

    A stream has no length, so it is sent chunked, and an HTTP/1.0 client cannot read a chunked body
    (RFC 9112 forbids sending it one); the server could only end such a stream by closing the connection,
    which uvicorn does not do. Asked before a slot is taken.
    """
    if request.scope.get("http_version") != "1.0":
        return None
    return JSONResponse({"code": int(Code.REQUEST_CODE_NOT_SUPPORTED),
                         "remark": "this stream needs HTTP/1.1 (an HTTP/1.0 client cannot read its chunked body)"},
                        status_code=505)
