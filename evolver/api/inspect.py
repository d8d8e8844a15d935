"""Inspection and steering: health, status, memory, insights, tools, tree, history, jobs, promotion."""

from __future__ import annotations

from dataclasses import asdict
from typing import Literal

from fastapi import APIRouter, Path, Query, Request

from ..meta.probation import approve_insight
from ..meta.revert import revert_event
from ..tree.incumbent import promote as promote_node
from ..tree.incumbent import rollback as rollback_node
from . import views
from .errors import error_response
from .host import Starting
from .learning import curve, learning
from .models import (
    MAX_ID,
    ApproveIn,
    EvolveIn,
    PromoteIn,
    RevertIn,
    RollbackIn,
    SearchIn,
    ToolCallIn,
    errors,
)

router = APIRouter(tags=["inspection"])


def _daemon(request: Request):
    return request.app.state.daemon


def _jobs(request: Request):
    """The job host; 503 while the daemon is still starting (its API answers before the jobs exist)."""
    jobs = _daemon(request).jobs
    if jobs is None:
        raise Starting("the daemon is still starting; its background jobs are not running yet: try again shortly")
    return jobs


@router.get("/health", summary="Whether the daemon answers", responses=errors())
async def health() -> dict:
    return {"ok": True}


@router.get(
    "/status", summary="Queue, workers, budget, incumbent, jobs, and whether it is learning", responses=errors(503)
)
def status(request: Request) -> dict:
    daemon = _daemon(request)
    admitted = getattr(request.app.state, "chat_admission", None)
    return {
        **daemon.status(),
        "learning": learning(daemon.store, daemon.config),
        "chat": {"turns": admitted.turns if admitted else 0, "limit": daemon.config.daemon.chat_queue},
    }


@router.get(
    "/learning/curve",
    summary="Success over time (the person's tasks and the evaluations) and per node",
    responses=errors(422, 503),
)
def learning_curve(
    request: Request, days: float = Query(default=7.0, gt=0, le=366), periods: int = Query(default=28, ge=1, le=500)
) -> dict:
    daemon = _daemon(request)
    return curve(daemon.store, days=days, periods=periods, quantile=daemon.config.evolution.promotion_quantile)


@router.get(
    "/ids/{short}",
    summary="The full id of a task, trajectory or node from a unique prefix of it",
    responses=errors(404, 422, 503),
)
def resolve_id(request: Request, short: str = Path(min_length=1, max_length=200)) -> dict:
    return views.resolve_id(_daemon(request).store, short)


@router.post(
    "/shutdown", status_code=202, summary="Stop the daemon gracefully (as SIGTERM does)", responses=errors(413)
)
def shutdown(request: Request) -> dict:
    _daemon(request).request_stop("asked through the API")
    return {"stopping": True}


@router.post(
    "/memory/search",
    summary="Past trajectories, insights or tools similar to a text",
    responses=errors(400, 413, 422, 503),
)
def memory_search(body: SearchIn, request: Request) -> dict:
    return views.search(
        _daemon(request).store,
        body.text,
        kind=body.kind,
        k=body.k,
        success=body.success,
        node=body.node,
        since_hours=body.since_hours,
    )


@router.get("/insights", summary="Insights, most important first", responses=errors(422, 503))
def insights(
    request: Request,
    status: Literal["active", "probation", "retired", "current", "all"] = "active",
    limit: int = Query(default=100, ge=1, le=1000),
) -> dict:
    return views.insights(_daemon(request).store, status=status, limit=limit)


@router.post(
    "/insights/{insight_id}/approve",
    summary="Approve an insight on probation: from the next task on, "
    "a person's tasks are shown it (recorded as an event, which a revert undoes)",
    responses=errors(400, 404, 409, 413, 422, 503),
)
def approve(body: ApproveIn, request: Request, insight_id: int = Path(ge=1, le=MAX_ID)) -> dict:
    daemon = _daemon(request)
    return asdict(approve_insight(daemon.store, insight_id, cap=daemon.config.evolution.max_insights, why=body.why))


