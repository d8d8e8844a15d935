"""The self-modification tree search (after the Huxley-Gödel Machine), one step at a time.

All of the search's state is in the store: nodes (with their status), the
evaluations (running, done, abandoned) and the inbox tasks that run them. A
step therefore resumes exactly where a killed daemon left off: a node still
``proposed`` is validated first; an evaluation whose task ended but whose
result was not recorded is recorded; evaluations whose tasks are still queued
simply run when a worker claims them.

A step either expands (the parent chosen by Thompson sampling on its clade's
counts, the child proposed, validated and added) or hands out evaluations (the
node for each by Thompson sampling on its own counts, evaluations in flight
counting as failures) as low-priority inbox tasks, so the daemon's workers run
them after any person's task. Expansion happens when t^alpha >= the number of
nodes (t: training evaluations finished). With an ``evaluation_budget``, its
last share (from ``race_start``) is a race: no more expansions, and each
evaluation goes to the leader by lower bound or its strongest challenger
(``policy.choose_racer``); with no budget (0, the default) the race never
starts and the search grows for as long as it runs. Training results drive the
search; the held-out split (never shown to the proposer) decides promotion, by
a lower bound of the Beta posterior against the incumbent's on the same split.
A step that fails (an unparseable proposal) counts against the evaluation budget
like an evaluation, so a model that never answers usably cannot step forever.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from memory import TERMINAL_STATUSES, ExperienceStore, Node, Task, TaskKind

from ..agent.scaffold import ScaffoldError
from ..engine import Engine
from ..judge.catalog import resolve_pack
from ..judge.taskpack import TaskPackError
from ..llm.budget import BudgetExceeded
from ..text import Unchanged
from . import policy
from .incumbent import incumbent, promote, scaffold_of
from .proposer import (
    InvalidProposal,
    ProposalError,
    apply_edit,
    check_child,
    propose,
    scaffold_diff,
    smoke_ran,
)
from .split import SPLITS, Admission, hashed_split

__all__ = ["TreeSearch", "EvalItem", "SERVABLE", "SEARCH_SOURCES", "best_candidate", "node_stats", "tree_view"]

log = logging.getLogger(__name__)

SERVABLE = ("evaluating", "evaluated", "promoted")
PERSON_SOURCES = tuple(k for k in TaskKind if k.persons)  # not evaluations, smoke tests, chat or benchmarks
# The search's own inbox tasks: background work, run on the scaffold of the node in their metadata.
SEARCH_SOURCES = tuple(k for k in TaskKind if k.searched)
FAILED_STEPS_KEY = "search.failed_steps"  # in the store's meta: kept across restarts, like the budget


@dataclass(frozen=True)
class EvalItem:
    ref: str
    split: str  # "train" or "test" (held out)
    task: dict  # add_task's arguments: prompt, check, metadata


def node_stats(store: ExperienceStore, *, split: str = "train") -> list[policy.NodeStats]:
    counts = {r["node_id"]: r for r in store.tree.evaluation_counts(split=split)}
    stats = []
    for node in store.tree.list_nodes():
        c = counts.get(node.id, {"s": 0, "f": 0, "running": 0})
        stats.append(
            policy.NodeStats(
                id=node.id,
                parent=node.parent_id,
                successes=c["s"],
                failures=c["f"],
                in_flight=c["running"],
                expandable=node.status in SERVABLE,
            )
        )
    return stats


# What a record round that found nothing ended says (the jobs keep such a round out of the history).
NOTHING_ENDED = Unchanged("no evaluation or smoke task ended since the last record")


class TreeSearch:
    def __init__(
        self,
        engine: Engine,
        *,
        slots: int = 1,
        rng: np.random.Generator | None = None,
        on_queued: Callable[[], None] = lambda: None,
    ) -> None:
        self.engine = engine
        self.on_queued = on_queued  # told when it has queued tasks (the daemon's workers then look for them)
        self.store = engine.store
        self.config = engine.config
        self.admission = Admission.of(self.config)  # the one door its evaluation and smoke tasks come in by
        self.slots = slots  # evaluations in flight at most
        self.rng = rng or np.random.default_rng()
        # One step or recording at a time: the job host may run the "evolve" and "record" jobs at once.
        self._lock = threading.RLock()

    # --- evaluation tasks ------------------------------------------------------------------

    def pool(self) -> dict[str, list[EvalItem]]:
        """Evaluation tasks by split: the configured packs', then past inbox tasks that carried a check."""
        items: dict[str, list[EvalItem]] = {"train": [], "test": []}
        for name in self.config.evolution.packs:
            try:
                tasks = resolve_pack(name)
            except TaskPackError as exc:
                log.error("evaluation pack %s is not used: %s", name, exc)
                continue
            for t in tasks:
                items[t.split].append(
                    EvalItem(
                        ref=f"pack:{name}:{t.id}",
                        split=t.split,
                        task={"prompt": t.prompt, "check": t.check_data(), "metadata": t.metadata()},
                    )
                )
        share = self.config.evolution.held_out_share
        people = [t for source in PERSON_SOURCES for t in self.store.inbox.list_tasks(source=source, limit=1000)]
        for task in sorted(people, key=lambda t: (t.created_at, t.id)):
            if task.check is None or task.status not in ("done", "failed"):
                continue
            # Decided once, when the task came in (``Admission.admit``); a task recorded before
            # splits were kept is split by the same hash.
            split = task.metadata.get("split")
            if split not in SPLITS:
                split = hashed_split(task.id, share)
            metadata = {key: task.metadata[key] for key in ("files", "deliver") if task.metadata.get(key)}
            items[split].append(
                EvalItem(
                    ref=f"task:{task.id}",
                    split=split,
                    task={"prompt": task.prompt, "check": task.check, "metadata": {**metadata, "split": split}},
                )
            )
        return items

    def _next_item(self, node_id: str, split: str, pool: dict[str, list[EvalItem]]) -> EvalItem | None:
        """The task of ``split`` this node has been evaluated on least (ties: pool order)."""
        items = pool[split]
        if not items:
            return None
        seen: dict[str, int] = {}
        for e in self.store.tree.evaluations_of(node_id):
            if e.status != "abandoned":
                seen[e.task_ref] = seen.get(e.task_ref, 0) + 1
        return min(items, key=lambda item: seen.get(item.ref, 0))

    # --- the step --------------------------------------------------------------------------

    def step(self) -> str:
        """One step of the search; returns what it did. Raises BudgetExceeded when no budget is left."""
        with self._lock:
            try:
                return self._step()
            except BudgetExceeded:  # a gate, not a failure: nothing was spent
                raise
            except Exception:
                self.store.set_meta(FAILED_STEPS_KEY, str(self.failed_steps() + 1))
                raise

    def failed_steps(self) -> int:
        return int(self.store.get_meta(FAILED_STEPS_KEY) or 0)

    def _step(self) -> str:
        notes = self.reconcile()
        pending = [n for n in self.store.tree.list_nodes() if n.status == "proposed"]
        if pending:  # a step was interrupted between proposing and validating: finish it first
            return "; ".join([*notes, self._validate(pending[0])])
        e = self.config.evolution
        stats = node_stats(self.store)
        servable = [n for n in stats if n.expandable]
        spent = sum(n.evaluations for n in stats)
        failed = self.failed_steps()
        if e.evaluation_budget and spent + failed >= e.evaluation_budget:
            return "; ".join(
                [
                    *notes,
                    f"the evaluation budget of {e.evaluation_budget} is spent "
                    f"({spent} evaluations, {failed} failed steps)",
                ]
            )
        sharpness = policy.cool_down(spent, e.evaluation_budget) if e.evaluation_budget else 1.0
        # The budget's last share is a race: no more nodes, and evaluations that tell the best apart.
        # Without a budget (0) the race never starts.
        race = policy.racing(spent + failed, e.evaluation_budget, e.race_start)
        # Every node counts, invalid ones too: a proposal is spent effort, and a run of invalid
        # children must not keep the search proposing without ever evaluating.
        if servable and not race and policy.should_expand(spent, len(stats), e.alpha):
            parent_id = policy.choose_parent(stats, self.rng, sharpness=sharpness)
            return "; ".join([*notes, self._expand(self.store.tree.get_node(parent_id))])
        return "; ".join([*notes, self._dispatch(stats, sharpness, race=race)])

    def _expand(self, parent: Node) -> str:
        self.engine.model.budget.check(purpose="propose", tokens=1)
        parent_scaffold = scaffold_of(self.store, parent)
        try:
            proposal = propose(self.engine, parent, parent_scaffold)
        except ProposalError as exc:  # an unreadable answer is a proposal spent, refused like any invalid one
            node = self._record_node(parent, parent_scaffold.hash, "", exc.proposal, status="invalid", reason=str(exc))
            return f"proposed {node.id} from {parent.id}: invalid: {exc}"
        try:
            child = apply_edit(parent_scaffold, proposal.edit)
        except InvalidProposal as exc:
            node = self._record_node(parent, parent_scaffold.hash, "", proposal, status="invalid", reason=str(exc))
            return f"proposed {node.id} from {parent.id}: invalid: {exc}"
        twin = next((n for n in self.store.tree.list_nodes() if n.scaffold_hash == child.hash), None)
        if twin is not None:
            reason = f"the edited scaffold is node {twin.id}'s (scaffold {child.hash}); it would add nothing"
            node = self._record_node(
                parent,
                child.hash,
                scaffold_diff(parent_scaffold, child),
                proposal,
                status="invalid",
                reason=reason,
                body=child.canonical_json(),
            )
            return f"proposed {node.id} from {parent.id}: invalid: {reason}"
        node = self._record_node(
            parent,
            child.hash,
            scaffold_diff(parent_scaffold, child),
            proposal,
            status="proposed",
            body=child.canonical_json(),
        )
        return f"proposed {node.id} from {parent.id}: {self._validate(node)}"

    def _record_node(
        self,
        parent: Node,
        scaffold_hash: str,
        diff: str,
        proposal,
        *,
        status: str,
        reason: str = "",
        body: str | None = None,
    ) -> Node:
        """The node, its scaffold and its event, in one transaction."""
        with self.store.transaction():
            if body is not None:
                self.store.tree.put_scaffold(scaffold_hash, body)
            node = self.store.tree.add_node(
                scaffold_hash,
                parent_id=parent.id,
                status=status,
                diff=diff,
                rationale=proposal.rationale,
                cost_usd=proposal.cost_usd,
                tokens=proposal.tokens,
            )
            if reason:
                node = self.store.tree.set_node_status(node.id, status, reason=reason)
            self.store.reports.append_event(
                "propose",
                f"node {node.id} proposed from {parent.id}" + (f" (invalid: {reason[:200]})" if reason else ""),
                why=proposal.rationale,
                cost_usd=proposal.cost_usd,
                node_id=node.id,
                payload={"parent": parent.id, "edit": proposal.edit, "status": status, "reason": reason},
            )
        return node

    def _validate(self, node: Node) -> str:
        """Validate a proposed node: its static checks, then a smoke task run by the daemon's workers like
        any other (this step queues it; a later step, or the "record" job, reads how it went). The node
        becomes servable ("evaluating") or invalid with the reason; it stays proposed meanwhile."""
        try:
            child = scaffold_of(self.store, node)
            smoke = self._smoke_of(node)
            if smoke is not None and smoke.status not in TERMINAL_STATUSES:
                return f"waiting for its smoke task {smoke.id}"
            if smoke is None or not smoke_ran(smoke):
                check_child(self.engine, child)
                queued = self._queue_smoke(node)
                again = f" again ({smoke.error or smoke.status})" if smoke is not None else ""
                return f"smoke task {queued.id} queued{again}"
        except (InvalidProposal, ScaffoldError) as exc:
            with self.store.transaction():  # the verdict and its event, or (after a crash) neither
                self.store.tree.set_node_status(node.id, "invalid", reason=str(exc))
                self.store.reports.append_event(
                    "node_invalid",
                    f"node {node.id} is invalid: {str(exc)[:200]}",
                    why=str(exc),
                    node_id=node.id,
                    payload={"reason": str(exc)},
                )
            return f"invalid: {exc}"
        with self.store.transaction():
            self.store.tree.set_node_status(node.id, "evaluating")
            self.store.reports.append_event(
                "node_valid",
                f"node {node.id} passed validation",
                node_id=node.id,
                why="its edit applies, it loads, its tools import and a smoke task ran",
                evidence=[smoke.id],
            )
        return "valid: its tools import and a smoke task ran"

    def _smoke_of(self, node: Node) -> Task | None:
        """The node's latest smoke task (only the newest node is ever proposed, so it is among the newest)."""
        return next(
            (t for t in self.store.inbox.list_tasks(source="smoke", limit=100) if t.metadata.get("node") == node.id),
            None,
        )

    def _queue_smoke(self, node: Node) -> Task:
        self.engine.model.budget.check(purpose="evaluate", tokens=1)  # background work, like an evaluation
        pool = self.pool()
        item = (pool["train"] or pool["test"] or [None])[0]
        if item is None:
            raise InvalidProposal(
                "there is no evaluation task to run a smoke test with "
                "([evolution] packs is empty and no inbox task had a check)"
            )
        ((task, _),) = self.store.inbox.add_tasks(
            [
                self.admission.admit(
                    TaskKind.SMOKE,
                    item.task["prompt"],
                    check=item.task.get("check"),
                    priority=self.config.evolution.evaluation_priority,
                    metadata={**item.task.get("metadata", {}), "node": node.id},
                )
            ]
        )
        self.on_queued()
        return task

    def _dispatch(self, stats: list[policy.NodeStats], sharpness: float, *, race: bool = False) -> str:
        in_flight = sum(n.in_flight for n in stats)
        free = self.slots - in_flight
        if not self.slots:
            return "[advanced.evolution] evaluation_slots is 0: no evaluations are handed out"
        if free <= 0:
            return f"{in_flight} evaluations in flight; waiting for them"
        self.engine.model.budget.check(purpose="evaluate", tokens=1)
        pool = self.pool()
        if not pool["train"]:
            return "no training tasks to evaluate with ([evolution] packs, or inbox tasks with a check)"
        by_id = {n.id: n for n in stats}
        queued = []
        for _ in range(free):
            if (owed := self._comparison_owed(pool)) is not None:
                chosen, split = owed, "test"
            else:
                if race:
                    quantile = self.config.evolution.promotion_quantile
                    chosen = policy.choose_racer(list(by_id.values()), quantile=quantile)
                else:
                    chosen = policy.choose_evaluee(list(by_id.values()), self.rng, sharpness=sharpness)
                split = self._split_for(chosen, pool)
            item = self._next_item(chosen, split, pool)
            if item is None:
                break
            evaluation = self.store.tree.start_evaluation(
                chosen, item.ref, split=split, task_for=self._evaluation_task(item, chosen, split)
            )
            queued.append(f"{chosen} on {item.ref} ({split})")
            if split == "train":  # a virtual loss, so the next pick of this step spreads out
                n = by_id[chosen]
                by_id[chosen] = policy.NodeStats(n.id, n.parent, n.successes, n.failures, n.in_flight + 1, n.expandable)
            log.info("evaluation %s queued: node %s on %s", evaluation.id, chosen, item.ref)
        if not queued:
            return "nothing to evaluate"
        self.on_queued()
        return f"queued {len(queued)} evaluations: " + ", ".join(queued)

    def _evaluation_task(self, item: EvalItem, node_id: str, split: str) -> Callable[[int], dict]:
        """The inbox task that runs evaluation ``evaluation_id`` of ``node_id`` on ``item``: the evaluation,
        the node and the split it is on go in its metadata."""

        def admitted(evaluation_id: int) -> dict:
            metadata = {**item.task.get("metadata", {}), "evaluation": evaluation_id, "node": node_id, "split": split}
            return self.admission.admit(
                TaskKind.EVALUATION,
                item.task["prompt"],
                check=item.task.get("check"),
                priority=self.config.evolution.evaluation_priority,
                metadata=metadata,
            )

        return admitted

    def _comparison_owed(self, pool: dict[str, list[EvalItem]]) -> str | None:
        """The incumbent, while a contender has more held-out evaluations than it. A promotion compares the
        two records and needs min_evaluations of each; the training race alone would never pick an
        incumbent far below its challenger, so the comparison would wait for good."""
        current = incumbent(self.store)
        if current is None or not pool["test"]:
            return None
        return current.id if self._split_for(current.id, pool) == "test" else None

    def _split_for(self, node_id: str, pool: dict[str, list[EvalItem]]) -> str:
        """Held-out evaluations go to a node whose training record beats the incumbent's (and to the
        incumbent, to be compared on the same split); all others train."""
        e = self.config.evolution
        if not pool["test"]:
            return "train"
        current = incumbent(self.store)
        train = {n.id: n for n in node_stats(self.store, split="train")}
        test = {n.id: n for n in node_stats(self.store, split="test")}

        def held(node: str) -> int:
            n = test.get(node)
            return 0 if n is None else n.evaluations + n.in_flight

        def mean(node: str) -> float:
            n = train[node]
            return (1 + n.successes) / (2 + n.evaluations)

        if current is None or node_id not in train:
            return "train"
        if node_id == current.id:
            contenders = [n for n in train.values() if n.id != current.id and held(n.id) > 0 and n.expandable]
            return "test" if contenders and held(current.id) < max(held(n.id) for n in contenders) else "train"
        n = train[node_id]
        if (
            n.evaluations >= e.min_evaluations
            and mean(node_id) > mean(current.id)
            and held(node_id) < e.min_evaluations
        ):
            return "test"
        return "train"

    # --- results ---------------------------------------------------------------------------

    def record(self, task: Task) -> str | None:
        """Record the result of an evaluation task that ended; then consider a promotion. A task not
        ended (queued again by a drain, or still running) records nothing: its run after that does."""
        evaluation_id = task.metadata.get("evaluation")
        if task.source != "evaluation" or evaluation_id is None or task.status not in TERMINAL_STATUSES:
            return None
        evaluation = self.store.tree.get_evaluation(int(evaluation_id))
        if evaluation.status != "running":
            return None
        last = self.store.reports.last_verdict(task.id)
        if task.status in ("done", "failed") and last is not None and last[1] is not None:
            self.store.tree.finish_evaluation(evaluation.id, success=last[1], trajectory_id=last[0])
        else:  # cancelled, dead, or ended before a verdict (a model error, no budget): it counts for nothing
            self.store.tree.abandon_evaluation(evaluation.id)
        return self.consider_promotion()

    def _ended(self) -> list[Task]:
        """The tasks of evaluations still counted in flight whose tasks have ended."""
        tasks = (
            self.store.inbox.get_task(e.task_id) for e in self.store.tree.running_evaluations() if e.task_id is not None
        )
        return [t for t in tasks if t.status in TERMINAL_STATUSES]

    def _smoked(self) -> list[Node]:
        """Proposed nodes whose smoke task has ended: their verdict awaits."""
        return [
            n
            for n in self.store.tree.list_nodes()
            if n.status == "proposed" and (smoke := self._smoke_of(n)) is not None and smoke.status in TERMINAL_STATUSES
        ]

    def ended_unrecorded(self) -> int:
        """How many evaluations and smoke tasks ended unread (the "record" job is due when any did)."""
        return len(self._ended()) + len(self._smoked())

    def reconcile(self) -> list[str]:
        """Record every evaluation whose task has ended. The search does this itself, at each step and
        in the "record" job the daemon pokes when an evaluation task ends; a worker never does."""
        with self._lock:
            notes = []
            for task in self._ended():
                self.record(task)
                notes.append(f"recorded evaluation {task.metadata.get('evaluation')}")
            return notes

    def record_ended(self) -> str:
        """Record the evaluations that ended (promotion is considered with each) and give the verdict
        on a proposed node whose smoke task ended."""
        with self._lock:
            notes = self.reconcile()
            notes += [f"node {n.id}: {self._validate(n)}" for n in self._smoked()]
        return "; ".join(notes) if notes else NOTHING_ENDED

    def consider_promotion(self) -> str | None:
        """Promote the best held-out candidate whose bound beats the incumbent's (or ask for approval)."""
        e = self.config.evolution
        current = incumbent(self.store)
        if current is None:
            return None
        test = {n.id: n for n in node_stats(self.store, split="test")}
        incumbent_counts = _counts(test.get(current.id))
        ready = [
            n
            for n in test.values()
            if n.id != current.id
            and n.expandable
            and policy.should_promote(
                (n.successes, n.failures),
                incumbent_counts,
                min_evaluations=e.min_evaluations,
                quantile=e.promotion_quantile,
            )
        ]
        if not ready:
            return None
        best = max(ready, key=lambda n: (policy.lower_bound(n.successes, n.failures, e.promotion_quantile), n.id))
        bound = policy.lower_bound(best.successes, best.failures, e.promotion_quantile)
        theirs = policy.lower_bound(*incumbent_counts, e.promotion_quantile)
        why = (
            f"held-out {best.successes}/{best.evaluations}, {e.promotion_quantile:.0%} bound {bound:.3f} beats the "
            f"incumbent's {incumbent_counts[0]}/{sum(incumbent_counts)} bound {theirs:.3f}"
        )
        if e.require_approval:
            asked = [
                ev for ev in self.store.reports.list_events(kind="promotion_ready", limit=1000) if ev.node_id == best.id
            ]
            if not asked:
                self.store.reports.append_event(
                    "promotion_ready",
                    f"node {best.id} is ready to replace {current.id}; approve with `evolver promote {best.id}`",
                    why=why,
                    node_id=best.id,
                    payload={"from": current.id, "to": best.id},
                )
            return f"node {best.id} awaits approval"
        promote(self.store, best.id, why=why)
        return f"promoted {best.id}"


