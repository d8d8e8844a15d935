"""The self-modification tree with the scripted model: proposals validated or refused, evaluations handed
out and recorded, conservative promotion, the approval gate, rollback, resume after a kill, exports."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from evolver.config import load_config
from evolver.engine import Engine
from evolver.llm import scripted
from evolver.service.worker import Worker
from evolver.tree import proposer
from evolver.tree.export import to_dot, to_html
from evolver.tree.incumbent import IncumbentError, ensure_root, incumbent, promote, rollback, scaffold_of
from evolver.tree.search import EvalItem, TreeSearch, best_candidate, tree_view
from evolver.tree.split import hashed_split
from memory import Ending, NewTrajectory, NotFound, new_id

PACK = (
    "\n".join(
        json.dumps(t)
        for t in [
            {"id": "t1", "prompt": "What is 2 + 3?", "check": {"type": "answer", "expected": "5"}},
            {"id": "t2", "prompt": "What is 4 + 4?", "check": {"type": "answer", "expected": "8"}},
            {"id": "h1", "prompt": "What is 1 + 6?", "check": {"type": "answer", "expected": "7"}, "split": "test"},
        ]
    )
    + "\n"
)

# Tasks are solved with run_python, then finish with what it printed; the proposer's answer is the
# rule that matches its system prompt.
SOLVER = [
    {"match": r"^(?P<out>-?\d+)\s*$", "role": "tool", "tool": "finish", "arguments": {"answer": r"\g<out>"}},
    {
        "match": r"What is (?P<a>\d+) \+ (?P<b>\d+)\?",
        "on": "task",
        "tool": "run_python",
        "arguments": {"code": r"print(\g<a> + \g<b>)"},
    },
]


def _proposer(edit: dict | str, rationale: str = "spell out the steps") -> dict:
    reply = edit if isinstance(edit, str) else json.dumps({"rationale": rationale, "edit": edit})
    return {"match": "You improve an agent by editing its scaffold", "on": "all", "reply": reply}


@pytest.fixture
def engine(open_store, sandbox, tmp_path):
    pack = tmp_path / "pack.jsonl"
    pack.write_text(PACK)
    opened = []

    def make(rules: list[dict], name: str, data: Path | None = None, **env) -> Engine:
        scripted.register_script(name, {"rules": rules})
        config = load_config(
            env={"EVOLVER_MODEL_NAME": f"scripted/{name}", "EVOLVER_EVOLUTION_PACKS": f'["{pack}"]', **env}
        )
        data = data or tmp_path / "d"
        e = Engine.open(config, data_dir=data, store=open_store(data), sandbox=sandbox)
        ensure_root(e.store, e.seed_scaffold())
        opened.append(e)
        return e

    yield make


def _search(e: Engine, seed: int = 7, slots: int = 1) -> TreeSearch:
    return TreeSearch(e, slots=slots, rng=np.random.default_rng(seed))


def _evaluate_on(e: Engine, node: str, ref: str, split: str, prompt: str, expected: str):
    """Queue an evaluation of ``node`` on a task, as the search queues one (its task admitted at the door)."""
    item = EvalItem(ref=ref, split=split, task={"prompt": prompt, "check": {"type": "answer", "expected": expected}})
    return e.store.tree.start_evaluation(
        node, ref, split=split, task_for=_search(e)._evaluation_task(item, node, split)
    )


def _run_queued(e: Engine, search: TreeSearch) -> int:
    """Run the queued tasks as the daemon's workers do: the search's each on its node's scaffold."""

    def agent_for(task):
        if "node" not in task.metadata:  # a person's task
            return e.agent()
        node = e.store.tree.get_node(task.metadata["node"])
        return e.agent(scaffold_of(e.store, node), node_id=node.id)

    worker = Worker(
        agent_for,
        owner="w",
        lease_s=30,
        max_attempts=2,
        store=e.store,
        on_end=lambda task_id: search.record(e.store.inbox.get_task(task_id)),
    )
    ran = 0
    while worker.run_once() is not None:
        ran += 1
    return ran


def _expanded(e: Engine, search: TreeSearch):
    """Force the next step to expand (t^alpha >= n) by giving the root finished evaluations."""
    root = incumbent(e.store)
    for _ in range(3):
        ev = e.store.tree.start_evaluation(root.id, "pack:x:t1", split="train")
        e.store.tree.finish_evaluation(ev.id, success=True)
    return search.step()


def _validated(e: Engine, search: TreeSearch) -> str:
    """Expand, run the smoke task it queued as the daemon's workers would, and read the verdict."""
    summary = _expanded(e, search)
    if "smoke task" in summary and "queued" in summary:
        assert _run_queued(e, search) == 1
        return search.record_ended()
    return summary


