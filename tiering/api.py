"""`GET /v1/admin/history`: time travel over the tier, served by any node that has a tier configured."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from electra.state.codes import Code

from .reader import MAX_EVENTS, TierReader, event_window, parse_cursor, parse_time, tier_failure


def _invalid(param: str, problem: str) -> JSONResponse:
    """A bad query parameter: the API's 422 (the shape `api/app.py` gives every invalid request)."""
    field = f"query.{param}"
    return JSONResponse({"code": int(Code.CONTROLLER_INVALID_REQUEST), "remark": f"invalid request: {field}: {problem}",
                         "errors": [{"field": field, "problem": problem}]}, status_code=422)


def history_router(uri: str, storage_options: dict[str, str] | None = None) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/admin/history", tags=["admin"])
    async def history(at: Annotated[str, Query(description="ISO-8601 time, epoch ms or `now`")],
                      from_: Annotated[str | None, Query(alias="from")] = None,
                      to: Annotated[str | None, Query()] = None,
                      limit: Annotated[int, Query(ge=1, le=MAX_EVENTS, description="events at most")] = MAX_EVENTS,
                      after: Annotated[str | None, Query(description="page cursor: a truncated answer's "
                                                                     "`events.next_after` (INDEX:SEQ)")] = None):
        """State of every broker set as of `at`; with `from`/`to`, also the events between those instants
        (at most `limit`; `truncated` and `next_after` page through the rest with `after`)."""
        times: dict[str, int | None] = {}
        for param, t in (("at", at), ("from", from_), ("to", to)):
            try:
                times[param] = None if t is None else parse_time(t)
            except ValueError as exc:  # names the parameter, never repeats its value
                return _invalid(param, str(exc))
        cursor = None
        if after is not None:
            try:
                cursor = parse_cursor(after)
            except ValueError as exc:
                return _invalid("after", str(exc))
            if times["from"] is None and times["to"] is None:
                return _invalid("after", "pages through events: give `from` or `to` too")
        try:
            event_window(times["from"], times["to"])
        except ValueError as exc:
            return _invalid("from", f"{exc} (`from` is after `to`)")
        reader = TierReader(uri, storage_options)
        try:
            return await asyncio.to_thread(reader.history, times["at"], times["from"], times["to"], limit,
                                           cursor)
        except Exception as exc:  # the tier is unreachable, empty or damaged: its first line, not a repr
            return JSONResponse({"code": int(Code.SYSTEM_ERROR), "remark": f"tier unavailable: {tier_failure(exc)}"},
                                status_code=503, headers={"retry-after": "5"})

    return router
