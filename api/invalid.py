"""The one shape of a 422: code 2005, a remark naming the first bad fields, and every field with its problem.

The node's application (api/app.py) and the ingest workers (api/ingest.py, api/sessions.py) answer an invalid
request with it, so a broker reads `errors[].field` alike from both; the value sent is never repeated."""

from __future__ import annotations

from electra.state.codes import Code

SEND_JSON = "send the body as JSON (Content-Type: application/json)"  # a 415's remark, on every server


def is_json_media(content_type: str | None) -> bool:
    """Whether a Content-Type says JSON: `application/json` or `application/*+json`, parameters (a charset) aside.
    Without one a body is not read (a browser sends one cross-site without asking the server first)."""
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def invalid_request(errors: list[dict[str, str]]) -> dict:
    """The body of a 422 for `errors` ([{"field": "body.brokerId", "problem": "..."}, ...])."""
    remark = "invalid request: " + "; ".join(f"{e['field']}: {e['problem']}" for e in errors[:3])
    return {"code": int(Code.CONTROLLER_INVALID_REQUEST), "remark": remark, "errors": errors}


def invalid_body_field(message: str) -> dict:
    """A rule's message `"<key>: <problem>"` (streaming/records.py's InvalidHeartbeat) as one error of the body:
    `body.<key>`, or `body` itself for a message about the whole body."""
    key, _, problem = message.partition(": ")
    if not problem:
        return {"field": "body", "problem": message}
    return {"field": "body" if key == "body" else f"body.{key}", "problem": problem}