@pytest.mark.parametrize(
    "edit, reason",
    [
        ({"parameters": {"max_stepz": 30}}, "the edit does not apply: the scaffold has no parameters 'max_stepz'"),
        ({"parameters": {"max_steps": 0}}, "the edited scaffold does not load"),
        ({"prompts": {"task": "Do it: {task} {secret}"}}, "uses a placeholder it does not have"),
        # Templates the loop could not render, whatever the exception: an attribute of a placeholder,
        # a format spec or conversion that raises.
        ({"prompts": {"task": "Do it: {task.prompt}"}}, "prompt 'task' cannot be rendered"),
        ({"prompts": {"retry": "{task:d} again"}}, "prompt 'retry' cannot be rendered"),
        ({"prompts": {"reflection": "{verdict!x}"}}, "prompt 'reflection' cannot be rendered"),
        ({"prompts": {"task": "{task:>1000000000}"}}, "asks for a width or precision over 1000"),
        ({"tools": ["finish", "teleport"]}, "its tools do not import: no tool named 'teleport'"),
        ({"verifier": {"type": "always_pass"}}, "the edit touches 'verifier', which is not part of the scaffold"),
        ({"budget": {"usd_per_day": 1e9}, "prompts": {"system": "x"}}, "touches 'budget'"),
        ({"evaluation_harness": "return True"}, "touches 'evaluation_harness'"),
        (
            {"hooks": "import nonexistent_module_xyz\ndef after_tool(data):\n    return None\n"},
            "the hooks did not load: ModuleNotFoundError",
        ),
        ({"hooks": "x = 1\n"}, "the hooks define none of the hook points"),
        (
            {"hooks": "def before_finish(data):\n    return {'answer': 5}\n"},
            "its hooks failed a sample call: before_finish's answer must be a string, not int",
        ),
        (
            {"hooks": "def on_failure(data):\n    return data['verdict']\n"},
            "its hooks failed a sample call: on_failure failed: KeyError: 'verdict'",
        ),
        (
            {"hooks": "def after_tool(data):\n    while True:\n        pass\n"},
            "its hooks failed a sample call: after_tool failed: the call ran past its 2 s timeout",
        ),
        # A NUL character no interpreter takes (raw in the answer: the scripted reply is a regex template).
        ('{"rationale": "spell out the steps", "edit": {"hooks": "x = 1\x00"}}', "the hooks contain a NUL character"),
        ({}, "the edit changes nothing"),
    ],
)
def test_an_invalid_proposal_becomes_an_invalid_node_that_is_never_served(engine, edit, reason):
    e = engine([_proposer(edit), *SOLVER], f"tree-invalid-{abs(hash(reason))}")
    search = _search(e)
    summary = _expanded(e, search)
    assert "invalid" in summary
    (child,) = [n for n in e.store.tree.list_nodes() if n.parent_id is not None]
    assert child.status == "invalid" and reason in child.reason, child.reason
    assert child.rationale == "spell out the steps"
    with pytest.raises(IncumbentError, match="only a validated node can be served"):
        promote(e.store, child.id)
    node_view = [n for n in tree_view(e.store)["nodes"] if n["id"] == child.id][0]
    assert node_view["status"] == "invalid" and reason in node_view["reason"]


def test_an_edit_of_only_what_the_scaffold_never_uses_is_invalid_and_the_proposer_is_told_what_that_is():
    """With one attempt the reflection prompt never runs: the 1.5B meta model's three valid proposals of a
    learning-curve run edited only it, and seven evaluations measured the seed again under other names."""
    from evolver.agent.scaffold import default_scaffold, parts_guide
    from evolver.tree.proposer import InvalidProposal, apply_edit

    seed = default_scaffold()
    one = seed.model_copy(update={"parameters": seed.parameters.model_copy(update={"max_attempts": 1})})
    reflect = {"prompts": {"reflection": seed.prompts.reflection + " Name the failing example."}}
    with pytest.raises(InvalidProposal, match=r"changes only what the scaffold never uses: prompts.reflection \(max"):
        apply_edit(one, reflect)
    with pytest.raises(InvalidProposal, match=r"prompts.plan \(plan_first is off\)"):
        apply_edit(seed, {"prompts": {"plan": "Plan it: {task}"}})
    assert apply_edit(seed, reflect).prompts.reflection.endswith("Name the failing example.")  # two attempts: used
    both = apply_edit(one, {**reflect, "parameters": {"max_attempts": 2}})  # turned on in the same edit
    assert both.parameters.max_attempts == 2
    guide = parts_guide(one)
    assert (
        "- prompts.reflection: Asked after a failed attempt. Placeholders: {task}, {verdict}. UNUSED by this " in guide
    )
    assert "scaffold (max_attempts is 1)." in guide and "prompts.task: The first user message" in guide


def test_a_malformed_proposal_is_an_invalid_node_saying_what_came_back(engine):
    # A proposal is spent effort even when unreadable: it counts, so a model that never answers in JSON
    # cannot keep the search proposing without ever evaluating.
    e = engine([_proposer("I would make the prompt friendlier."), *SOLVER], "tree-malformed")
    summary = _expanded(e, _search(e))
    assert "invalid" in summary and "not JSON" in summary, summary
    (child,) = [n for n in e.store.tree.list_nodes() if n.parent_id is not None]
    assert child.status == "invalid" and "I would make the prompt friendlier." in child.reason
    (event,) = e.store.reports.list_events(kind="propose")
    assert event.payload["status"] == "invalid" and "not JSON" in event.payload["reason"]


def test_a_valid_proposal_is_validated_with_a_smoke_task_run_through_the_inbox(engine):
    edit = {"parameters": {"max_steps": 12}, "prompts": {"system": "You are careful. Compute, then finish."}}
    e = engine([_proposer(edit), *SOLVER], "tree-valid")
    search = _search(e)
    summary = _expanded(e, search)
    # The step proposes and queues a low-priority smoke task; the node stays proposed until it has run.
    assert "smoke task" in summary and "queued" in summary, summary
    (queued,) = e.store.inbox.list_tasks(source="smoke")
    assert queued.status == "queued" and queued.priority == e.config.evolution.evaluation_priority
    (child,) = [n for n in e.store.tree.list_nodes() if n.parent_id is not None]
    assert child.status == "proposed" and queued.metadata["node"] == child.id
    assert search.step() == f"waiting for its smoke task {queued.id}"
    assert _run_queued(e, search) == 1  # a worker runs it on the child's scaffold
    assert search.ended_unrecorded() == 1  # so the "record" job is due
    summary = search.record_ended()
    assert "valid: its tools import and a smoke task ran" in summary
    (child,) = [n for n in e.store.tree.list_nodes() if n.parent_id is not None]
    assert child.status == "evaluating" and child.reason == ""
    assert '"max_steps": 12' in child.diff and '-  "max_steps": 20' in child.diff.replace(" 20,", " 20")
    assert scaffold_of(e.store, child).parameters.max_steps == 12
    smoke = e.store.inbox.list_tasks(source="smoke")
    assert len(smoke) == 1 and smoke[0].status == "done"
    assert e.store.reports.trajectories_of(smoke[0].id)[0].node_id == child.id
    assert e.store.reports.list_events(kind="node_valid")[0].evidence == [smoke[0].id]
    kinds = [ev.kind for ev in e.store.reports.list_events(limit=10)]
    assert "propose" in kinds and "node_valid" in kinds


