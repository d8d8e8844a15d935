"""Learned packs over the socket: export what this daemon learned, import what another one did.

Import writes (tool files, rows, an event, the vector index), and while the
daemon runs it owns the store, so `evolver import` goes through here then. The
pack travels as base64 in JSON, inside ``[advanced.daemon] max_body_bytes`` (a bigger
one is refused with 413, before anything reads it). The import holds the
synthesize job's lock while it vets and registers tools, so a round of tool
synthesis cannot pick the same version number beside it.
"""

from __future__ import annotations

import base64
import binascii

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from ..meta import packs
from .errors import error_response
from .models import errors

__all__ = ["ImportIn", "router"]

router = APIRouter(tags=["packs"])

LOCK_WAIT_S = 300.0  # how long an import waits for a running round of tool synthesis


class ImportIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    pack: str = Field(
        max_length=(packs.MAX_PACK_BYTES * 4) // 3 + 4,
        description="The pack file (`evolver export` writes it), in base64.",
    )
    expect: str | None = Field(
        default=None,
        max_length=200,  # what is wrong with it, read_pack says
        description="Refuse the pack unless its id is this, whole: the 64 hex digits its "
        "author published (a prefix is refused).",
    )


def _daemon(request: Request):
    return request.app.state.daemon


@router.get(
    "/export",
    summary="A pack of what this daemon learned: active insights, tools, a node's scaffold",
    responses=errors(404, 422, 503),
)
def export(
    request: Request,
    insights: bool = False,
    tools: bool = False,
    node: str | None = Query(default=None, min_length=1, max_length=200),
) -> dict:
    daemon = _daemon(request)
    try:
        return packs.export_json(daemon.store, daemon.config.model.name, insights=insights, tools=tools, node=node)
    except packs.PackError as exc:
        return error_response(422, "nothing_to_export", str(exc))


@router.post(
    "/import",
    summary="Verify a pack, quarantine its tools, and record what passes as one event",
    responses=errors(400, 409, 413, 422, 503),
)
def import_pack(body: ImportIn, request: Request) -> dict:
    try:
        data = base64.b64decode(body.pack, validate=True)
    except (binascii.Error, ValueError):
        return error_response(422, "invalid_pack", "the pack is not base64", "pack")
    jobs = _daemon(request).jobs
    job = jobs.jobs.get("synthesize")
    if job is not None and not job.lock.acquire(timeout=LOCK_WAIT_S):
        return error_response(
            409,
            "conflict",
            f"a round of tool synthesis has been running for {LOCK_WAIT_S:.0f} s; import the pack again later",
        )
    try:
        return packs.import_pack(jobs.host.engine, data, expect=body.expect)
    except packs.PackError as exc:
        return error_response(422, "invalid_pack", str(exc), "pack")
    finally:
        if job is not None:
            job.lock.release()
