"""`GET /v1/admin/history`: time travel over the tier, served by any node that has a tier configured."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from .reader import TierReader, parse_time


def history_router(uri: str, storage_options: dict[str, str] | None = None) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/admin/history", tags=["admin"])
    async def history(at: Annotated[str, Query(description="ISO-8601 time, epoch ms or `now`")],
                      from_: Annotated[str | None, Query(alias="from")] = None,
                      to: Annotated[str | None, Query()] = None):
        """State of every broker set as of `at`; with `from`/`to`, also the events between those instants."""
        times: dict[str, int | None] = {}
        for param, t in (("at", at), ("from", from_), ("to", to)):
            try:
                times[param] = None if t is None else parse_time(t)
            except ValueError as exc:  # names the parameter, never repeats its value
                return JSONResponse({"code": 400, "remark": f"bad time in `{param}`: {exc}"}, status_code=400)
        reader = TierReader(uri, storage_options)
        try:
            return await asyncio.to_thread(reader.history, times["at"], times["from"], times["to"])
        except Exception as exc:  # the tier is unreachable or empty
            return JSONResponse({"code": 503, "remark": f"tier unavailable: {exc!r}"}, status_code=503)

    return router