def test_evaluations_are_handed_out_as_low_priority_tasks_and_recorded(engine):
    e = engine([*SOLVER], "tree-eval", EVOLVER_EVOLUTION_EVALUATION_PRIORITY="-5")
    search = _search(e, slots=2)
    summary = search.step()  # t = 0 < 1 node: evaluate, never expand first
    assert summary.startswith("queued 2 evaluations"), summary
    queued = e.store.inbox.list_tasks(source="evaluation")
    assert len(queued) == 2 and all(t.priority == -5 and t.status == "queued" for t in queued)
    assert {t.metadata["node"] for t in queued} == {incumbent(e.store).id}
    assert search.step() == "2 evaluations in flight; waiting for them"  # both slots taken
    assert _run_queued(e, search) == 2
    (root,) = tree_view(e.store)["nodes"]
    assert (root["successes"], root["failures"], root["in_flight"]) == (2, 0, 0)
    # The two took the two training tasks (the least evaluated first), never the held-out one.
    assert sorted(ev.task_ref.rsplit(":", 1)[1] for ev in e.store.tree.evaluations_of(root["id"])) == ["t1", "t2"]


def _purposes(e: Engine) -> dict[str, set[str]]:
    """The purposes the ledger charged, by what they were for: a task's source, or "step" outside any task."""
    rows = e.store.database.writer.execute(
        "SELECT l.purpose, t.source FROM ledger l LEFT JOIN tasks t ON t.id = l.task_id"
    )
    found: dict[str, set[str]] = {}
    for purpose, source in rows.fetchall():
        found.setdefault(source or "step", set()).add(purpose)
    return found


def test_the_searchs_model_calls_and_tasks_are_charged_to_the_background_share(engine):
    # The proposer's call, the smoke task and the evaluations (their reflections too) are background
    # work; a person's task is not.
    e = engine([_proposer({"parameters": {"max_steps": 12}}), *SOLVER], "tree-purposes")
    search = _search(e)
    assert "queued" in _expanded(e, search)
    assert _run_queued(e, search) == 1 and "valid" in search.record_ended()
    assert search.step().startswith("queued 1 evaluations")
    assert _run_queued(e, search) == 1
    mine, _ = e.store.inbox.add_task("What is 9 + 9?", check={"type": "answer", "expected": "19"})  # fails: reflects
    assert _run_queued(e, search) == 1
    assert _purposes(e) == {"step": {"propose"}, "smoke": {"evaluate"}, "evaluation": {"evaluate"}, "inbox": {"task"}}


def test_a_spent_background_share_stops_evaluations_but_never_a_persons_task(engine):
    e = engine(
        [*SOLVER],
        "tree-share",
        EVOLVER_BUDGET_TOKENS_PER_DAY="100000",
        EVOLVER_BUDGET_TOKENS_PER_TASK="1000",
        EVOLVER_BUDGET_BACKGROUND_SHARE="0.1",
    )
    search = _search(e)
    assert search.step().startswith("queued 1 evaluations")
    mine, _ = e.store.inbox.add_task("What is 9 + 9?", check={"type": "answer", "expected": "18"})
    e.store.ledger.record_call(model="x", purpose="distill", tokens_in=10_000, tokens_out=0, cost_usd=0, latency_ms=1)
    assert _run_queued(e, search) == 2
    assert e.store.inbox.get_task(mine.id).status == "done"
    (evaluation,) = e.store.inbox.list_tasks(source="evaluation")
    assert evaluation.ending is Ending.BUDGET and "background token share" in evaluation.error
    assert e.store.tree.evaluations_of(incumbent(e.store).id)[0].status == "abandoned"  # it counts for nothing


def test_a_persons_task_is_claimed_before_queued_evaluations(engine):
    e = engine([*SOLVER], "tree-priority")
    search = _search(e, slots=2)
    search.step()
    mine, _ = e.store.inbox.add_task("What is 9 + 9?", check={"type": "answer", "expected": "18"})
    lease = e.store.inbox.claim_task("w", lease_s=30, max_attempts=2)
    assert lease.task.id == mine.id


def test_an_evaluation_without_a_verdict_counts_for_nothing(engine):
    e = engine([*SOLVER], "tree-cancel")
    search = _search(e)
    search.step()
    (task,) = e.store.inbox.list_tasks(source="evaluation")
    e.store.inbox.request_cancel(task.id)
    search.record(e.store.inbox.get_task(task.id))
    (evaluation,) = e.store.tree.evaluations_of(incumbent(e.store).id)
    assert evaluation.status == "abandoned"
    assert tree_view(e.store)["nodes"][0]["successes"] + tree_view(e.store)["nodes"][0]["failures"] == 0


def _held_out(e: Engine, node_id: str, successes: int, failures: int) -> None:
    for ok in [True] * successes + [False] * failures:
        ev = e.store.tree.start_evaluation(node_id, "pack:x:h1", split="test")
        e.store.tree.finish_evaluation(ev.id, success=ok)


def _child(e: Engine, status: str = "evaluating") -> str:
    root = incumbent(e.store)
    scaffold = scaffold_of(e.store, root).model_copy(update={"hooks": "# a child\n"})
    e.store.tree.put_scaffold(scaffold.hash, scaffold.canonical_json())
    return e.store.tree.add_node(scaffold.hash, parent_id=root.id, status=status).id