def _counts(stats: policy.NodeStats | None) -> tuple[int, int]:
    """A node's (successes, failures), (0, 0) for a node without any."""
    return (stats.successes, stats.failures) if stats else (0, 0)


def best_candidate(store: ExperienceStore, min_evaluations: int, quantile: float = 0.05) -> dict | None:
    """The strongest node other than the incumbent on its held-out record (best bound, then most
    evaluations), and why it is not serving yet; None when there is no other node to consider."""
    current = incumbent(store)
    test = {n.id: n for n in node_stats(store, split="test")}
    others = [n for n in test.values() if n.expandable and (current is None or n.id != current.id)]
    if not others:
        return None
    best = max(others, key=lambda n: (policy.lower_bound(n.successes, n.failures, quantile), n.evaluations, n.id))
    mine = _counts(test.get(current.id) if current else None)
    theirs = policy.lower_bound(*mine, quantile)
    bound = policy.lower_bound(best.successes, best.failures, quantile)
    # The promotion's own rule (consider_promotion) decides "ready"; the rest only says which part of it fails.
    if policy.should_promote((best.successes, best.failures), mine, min_evaluations=min_evaluations, quantile=quantile):
        why = "ready: the next record round promotes it (or asks for approval)"
    elif best.evaluations < min_evaluations:
        why = (
            f"{min_evaluations - best.evaluations} more held-out evaluations needed "
            f"({best.evaluations} of {min_evaluations})"
        )
    elif sum(mine) < min_evaluations:
        why = (
            f"the incumbent needs {min_evaluations - sum(mine)} more held-out evaluations to be compared "
            f"({sum(mine)} of {min_evaluations})"
        )
    else:
        why = f"its bound {bound:.3f} does not beat the incumbent's {theirs:.3f}"
    return {
        "node": best.id,
        "held_out": [best.successes, best.evaluations],
        "bound": round(bound, 4),
        "incumbent_bound": round(theirs, 4),
        "why_not_serving": why,
    }


def tree_view(store: ExperienceStore, quantile: float = 0.05) -> dict:
    """Every node (with its diff) and its counts: own and clade (training), held-out, the posterior
    mean of its own training record, and the ``quantile`` bound of its held-out record."""
    train = node_stats(store, split="train")
    test = {n.id: n for n in node_stats(store, split="test")}
    clade = policy.clade_counts(train)
    nodes = []
    listed = store.tree.list_nodes()
    short = store.reports.short_ids([n.id for n in listed])
    for node, stats in zip(listed, train):
        s, f = clade[node.id]
        held = test[node.id]
        nodes.append(
            {
                **asdict(node),
                "short_id": short[node.id],
                "successes": stats.successes,
                "failures": stats.failures,
                "in_flight": stats.in_flight,
                "clade_successes": s,
                "clade_failures": f,
                "clade_mean": round((1 + s) / (2 + s + f), 4),
                "mean": round((1 + stats.successes) / (2 + stats.evaluations), 4),
                "held_out_successes": held.successes,
                "held_out_failures": held.failures,
                "bound": round(policy.lower_bound(held.successes, held.failures, quantile), 4),
            }
        )
    return {"incumbent": store.get_meta("incumbent"), "quantile": quantile, "nodes": nodes}
