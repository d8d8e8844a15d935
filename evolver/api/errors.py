"""The error shape of every answer that is not a success: ``{"error": {"type", "message", "param"}}``.

OpenAI's shape, so its clients read our errors too; the handlers turn
FastAPI's validation and HTTP errors into it, naming the field at fault.
"""

from __future__ import annotations

import json

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

__all__ = ["error_response", "internal_message", "validation_error", "http_error"]


def error_response(status: int, kind: str, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message, "param": param}}, status_code=status)


def internal_message(failed: str, exc: BaseException) -> str:
    """What a client is told of an unexpected failure: its kind, never its text (which may carry paths,
    prompts or a server's reply); the log has the rest."""
    return f"{failed} ({type(exc).__name__}); it keeps serving, and the log has the details"


def _where(loc: tuple) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    for e in errors:
        if e.get("type") == "json_invalid":
            return error_response(
                400, "invalid_json", f"the body is not valid JSON: {e.get('ctx', {}).get('error', e['msg'])}"
            )
    problems = []
    for e in errors:
        if e.get("type") == "extra_forbidden":
            problems.append(f"{_where(e['loc'])}: unknown field")
        elif e.get("type") == "missing" and tuple(e["loc"]) == ("body",):
            problems.append("a JSON body is required")
        else:
            problems.append(f"{_where(e['loc'])}: {e['msg'].removeprefix('Value error, ')}")
    first = _where(errors[0]["loc"]) if errors else None
    return error_response(422, "invalid_request", "; ".join(problems), first)


def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    kind = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    if exc.status_code == 400 and message == "There was an error parsing the body":
        return error_response(400, "invalid_json", "the body could not be parsed: it must be JSON in UTF-8")
    if exc.status_code == 404 and message == "Not Found":
        message = f"there is no route {request.method} {request.url.path}; /openapi.json lists them"
    return error_response(exc.status_code, kind, message)