def test_promotion_only_when_the_bound_beats_the_incumbents(engine):
    e = engine([*SOLVER], "tree-promote", EVOLVER_EVOLUTION_MIN_EVALUATIONS="5")
    search = _search(e)
    root, child = incumbent(e.store).id, _child(e)
    _held_out(e, root, 6, 2)  # its 5% bound: 0.450
    _held_out(e, child, 4, 0)  # 0.549, but only 4 evaluations of the 5 needed
    assert search.consider_promotion() is None
    _held_out(e, child, 0, 1)  # 4/5: 0.418, under the incumbent's bound
    assert search.consider_promotion() is None and incumbent(e.store).id == root
    _held_out(e, child, 3, 0)  # 7/8: 0.571 > 0.450
    assert search.consider_promotion() == f"promoted {child}"
    assert incumbent(e.store).id == child
    (event,) = e.store.reports.list_events(kind="promote")
    assert "bound" in event.why and event.payload == {"from": root, "to": child}
    # Rollback restores the earlier node.
    rollback(e.store)
    assert incumbent(e.store).id == root


def test_rollback_again_goes_further_back_and_one_node_shows_as_promoted(engine):
    """Rolling back twice re-served the node just rolled back from, and afterwards two nodes showed as
    promoted: a test failed before."""
    e = engine([*SOLVER], "tree-rollback-twice")
    root, first, second = incumbent(e.store).id, _child(e), _child(e)
    promote(e.store, first)
    promote(e.store, second)

    def promoted() -> list[str]:
        return [n.id for n in e.store.tree.list_nodes() if n.status == "promoted"]

    assert promoted() == [second]
    rollback(e.store)
    assert incumbent(e.store).id == first and promoted() == [first]
    rollback(e.store)
    assert incumbent(e.store).id == root and promoted() == [root]
    with pytest.raises(IncumbentError, match="no earlier incumbent"):
        rollback(e.store)
    assert e.store.tree.get_node(second).status == "evaluated"  # still servable: it can be promoted again
    promote(e.store, second)
    rollback(e.store)
    assert incumbent(e.store).id == root


def test_a_candidate_waits_for_the_incumbents_evidence_on_the_same_split(engine):
    """A learning run promoted a child at 5/10 over the seed measured once (1/1), whose bound is its prior's:
    a promotion compares two records, so the incumbent needs min_evaluations as the candidate does."""
    e = engine([*SOLVER], "tree-thin-incumbent", EVOLVER_EVOLUTION_MIN_EVALUATIONS="5")
    search = _search(e)
    root, child = incumbent(e.store).id, _child(e)
    _held_out(e, root, 1, 0)  # its 5% bound: 0.224
    _held_out(e, child, 3, 2)  # 0.271: above, on no evidence that it is better
    assert search.consider_promotion() is None and incumbent(e.store).id == root
    best = best_candidate(e.store, 5)
    assert best is not None and best["node"] == child
    assert best["why_not_serving"] == "the incumbent needs 4 more held-out evaluations to be compared (1 of 5)"
    _held_out(e, root, 4, 0)  # 5/5: 0.607, the child's 3/5 is far below
    assert search.consider_promotion() is None and incumbent(e.store).id == root
    _held_out(e, child, 12, 0)  # 15/17: 0.690 > 0.607
    assert search.consider_promotion() == f"promoted {child}"


def test_a_worse_candidate_is_not_promoted(engine):
    e = engine([*SOLVER], "tree-worse", EVOLVER_EVOLUTION_MIN_EVALUATIONS="5")
    root, child = incumbent(e.store).id, _child(e)
    _held_out(e, root, 18, 2)
    _held_out(e, child, 14, 6)
    assert _search(e).consider_promotion() is None and incumbent(e.store).id == root


def test_the_approval_gate_waits_for_a_person(engine):
    e = engine(
        [*SOLVER], "tree-approval", EVOLVER_EVOLUTION_MIN_EVALUATIONS="5", EVOLVER_EVOLUTION_REQUIRE_APPROVAL="true"
    )
    root, child = incumbent(e.store).id, _child(e)
    _held_out(e, root, 3, 2)
    _held_out(e, child, 10, 0)
    search = _search(e)
    assert search.consider_promotion() == f"node {child} awaits approval"
    assert search.consider_promotion() == f"node {child} awaits approval"
    assert incumbent(e.store).id == root
    assert len(e.store.reports.list_events(kind="promotion_ready")) == 1  # asked once
    promote(e.store, child, why="approved")
    assert incumbent(e.store).id == child


class Crash(Exception):
    """The process dying at one write, as the code between the writes sees it."""


def _failing_event(store, monkeypatch, kind: str) -> None:
    """Make the store fail to append an event of ``kind``, as a crash at that write would."""
    append = store.reports.append_event

    def append_or_fail(event_kind, *args, **kwargs):
        if event_kind == kind:
            raise Crash(f"the process died while recording {kind}")
        return append(event_kind, *args, **kwargs)

    monkeypatch.setattr(store.reports, "append_event", append_or_fail)


@pytest.mark.parametrize("switch", ["promote", "rollback"])
def test_a_switch_that_fails_at_its_event_leaves_the_incumbent_and_node_as_they_were(engine, monkeypatch, switch):
    e = engine([*SOLVER], f"tree-switch-{switch}")
    root, child = incumbent(e.store).id, _child(e)
    if switch == "rollback":
        promote(e.store, child)
    before = (
        incumbent(e.store).id,
        {n.id: n.status for n in e.store.tree.list_nodes()},
        len(e.store.reports.list_events(limit=1000)),
    )
    _failing_event(e.store, monkeypatch, switch)
    with pytest.raises(Crash):
        promote(e.store, child) if switch == "promote" else rollback(e.store)
    monkeypatch.undo()
    assert (
        incumbent(e.store).id,
        {n.id: n.status for n in e.store.tree.list_nodes()},
        len(e.store.reports.list_events(limit=1000)),
    ) == before
    (promote(e.store, child) if switch == "promote" else rollback(e.store))  # and it can be done again
    assert incumbent(e.store).id == (child if switch == "promote" else root)