@router.get("/tools", summary="Tools the agent can use: built-in and synthesized", responses=errors(422, 503))
def tools(request: Request, status: Literal["active", "retired", "replaced", "reverted", "all"] = "active") -> dict:
    daemon = _daemon(request)
    return views.tools(daemon.store, status=status, mcp=daemon.mcp_tools())


@router.get(
    "/tools/{name}",
    summary="A synthesized tool: its versions, code, tests, usage and effect",
    responses=errors(404, 422, 503),
)
def tool(request: Request, name: str = Path(min_length=1, max_length=200)) -> dict:
    return views.tool_detail(_daemon(request).store, name)


@router.post(
    "/tools/{name}/call",
    summary="Run an active synthesized tool in the sandbox (outside any task)",
    responses=errors(400, 404, 413, 422, 503),
)
def call_tool(body: ToolCallIn, request: Request, name: str = Path(min_length=1, max_length=200)) -> dict:
    try:
        return _daemon(request).call_tool(name, body.arguments)
    except ValueError as exc:
        return error_response(422, "invalid_arguments", str(exc), "arguments")


@router.get("/tree", summary="The self-modification tree", responses=errors(503))
def tree(request: Request) -> dict:
    daemon = _daemon(request)
    return views.tree(daemon.store, daemon.config.evolution.promotion_quantile)


@router.get(
    "/nodes/{node_id}",
    summary="One node: its scaffold, diff, rationale and evaluations",
    responses=errors(404, 422, 503),
)
def node(node_id: str, request: Request) -> dict:
    return views.node(_daemon(request).store, node_id)


@router.get("/history", summary="Evolution events, newest first", responses=errors(422, 503))
def history(
    request: Request,
    kind: str | None = Query(default=None, max_length=50),
    limit: int = Query(default=100, ge=1, le=1000),
) -> dict:
    return views.history(_daemon(request).store, kind=kind, limit=limit)


@router.get(
    "/history/{event_id}",
    summary="One event: what, why, evidence, and the changes it made",
    responses=errors(404, 422, 503),
)
def event(request: Request, event_id: int = Path(ge=1, le=MAX_ID)) -> dict:
    return views.event_detail(_daemon(request).store, event_id)


@router.post(
    "/history/{event_id}/revert",
    summary="Undo an event's insight or tool changes (recorded as a new event)",
    responses=errors(400, 404, 409, 413, 422, 503),
)
def revert(body: RevertIn, request: Request, event_id: int = Path(ge=1, le=MAX_ID)) -> dict:
    return asdict(revert_event(_daemon(request).store, event_id, why=body.why))


@router.post(
    "/evolve",
    status_code=202,
    responses=errors(400, 404, 413, 422, 503),
    summary="Queue one round of background jobs on the job host (all, or one by name); poll each "
    "round's id for how it went",
)
def evolve(body: EvolveIn, request: Request) -> dict:
    jobs = _jobs(request)
    if body.job is not None and body.job not in jobs.jobs:
        return error_response(
            404, "not_found", f"there is no job {body.job!r}; jobs are: {', '.join(jobs.jobs)}", "job"
        )
    return {"rounds": jobs.submit(body.job)}


@router.get(
    "/evolve/{round_id}",
    summary="One submitted round: queued, running, done or failed",
    responses=errors(404, 422, 503),
)
def evolve_round(request: Request, round_id: str = Path(max_length=40)) -> dict:
    found = _jobs(request).round(round_id)
    if found is None:
        return error_response(
            404,
            "not_found",
            f"there is no round {round_id!r}; a daemon keeps the rounds "
            "submitted since it started (it may have restarted)",
        )
    return found


@router.post("/promote", summary="Serve a node from the next task on", responses=errors(400, 409, 413, 422, 503))
def promote(body: PromoteIn, request: Request) -> dict:
    return asdict(promote_node(_daemon(request).store, body.node_id, why=body.why))


@router.post(
    "/rollback",
    summary="Serve an earlier node (by default the previous incumbent)",
    responses=errors(400, 409, 413, 422, 503),
)
def rollback(body: RollbackIn, request: Request) -> dict:
    return asdict(rollback_node(_daemon(request).store, body.node_id, why=body.why))
