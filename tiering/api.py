"""`GET /v1/admin/history`: time travel over the tier, served by any node that has a tier configured."""

from __future__ import annotations

import asyncio
from typing import Annotated

import msgspec
from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from electra.api.invalid import invalid_request
from electra.state.codes import Code

from .reader import MAX_EVENTS, TierReader, event_window, not_in_future, parse_cursor, parse_time, tier_failure

PAGE_EVENTS = 10_000  # events in one answer unless `limit` asks for more (up to MAX_EVENTS)
_encode = msgspec.json.Encoder().encode


def _invalid(param: str, problem: str) -> JSONResponse:
    """A bad query parameter: the API's 422 (api/invalid.py), as `electra history` refuses it."""
    return JSONResponse(invalid_request([{"field": f"query.{param}", "problem": problem}]), status_code=422)


def history_router(uri: str, storage_options: dict[str, str] | None = None) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/admin/history", tags=["admin"])
    async def history(at: Annotated[str, Query(description="ISO-8601 time, epoch ms or `now`")],
                      from_: Annotated[str | None, Query(alias="from")] = None,
                      to: Annotated[str | None, Query()] = None,
                      limit: Annotated[int | None, Query(ge=1, le=MAX_EVENTS, description=(
                          f"events at most (default {PAGE_EVENTS}, at most {MAX_EVENTS}); with `from` or `to`"))]
                      = None,
                      after: Annotated[str | None, Query(description="page cursor: a truncated answer's "
                                                                     "`events.next_after` (INDEX:SEQ)")] = None):
        """State of every broker set as of `at`; with `from`/`to`, also the events between those instants
        (at most `limit`; `truncated` and `next_after` page through the rest with `after`)."""
        times: dict[str, int | None] = {}
        for param, t in (("at", at), ("from", from_), ("to", to)):
            try:
                times[param] = value = None if t is None else parse_time(t)
                if param == "at" and value is not None:
                    not_in_future(value)  # as `electra history --at`: a future state is not known yet
            except ValueError as exc:  # names the parameter, never repeats its value
                return _invalid(param, str(exc))
        cursor = None
        if after is not None:
            try:
                cursor = parse_cursor(after)
            except ValueError as exc:
                return _invalid("after", str(exc))
        if times["from"] is None and times["to"] is None:
            for param, given, what in (("after", after, "pages through"), ("limit", limit, "caps the")):
                if given is not None:
                    return _invalid(param, f"{what} events: give `from` or `to` too")
        try:
            event_window(times["from"], times["to"])
        except ValueError as exc:
            return _invalid("from", f"{exc} (`from` is after `to`)")
        reader = TierReader(uri, storage_options)

        def answer() -> bytes:
            """Read and encode off the event loop: the node's Raft ticks run there, and encoding a page of
            events with the framework's encoder (pure Python) held the loop for seconds."""
            return _encode(reader.history(times["at"], times["from"], times["to"],
                                          PAGE_EVENTS if limit is None else limit, cursor))

        try:
            return Response(await asyncio.to_thread(answer), media_type="application/json")
        except Exception as exc:  # the tier is unreachable, empty or damaged: its first line, not a repr
            return JSONResponse({"code": int(Code.SYSTEM_ERROR), "remark": f"tier unavailable: {tier_failure(exc)}"},
                                status_code=503, headers={"retry-after": "5"})

    return router