def test_a_validation_that_fails_at_its_event_leaves_the_node_proposed_for_the_next_step(engine, monkeypatch):
    e = engine([_proposer({"parameters": {"max_steps": 11}}), *SOLVER], "tree-validate-atomic")
    _failing_event(e.store, monkeypatch, "node_valid")
    with pytest.raises(Crash):
        _validated(e, _search(e))
    monkeypatch.undo()
    (child,) = [n for n in e.store.tree.list_nodes() if n.parent_id is not None]
    assert child.status == "proposed"  # not "evaluating" without the event that says why
    assert _search(e).step() == "valid: its tools import and a smoke task ran"
    assert e.store.tree.get_node(child.id).status == "evaluating"
    assert len(e.store.reports.list_events(kind="node_valid")) == 1


def test_a_smoke_task_the_model_failed_runs_again_and_a_restart_resumes_the_validation(engine, tmp_path):
    # The smoke task meets a model failure: not the child's fault, so the node stays proposed (never served).
    edit = {"parameters": {"max_steps": 9}}
    broken = [_proposer(edit), {"match": "", "error": "bad_request"}]
    e = engine(broken, "tree-kill-1")
    search = _search(e)
    _expanded(e, search)
    assert _run_queued(e, search) == 1
    (child,) = [n for n in e.store.tree.list_nodes() if n.parent_id is not None]
    (failed,) = e.store.inbox.list_tasks(source="smoke")
    assert failed.ending is Ending.MODEL_ERROR
    assert search.record_ended().startswith(f"node {child.id}: smoke task ")  # queued again
    assert e.store.tree.get_node(child.id).status == "proposed"
    with pytest.raises(IncumbentError):
        promote(e.store, child.id)
    e.close()
    # A new process (the model works again): its workers run the queued smoke task, and the first step
    # finishes the interrupted validation, without a new proposal.
    e2 = engine([*SOLVER], "tree-kill-2", data=e.data_dir)
    search2 = _search(e2)
    assert _run_queued(e2, search2) == 1
    assert search2.step() == "valid: its tools import and a smoke task ran"
    assert e2.store.tree.get_node(child.id).status == "evaluating"
    assert len(e2.store.reports.list_events(kind="propose")) == 1


def test_an_evaluation_a_drain_sent_back_to_the_queue_is_not_ended_and_runs_again(engine):
    e = engine([*SOLVER], "tree-drain")
    search = _search(e)
    search.step()
    (task,) = e.store.inbox.list_tasks(source="evaluation")
    ended: list[str] = []

    def on_end(task_id: str) -> None:
        ended.append(task_id)
        search.record(e.store.inbox.get_task(task_id))

    drain = threading.Event()
    drain.set()  # the daemon is stopping: the run stops at its first step and goes back to the queue
    worker = Worker(
        lambda t: e.agent(node_id=t.metadata["node"]),
        owner="w",
        lease_s=30,
        max_attempts=2,
        store=e.store,
        drain=drain,
        on_end=on_end,
    )
    assert worker.run_once().released
    assert ended == [] and e.store.inbox.get_task(task.id).status == "queued"
    # Even asked directly, the search records no result for a task that has not ended.
    assert search.record(e.store.inbox.get_task(task.id)) is None
    (evaluation,) = e.store.tree.evaluations_of(incumbent(e.store).id)
    assert evaluation.status == "running" and search.ended_unrecorded() == 0
    assert _run_queued(e, search) == 1  # after the restart: it runs again, and that result counts
    (evaluation,) = e.store.tree.evaluations_of(incumbent(e.store).id)
    assert evaluation.status == "done" and evaluation.success is True


def test_an_evaluation_that_ended_unrecorded_is_recorded_by_the_next_step(engine):
    e = engine([_proposer({}), *SOLVER], "tree-reconcile")
    search = _search(e)
    search.step()
    # The worker ran the task, but the process died before the result reached the tree.
    worker = Worker(
        lambda task: e.agent(
            scaffold_of(e.store, e.store.tree.get_node(task.metadata["node"])), node_id=task.metadata["node"]
        ),
        owner="w",
        lease_s=30,
        max_attempts=2,
        store=e.store,
    )
    worker.run_once()
    (evaluation,) = e.store.tree.running_evaluations()
    summary = _search(e).step()
    assert summary.startswith(f"recorded evaluation {evaluation.id}")
    assert e.store.tree.get_evaluation(evaluation.id).status == "done"
    assert e.store.tree.get_evaluation(evaluation.id).success is True


def test_held_out_tasks_go_to_a_node_that_beats_the_incumbent_in_training(engine):
    e = engine([*SOLVER], "tree-split", EVOLVER_EVOLUTION_MIN_EVALUATIONS="2")
    root, child = incumbent(e.store).id, _child(e)
    for node, ok in ((child, True), (child, True), (root, False), (root, True)):
        ev = e.store.tree.start_evaluation(node, "pack:x:t1", split="train")
        e.store.tree.finish_evaluation(ev.id, success=ok)
    search = _search(e)
    pool = search.pool()
    assert [i.ref.rsplit(":", 1)[1] for i in pool["test"]] == ["h1"]
    assert search._split_for(child, pool) == "test"
    assert search._split_for(root, pool) == "train"  # no contender on the held-out split yet
    e.store.tree.start_evaluation(child, "pack:x:h1", split="test")
    assert search._split_for(root, pool) == "test"  # now it is compared on the same split


