"""Server-sent event streams that hold a slot (a watcher's, a dashboard viewer's) and give it back.

A stream's generator may never start: Starlette cancels the response when the client is gone
before its first chunk, and a generator that never ran never runs its `finally`. So the slot is
released by the response, however it ends.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi.responses import StreamingResponse


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