KNOWN = {
    "incumbent": "node_b",
    "quantile": 0.05,
    "nodes": [
        {
            "id": "node_a",
            "parent_id": None,
            "status": "promoted",
            "scaffold_hash": "aaaa",
            "rationale": "the seed",
            "reason": "",
            "cost_usd": 0.0,
            "diff": "",
            "successes": 3,
            "failures": 1,
            "in_flight": 0,
            "clade_successes": 8,
            "clade_failures": 2,
            "clade_mean": 0.75,
            "mean": 0.667,
            "held_out_successes": 0,
            "held_out_failures": 0,
            "bound": 0.05,
        },
        {
            "id": "node_b",
            "parent_id": "node_a",
            "status": "promoted",
            "scaffold_hash": "bbbb",
            "rationale": "plan <first>",
            "reason": "",
            "cost_usd": 0.01,
            "diff": "-a\n+b <i>",
            "successes": 5,
            "failures": 1,
            "in_flight": 1,
            "clade_successes": 5,
            "clade_failures": 1,
            "clade_mean": 0.75,
            "mean": 0.75,
            "held_out_successes": 9,
            "held_out_failures": 1,
            "bound": 0.6,
        },
        {
            "id": "node_c",
            "parent_id": "node_a",
            "status": "invalid",
            "scaffold_hash": "cccc",
            "rationale": "x",
            "reason": "touches 'verifier'",
            "cost_usd": 0.0,
            "diff": "",
            "successes": 0,
            "failures": 0,
            "in_flight": 0,
            "clade_successes": 0,
            "clade_failures": 0,
            "clade_mean": 0.5,
            "mean": 0.5,
            "held_out_successes": 0,
            "held_out_failures": 0,
            "bound": 0.05,
        },
    ],
}


def test_dot_export_of_a_known_tree():
    dot = to_dot(KNOWN)
    assert dot.startswith("digraph evolver_tree {") and dot.rstrip().endswith("}")
    assert '"node_a" -> "node_b";' in dot and '"node_a" -> "node_c";' in dot
    assert re.search(
        r'"node_b" \[label="node_b\\npromoted\\nown 5/6 clade 5/6\\nmean 0.75 bound 0.60", '
        r'fillcolor="#[0-9a-f]{6}", tooltip="plan <first>", penwidth=3\];',
        dot,
    ), dot
    assert '"node_c" [label="node_c\\ninvalid' in dot and 'fillcolor="#d0d0d0"' in dot
    assert dot.count("->") == 2 and dot.count("penwidth") == 1


def test_html_export_of_a_known_tree_is_standalone():
    page = to_html(KNOWN)
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    assert "http://" not in page and "https://" not in page and "<script src" not in page  # no network
    assert page.count("<details>") == 3 and "★ incumbent" in page
    # Diffs coloured (they were plain text) and escaped; titles say what changed (they were only ids).
    assert '<span class="del">-a</span><span class="add">+b &lt;i&gt;</span>' in page
    assert "plan &lt;first&gt;" in page and "touches &#x27;verifier&#x27;" in page
    assert (
        '<span class="what">the seed scaffold</span>' in page and '<span class="what">plan &lt;first&gt;</span>' in page
    )
    assert '<dl class="legend">' in page and "<dt>clade s/n</dt>" in page and "the 5% quantile" in page  # a legend
    # node_b and node_c are children of node_a: nested inside its list item.
    a, b, c = (page.index(f"<small>{n} · ") for n in ("node_a", "node_b", "node_c"))
    assert a < b < c and page[a:b].count("<ul>") == 1


def test_tree_view_counts_clades_from_stored_evaluations(engine):
    e = engine([*SOLVER], "tree-view")
    root = incumbent(e.store).id
    child = _child(e)
    for node, ok in ((root, True), (child, True), (child, False), (child, True)):
        ev = e.store.tree.start_evaluation(node, "pack:x:t1", split="train")
        e.store.tree.finish_evaluation(ev.id, success=ok)
    view = {n["id"]: n for n in tree_view(e.store)["nodes"]}
    assert (view[root]["successes"], view[root]["failures"]) == (1, 0)
    assert (view[root]["clade_successes"], view[root]["clade_failures"]) == (3, 1)
    assert (view[child]["clade_successes"], view[child]["clade_failures"]) == (2, 1)
    assert view[child]["mean"] == round(3 / 5, 4)
    with pytest.raises(NotFound):
        e.store.tree.get_node("node_missing")


def test_the_pool_keeps_the_split_a_persons_task_was_given_when_it_came_in(engine):
    """A person's task with a check is split once, at intake, and the store's rule hides a held-out one
    from then on; the pool must not split it again (a task recorded before splits were kept is split
    by the same hash). Each item carries its split, so a smoke task run on a held-out one is held out."""
    e = engine([*SOLVER], "tree-recorded-split")
    share = e.config.evolution.held_out_share

    def person(prompt: str, *, hashes_to: str, recorded: str | None) -> str:
        task_id = next(i for i in iter(lambda: new_id("task"), None) if hashed_split(i, share) == hashes_to)
        e.store.inbox.add_tasks(
            [
                {
                    "id": task_id,
                    "prompt": prompt,
                    "check": {"type": "answer", "expected": "9"},
                    "source": "api",
                    "status": "done",
                    "metadata": {"split": recorded} if recorded else {},
                }
            ]
        )
        return f"task:{task_id}"

    held = person("What is 4 + 5?", hashes_to="train", recorded="test")
    trained = person("What is 3 + 6?", hashes_to="test", recorded="train")
    legacy = person("What is 2 + 7?", hashes_to="test", recorded=None)
    pool = _search(e).pool()
    assert [i.ref for i in pool["test"]] == ["pack:" + str(e.config.evolution.packs[0]) + ":h1", held, legacy]
    assert [i.ref for i in pool["train"]][-1:] == [trained]
    assert all(i.task["metadata"]["split"] == split for split in pool for i in pool[split])


def test_nothing_is_learned_from_the_held_out_split(engine):
    """An evaluation on the held-out split is not learnable, and neither is one of a held-out task's text on
    the training split: the door holds that text out whatever the evaluation says."""
    e = engine([*SOLVER], "tree-leak")
    root = incumbent(e.store).id
    _evaluate_on(e, root, "pack:x:t", "train", "What is 2 + 5?", "7")
    _evaluate_on(e, root, "pack:x:h", "test", "What is 1 + 6?", "7")
    _evaluate_on(e, root, "pack:x:h1", "train", "What is 1 + 6?", "7")  # h1's text, held out in the pack
    search = _search(e, slots=3)
    assert _run_queued(e, search) == 3
    learnable = e.store.attempts.finished_since(None, limit=100)
    assert [e.store.inbox.get_task(t.task_id).prompt for t, _ in learnable] == ["What is 2 + 5?"]
    mark = (learnable[-1][0].finished_at + 1, "")
    assert len(e.store.attempts.finished_until(mark, limit=100)) == 1


def test_the_door_knows_a_held_out_task_by_its_words_and_files_not_by_its_words_alone():
    """A pack's held-out task is held out however it comes in; the same words with other files (this week's
    log after last week's) are another instance of the work, which may be learned from."""
    from evolver.tree.split import Admission, task_identity

    log = {"app.log": "ERROR payments: timeout\nINFO auth: ok\n"}
    door = Admission(held_out=frozenset({task_identity("How many ERROR lines are in app.log?", log)}))
    ask = "How many ERROR lines are in app.log? "  # as sent, with a stray space

    def split(files):
        item = door.admit("api", ask, check={"type": "answer", "expected": "1"}, metadata={"files": files})
        return item["metadata"]["split"]

    assert split(log) == "test"
    assert split({"app.log": "ERROR auth: denied\n"}) == "train"
    assert split({}) == "train" and split(None) == "train"
    assert door.admit("bench", ask, metadata={"files": dict(log), "split": "train"})["metadata"]["split"] == "test"


def test_a_held_out_task_solved_once_never_reaches_a_prompt(engine):
    """One rule decides what a learner may see: a solved held-out evaluation is not retrieved as an
    example for the same task or another one, nor contrasted by distillation, nor sampled for the proposer."""
    from evolver.meta.distill import _prompt
    from evolver.tree.proposer import _attempts

    e = engine([*SOLVER], "tree-held-out-prompts")
    root = incumbent(e.store).id
    _evaluate_on(e, root, "pack:x:h1", "test", "What is 1 + 6?", "7")
    _evaluate_on(e, root, "pack:x:t1", "train", "What is 2 + 3?", "5")
    assert _run_queued(e, _search(e, slots=2)) == 2
    held_out = {t.id for t in e.store.inbox.list_tasks(source="evaluation") if t.metadata["split"] == "test"}
    trained = {t.id for t in e.store.inbox.list_tasks(source="evaluation") if t.metadata["split"] == "train"}
    assert all(e.store.reports.last_verdict(t)[1] for t in held_out | trained)  # both were solved

    for prompt in ("What is 1 + 6?", "What is 1 + 7?", "What is 2 + 3?"):  # the same task, another, a trained one
        shown = {hit.task_id for hit in e.store.retrieval.context(prompt, trajectories=5).trajectories}
        assert not shown & held_out, prompt
    assert {hit.task_id for hit in e.store.retrieval.context("What is 2 + 3?", trajectories=5).trajectories} & trained

    # Distillation contrasts a failure with a similar success: never the held-out one.
    failed = e.store.attempts.ingest([NewTrajectory(prompt="What is 1 + 6 ?", final_answer="8", success=False)])[0]
    batch = [(e.store.attempts.get_trajectory(failed), False)]
    assert "-> 7" not in _prompt(e.store, batch, [])
    assert "1 + 6?" not in _attempts(e.store, e.store.tree.get_node(root))


def test_failed_steps_count_against_the_evaluation_budget(engine):
    # A proposer the model always refuses to answer: each step fails, and the budget must still end it.
    # (An unparseable proposal is an invalid node, not a failed step.)
    e = engine(
        [
            {
                "match": "You improve an agent by editing its scaffold",
                "on": "all",
                "error": "bad_request",
                "times": 100,
            },
            *SOLVER,
        ],
        "tree-failing-budget",
        EVOLVER_EVOLUTION_EVALUATION_BUDGET="5",
    )
    search = _search(e)
    from evolver.llm import ModelError

    with pytest.raises(ModelError):
        _expanded(e, search)  # 3 evaluations spent, and this failed step
    with pytest.raises(ModelError):
        search.step()
    assert search.step() == "the evaluation budget of 5 is spent (3 evaluations, 2 failed steps)"
    assert len(e.store.tree.list_nodes()) == 1


@pytest.mark.parametrize("race_start, expands", [("0.3", False), ("0.5", True)])
def test_the_end_of_an_evaluation_budget_is_a_race_that_builds_no_more_nodes(engine, race_start, expands):
    # Three evaluations in, t^alpha calls for a child: built while the budget of 10 is short of its race,
    # not once the race has begun.
    e = engine(
        [_proposer({"parameters": {"max_steps": 12}}), *SOLVER],
        f"tree-race-{race_start}",
        EVOLVER_EVOLUTION_EVALUATION_BUDGET="10",
        EVOLVER_EVOLUTION_RACE_START=race_start,
    )
    summary = _expanded(e, _search(e))
    if expands:
        assert summary.startswith("proposed"), summary
        assert len(e.store.tree.list_nodes()) == 2
    else:
        assert summary.startswith("queued 1 evaluations"), summary
        assert len(e.store.tree.list_nodes()) == 1


def test_a_proposal_in_a_fence_with_its_last_brace_missing_is_repaired(engine):
    edit = {"parameters": {"max_steps": 12}}
    reply = "Here is my edit:\n```json\n" + json.dumps({"rationale": "fewer steps", "edit": edit})[:-1] + "\n```"
    e = engine([_proposer(reply), *SOLVER], "tree-repair")
    summary = _expanded(e, _search(e))
    assert "smoke task" in summary and "queued" in summary, summary


def test_the_proposer_sees_failure_modes_and_the_edits_already_tried_with_their_results(engine, tmp_path):
    record = tmp_path / "proposer-seen.jsonl"
    e = engine([_proposer({"tools": ["finish", "teleport"]}), *SOLVER], "tree-tried")
    scripted.register_script(
        "tree-tried", {"rules": [_proposer({"tools": ["finish", "teleport"]}), *SOLVER], "record": str(record)}
    )
    root = incumbent(e.store)
    steps = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c", "name": "run_python", "arguments": {"code": "print(x)"}}],
        }
    ] * 3
    (stuck,) = e.store.attempts.ingest(
        [NewTrajectory(prompt="What is 2 + 3?", success=False, status="step_limit", steps=steps, node_id=root.id)]
    )
    for trajectory in (stuck, None, None):
        ev = e.store.tree.start_evaluation(root.id, "pack:x:t1", split="train")
        e.store.tree.finish_evaluation(ev.id, success=False, trajectory_id=trajectory)
    search = _search(e)
    assert "invalid" in search.step()
    for _ in range(3):  # t = 6: 6^0.6 >= 2 nodes, the next step expands again
        ev = e.store.tree.start_evaluation(root.id, "pack:x:t2", split="train")
        e.store.tree.finish_evaluation(ev.id, success=False)
    assert "invalid" in search.step()  # the same edit again: the proposer was shown it had been tried
    prompts = [
        json.loads(line)["messages"][-1]["content"]
        for line in record.read_text().splitlines()
        if "You improve an agent" in line
    ]
    first, second = prompts[:2]
    assert "Failure modes in these 1 attempts: no finish 1, repeated calls 1" in first
    assert "hit the step limit after 3 model turns; calls: run_python x3; 3 identical calls in a row" in first
    assert "Edits already tried on this scaffold (propose something else):\n(none yet)" in first
    assert "result: invalid: its tools do not import: no tool named 'teleport'" in second
    assert '"teleport"' in second.split("Edits already tried")[1]  # the edit itself, from the node's diff
    # what each part does, so that a prompt its parameter leaves unused is not "added" as a change
    assert "- parameters.plan_first: Ask prompts.plan before the first step" in first
    assert "Off: the plan prompt is never used." in first


def test_a_child_whose_only_change_is_a_hook_is_evaluated_and_promoted_on_its_results(engine):
    """The model hands in sentences ("The answer is 5."); the proposer's only edit is a before_finish hook
    that hands in the number. The search evaluates the child like any other and promotes it on held-out
    results: hooks are a real change. The incumbent, far below the child on training tasks, is evaluated on
    the held-out split beside it all the same: the comparison a promotion needs."""
    hook = (
        "import re\ndef before_finish(data):\n    found = re.findall('[0-9]+', data['answer'] or '')\n"
        "    return {'answer': found[-1]} if found else None\n"
    )
    wordy = [
        {
            "match": r"^(?P<out>-?\d+)\s*$",
            "role": "tool",
            "tool": "finish",
            "arguments": {"answer": r"The answer is \g<out>."},
        },
        SOLVER[1],
    ]
    e = engine(
        [_proposer({"hooks": hook}, "hand in the number alone"), *wordy],
        "tree-hook-promote",
        EVOLVER_EVOLUTION_MIN_EVALUATIONS="3",
    )
    search = _search(e, slots=2)
    root = incumbent(e.store)
    for _ in range(40):
        search.step()
        _run_queued(e, search)
        search.record_ended()
        if incumbent(e.store).id != root.id:
            break
    served = incumbent(e.store)
    assert served.id != root.id, tree_view(e.store)
    assert scaffold_of(e.store, served).model_copy(update={"hooks": ""}) == scaffold_of(e.store, root)
    (event,) = e.store.reports.list_events(kind="promote")
    assert event.payload == {"from": root.id, "to": served.id}
    held = [ev for ev in e.store.tree.evaluations_of(served.id) if ev.split == "test" and ev.status == "done"]
    assert len(held) >= 3 and all(ev.success for ev in held)


def test_a_server_that_constrains_output_is_asked_for_an_edit_of_only_what_the_scaffold_has(engine, tmp_path):
    """Under the schema sent, a proposal can name only the scaffold's prompts, its parameters within their
    bounds and the tools that exist (the 1.5B meta model named a "feedback" prompt in 4 of 8 proposals when
    asked with free keys); the proposal is sampled, not greedy."""
    record = tmp_path / "proposer-asked.jsonl"
    rules = [_proposer({"parameters": {"max_steps": 12}}), *SOLVER]
    e = engine(rules, "tree-schema", EVOLVER_MODEL_STRUCTURED_OUTPUT="true")
    scripted.register_script("tree-schema", {"rules": rules, "record": str(record)})
    root = incumbent(e.store)
    for _ in range(3):  # the seed has been tried: the next step expands it
        ev = e.store.tree.start_evaluation(root.id, "pack:x:t1", split="train")
        e.store.tree.finish_evaluation(ev.id, success=False)
    assert "queued" in _search(e).step()
    (asked,) = [json.loads(line) for line in record.read_text().splitlines() if "You improve an agent" in line]
    assert asked["temperature"] == proposer.TEMPERATURE > 0
    schema = asked["response_format"]["json_schema"]["schema"]

    def fits(edit: dict) -> bool:
        return jsonschema.Draft202012Validator(schema).is_valid({"rationale": "r", "edit": edit})

    assert fits({"prompts": {"reflection": "Why did {task} fail? {verdict}"}, "parameters": {"drafts": 3}})
    assert fits({"tools": ["run_python", "finish"], "hooks": ""})
    assert not fits({"prompts": {"feedback": "Say what went wrong."}})
    assert not fits({"parameters": {"drafts": 0}})  # below its bound
    assert not fits({"parameters": {"patience": 3}})
    assert not fits({"tools": ["teleport"]})
    assert not fits({"verifier": "always pass"})
