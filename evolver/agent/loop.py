"""The agent loop: build context, ask the model, run tool calls, record, repeat.

The loop is short on purpose (after mini-swe-agent): ``run_task`` → attempts →
``_step`` → query the model + execute its tool calls. Every way an attempt ends
is an exception carrying its final message (``Submitted``, ``StepLimit``,
``Cancelled``, ``BudgetExceeded``, ``ModelError``), and each step is written to
the store as it happens, so a crash leaves a readable prefix of the trajectory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from memory.records import Context, Ending, Step, Task
from memory.roles import AgentStore
from sandbox import Limits, Sandbox, write_text
from tools import BUILTIN_SOURCES, SESSION_BUILTINS, TaskTools, ToolRegistry, ToolSpec, signature

from ..judge.checks import parse_check
from ..judge.deliverable import Deliverable, parse_deliverable
from ..judge.verify import Verdict, verify
from ..llm.budget import BudgetExceeded
from ..llm.client import ContextFull, Model, ModelError, ModelReply
from ..text import clip
from .answer_stream import AnswerStream
from .asks import AnswerForm, answer_form, deliverable_in_words
from .delivery import (
    FENCE,
    PYTHON,
    Example,
    delivered_source,
    draft_code,
    module_source,
    task_examples,
    task_stub,
    try_examples,
)
from .failures import DRAFT_CALL, call_key
from .given import task_text
from .hooks import HookCalls, Hooks
from .mcp_tools import ORIGIN as MCP_ORIGIN
from .scaffold import Scaffold

__all__ = [
    "Agent",
    "TaskResult",
    "Submitted",
    "StepLimit",
    "Cancelled",
    "render_context",
    "fit_context",
    "draft_prompt",
    "shows_probation",
    "task_context",
    "task_deliverable",
]

log = logging.getLogger(__name__)

WORK_CHARS = 1500  # of a worked example's code, in a prompt
# A worked example is another task's: shown only when it is of the same kind, by the vector search's
# cosine similarity (all-MiniLM-L6-v2), and headed as another task's. Shown unlike tasks, the 0.5B model
# copied them (a Caesar cipher came out as an earlier task's run-length encoder, an answer as another task's
# sentence). Measured: summing a column of sales.csv against adding up one of invoices.csv 0.64, two
# change-from-a-bill problems 0.65, run-length against Caesar 0.39, a CSV sum against an ERROR count 0.20,
# a date against a price 0.12; chunk against flatten 0.62 is above it, which the heading must carry.
EXAMPLE_SIMILARITY = 0.6
# How many times an attempt's answer may be refused for its form (the task asks for a number and the reply
# holds none), or for being prose about the session's output rather than an answer, before it is taken.
ANSWER_ROUNDS = 2
SHORT_ANSWER_CHARS = 200  # a reply without code longer than this is read as talk, until ANSWER_ROUNDS run out


_SHELL = ("bash", "sh", "shell", "console", "zsh")


def code_blocks(reply: str) -> list[str]:
    """The Python blocks of a reply in code actions (fenced, with or without a language). Blocks in another
    language (```json, ```text) are not code."""
    return [m[2].rstrip() for m in FENCE.finditer(reply) if m[1].lower() in PYTHON and m[2].strip()]


class Submitted(Exception):
    """The model called finish; carries the answer."""

    def __init__(self, answer: str) -> None:
        super().__init__(answer)
        self.answer = answer


class StepLimit(Exception):
    """The scaffold's step limit was reached without an answer."""


class Cancelled(Exception):
    """Someone cancelled the task."""


class Repeating(Exception):
    """The model kept making one identical call; the attempt ends without an answer."""


class _Repeats:
    """Counts identical tool calls in a row (a small model can repeat one call for every step it has)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.key: str | None = None
        self.count = 0
        self.result = ""

    def see(self, name: str, arguments: dict | None) -> int:
        """Count this call; returns how many times in a row it has now been made."""
        key = call_key(name, arguments)
        self.count = self.count + 1 if key == self.key else 1
        self.key = key
        return self.count

    def reset(self) -> None:
        self.key, self.count = None, 0


@dataclass
class _Turn:
    """Where an attempt is, as the hooks are told: its number, the step, the calls made so far."""

    hooks: HookCalls
    attempt: int
    step: int = 0
    calls: list = field(default_factory=list)
    answers: AnswerStream | None = None  # a chat turn whose answer is passed on as it is written
    code: bool = False  # acting in code (action_format), not in tool calls
    blocks: list[str] = field(default_factory=list)  # the code the session ran, in order
    ran: list[str] = field(default_factory=list)  # those of the blocks that ran without an error
    deliverable: Deliverable | None = None
    examples: list[Example] = field(default_factory=list)
    example_rounds: int = 0  # finishes that the task's examples may still refuse
    workspace: Path | None = None
    stub: str | None = None  # the task's code of the requested function
    draft: str | None = None  # the draft's prompt, when this attempt opens with one
    tried: list[tuple[str, int]] = field(default_factory=list)  # sources tried on the examples: failures
    form: AnswerForm | None = None  # the answer's form the task's words ask for
    answer_rounds: int = ANSWER_ROUNDS  # refusals of an answer's form or of talk still allowed
    said: list[str] = field(default_factory=list)  # the loop's own messages: never an answer

    def data(self, task: Task) -> dict:
        return {"task": task.prompt, "attempt": self.attempt, "step": self.step}


def _plain(messages: list[dict]) -> list[dict]:
    """The conversation as plain JSON (a provider's message objects become their data)."""
    return json.loads(json.dumps(messages, default=str))


@dataclass(frozen=True)
class TaskResult:
    task_id: str
    status: str  # done, failed, cancelled
    ending: Ending  # why: decide on this, never on the wording of ``error``
    answer: str | None
    success: bool | None
    attempts: int
    trajectory_ids: list[str]
    verdict: str | None = None
    error: str | None = None


def attempts_allowed(task: Task, params) -> int:
    """How many attempts ``task`` gets: the scaffold's ``max_attempts``, but one for a held-out task. A
    retry starts from the check's verdict on the attempt before, and a held-out task's check is the
    measurement itself: a scaffold retrying there would be scored with the judge's answer in hand (pass@2
    against a hidden test that says only pass or fail), and a child that raised ``max_attempts`` would win
    its promotion on that, not on anything it does better."""
    return 1 if task.held_out else params.max_attempts


def shows_probation(task: Task) -> bool:
    """Whether an attempt at ``task`` may be shown insights on probation (imported, not yet approved or
    measured: ``evolver.meta.probation``): only an evaluation on the promotion split, the tree's own
    held-out work, and only half of those, by the task's id, so that the same promotion tasks are
    attempted with and without them and the difference can be measured. A person's task never is."""
    if task.source != "evaluation" or not task.held_out:
        return False
    return hashlib.sha256(task.id.encode()).digest()[0] % 2 == 0


def task_context(store: AgentStore, task: Task, params) -> Context:
    """What memory gives an attempt at ``task`` under a scaffold's ``params``: the one query, here and in
    the Ray evaluator's shipment."""
    return store.context(
        task.prompt,
        trajectories=params.similar_trajectories,
        insights=params.insights,
        tools=params.tools,
        probation=shows_probation(task),
    )


def worked_examples(context: Context) -> list:
    """The trajectories found that may be shown as worked examples: those of the same kind as the task, by
    the vector search's similarity (``EXAMPLE_SIMILARITY``); one found only by its keywords is not."""
    return [h for h in context.trajectories if h.similarity is not None and h.similarity >= EXAMPLE_SIMILARITY]


def worked_code(ran: list[str]) -> str | None:
    """The code an attempt that answered by running code ran without an error, in order, as much of its end
    as a worked example shows (``WORK_CHARS``). Not only its last block: an answer's computation spans
    blocks that build on one another's variables, and the last is often only ``finish(total)``, which shows
    the next instance of the same work nothing of how the total was found."""
    kept: list[str] = []
    for block in reversed(ran):
        if kept and sum(map(len, kept)) + len(block) > WORK_CHARS:
            break
        kept.insert(0, block.strip())
    return "\n\n".join(kept) or None


def fit_context(context: Context, budget_tokens: int) -> tuple[list[str], list]:
    """The worked examples (as text) and the insights (hits) that fit a token budget (4 chars a token).
    Among the insights retrieved, those measured to help (``evolver.meta.prune``) come first, then the
    more important, so the ones measured to help are the last to be cut."""
    left = budget_tokens * 4
    examples, insights = [], []
    for hit in worked_examples(context):
        block = f"- Another task: {clip(hit.prompt, 400)}\n"
        if hit.work:  # what made it pass: the code it delivered or ran last
            block += f"  Code that worked:\n```python\n{clip(hit.work.strip(), WORK_CHARS)}\n```\n"
        block += f"  Answer: {clip(hit.final_answer or '', 300)}"
        if len(block) > left:
            break
        examples.append(block)
        left -= len(block)
    # Stable: relevance within a level.
    for insight in sorted(context.insights, key=lambda h: (h.measured != "helps", -h.importance)):
        if len(insight.text) + 2 > left:
            break
        insights.append(insight)
        left -= len(insight.text) + 2
    return examples, insights


def draft_prompt(
    scaffold: Scaffold, stub: str | None, prompt_context: tuple[str, str], words: str | None = None
) -> str | None:
    """The draft's prompt (draft_first): the task's stub to complete, as the model alone is asked; for a task
    that asks for a function in words and gives no stub, ``words``, the task's own text, exactly as a person
    would ask the model alone (so the agent's first draft is the model alone's answer). The seed's
    shows nothing learned, so its draft is the model alone's whatever the store holds: shown three worked
    examples and an insight before the stub, the 0.5B model's drafts were worse than without them on the
    learning curve's held-out tasks (what was learned still reaches the turns after a draft that fails, in
    the task's message). A scaffold whose template shows ``{examples}`` or ``{insights}`` here is an edit
    the tree measures, like any other; put them before the stub, since a small model completes the last code
    it is shown."""
    template = scaffold.prompts.draft
    if not template or not scaffold.parameters.draft_first:
        return None
    if stub is None:
        return words.strip() if words and words.strip() else None
    examples, insights = prompt_context
    return template.format(stub=stub, examples=examples, insights=insights).strip()


def draft_seed(messages: list[dict], n: int) -> int | None:
    """The sampling seed of the request for draft ``n`` of these messages (and the drafts asked with it): None for
    the first (temperature 0), then one fixed by what is asked and the draft's number. Two agents that ask the same
    draft prompt then draw alike, so a paired comparison of them is less of a lottery: without it, 9 of the 10 tasks
    a learning run gained over the seed were handed in by a draft, which nothing learned reaches. Alike, not
    identical, on llama.cpp's server: its arithmetic is not bit-for-bit repeatable, so 4 of 12 seeded draws came
    back whole and the rest diverged after a median of about 250 characters, where unseeded ones diverged within 91."""
    if n == 0:
        return None
    asked = json.dumps(messages, sort_keys=True).encode("utf-8")
    return int.from_bytes(hashlib.sha256(asked + b"\0%d" % n).digest()[:4], "big")


def _another(reply: ModelReply, text: str) -> ModelReply:
    """Another completion of the same request, as a reply of its own (its tokens were counted with the first's)."""
    return replace(
        reply,
        content=text,
        tokens_in=0,
        tokens_out=0,
        cost_usd=0.0,
        latency_ms=0.0,
        others=(),
        assistant_message={"role": "assistant", "content": text},
    )


def render_context(context: Context, budget_tokens: int) -> tuple[str, str]:
    """Worked examples and insights as prompt text, within a token budget (``fit_context``)."""
    return _render(*fit_context(context, budget_tokens))


def _render(examples: list[str], hits: list) -> tuple[str, str]:
    insights = [f"- {hit.text}" for hit in hits]
    examples_text = (
        (
            "\nOther tasks of this kind, solved before (they are not this task: reuse a method that fits, "
            "never their answers):\n" + "\n".join(examples) + "\n"
        )
        if examples
        else ""
    )
    insights_text = ("\nLessons from experience:\n" + "\n".join(insights) + "\n") if insights else ""
    return examples_text, insights_text


class Agent:
    """Solves tasks with one scaffold; everything it does is parameterized by it."""

    def __init__(
        self,
        *,
        store: AgentStore,
        model: Model,
        sandbox: Sandbox,
        registry: ToolRegistry,
        scaffold: Scaffold,
        workspace_root: Path,
        node_id: str | None = None,
        observation_chars: int = 4000,
        keep_workspaces: bool = False,
        limits: Limits | None = None,
        on_tool_use: Callable[[ToolSpec, bool], None] | None = None,
        reflection_tokens: int | None = None,
        hook_limits: Limits | None = None,
        hook_timeout_s: float = 2.0,
    ) -> None:
        self.store = store
        self.hook_limits = hook_limits or Limits(timeout_s=30, memory_mb=256)
        self.hook_timeout_s = hook_timeout_s
        self.reflection_tokens = reflection_tokens  # None: the model's cap for the purpose
        self.on_tool_use = on_tool_use
        self.model = model
        self.sandbox = sandbox
        self.registry = registry
        self.scaffold = scaffold
        self.workspace_root = Path(workspace_root)
        self.node_id = node_id
        self.observation_chars = observation_chars
        self.keep_workspaces = keep_workspaces
        self.limits = limits

    # --- one task ----------------------------------------------------------------

    def run_task(
        self,
        task: Task,
        *,
        cancel: threading.Event | None = None,
        on_step: Callable[[Step], None] | None = None,
        record_status: bool = True,
        on_answer: Callable[[str], None] | None = None,
    ) -> TaskResult:
        """Solve one task. With ``record_status=False`` the caller records how it ended
        (a leased worker does, fenced by its lease). ``on_answer`` gets the answer in pieces while the
        model writes its finish call (``AnswerStream``), unless a ``before_finish`` hook may change it.
        The task's kind decides what its model calls are charged as and whether a failing hook fails it."""
        cancel = cancel or threading.Event()
        purpose = task.source.purpose
        params = self.scaffold.parameters
        workspace = self._prepare_workspace(task)
        context = task_context(self.store, task, params)
        tool_names = self._tool_names(context)
        schemas = self.registry.schemas(tool_names)
        check = parse_check(task.check) if task.check else None
        code = self.acts_in_code()
        deliverable = task_deliverable(task)
        task_own = task_examples(task.prompt, deliverable.functions) if deliverable and params.example_rounds else []
        stub = task_stub(task.prompt, deliverable.functions) if deliverable else None
        if record_status:
            self.store.set_task_status(task.id, "running")
        trajectory_ids: list[str] = []
        reflection: str | None = None
        answer: str | None = None
        verdict: Verdict | None = None
        status, ending, error = "failed", Ending.INTERNAL_ERROR, None
        note: str | None = None
        hooks = HookCalls(None)
        # What every attempt is shown: fitted to the budget once, and noted per attempt (memory.effects).
        examples, shown = fit_context(context, params.context_tokens)
        prompt_context = _render(examples, shown)
        exposed = {
            "insight": [str(hit.insight_id) for hit in shown],
            "tool": [n for n in tool_names if n not in BUILTIN_SOURCES],
            # the examples are the first of the worked examples (fit_context keeps them in order)
            "example": [hit.trajectory_id for hit in worked_examples(context)[: len(examples)]],
        }
        try:
            with TaskTools(
                self.registry,
                self.sandbox,
                workspace,
                limits=self.limits,
                observation_chars=self.observation_chars,
                allowed=tool_names,
                on_use=self.on_tool_use,
            ) as tools:
                hooks = HookCalls(self._hooks(task))
                may_change = hooks.hooks is not None and hooks.hooks.defines("before_finish")
                answers = AnswerStream(on_answer) if on_answer is not None and not may_change else None
                attempts = attempts_allowed(task, params)
                for attempt in range(1, attempts + 1):
                    trajectory = self.store.start_trajectory(task.id, node_id=self.node_id, attempt=attempt)
                    trajectory_ids.append(trajectory.id)
                    self.store.record_exposures(trajectory.id, exposed)
                    messages = self._opening(
                        task,
                        prompt_context,
                        reflection,
                        note,
                        code=code,
                        tool_names=tool_names,
                        deliverable=deliverable,
                    )
                    # A chat answer streams from a finish call; in code it is a whole reply, sent when done.
                    turn = _Turn(
                        hooks=hooks,
                        attempt=attempt,
                        answers=None if code else answers,
                        code=code,
                        deliverable=deliverable,
                        examples=task_own,
                        workspace=workspace,
                        example_rounds=params.example_rounds if deliverable else 0,
                        stub=stub,
                        form=None if deliverable else answer_form(task.prompt),
                    )
                    if code and attempt == 1 and deliverable is not None:  # a retry would draft the same again
                        turn.draft = draft_prompt(self.scaffold, stub, prompt_context, shown_task(task))
                    answer, ended = self._attempt(
                        trajectory.id, task, messages, schemas, tools, cancel, on_step, purpose, turn
                    )
                    self._hand_in(trajectory.id, turn, on_step)
                    if check:
                        # The attempt is over: its worker dies before the verifier writes the check's
                        # files, so nothing the attempt left running can rewrite them (a next attempt
                        # starts a fresh worker).
                        tools.close()
                    verdict = (
                        verify(check, answer=answer, sandbox=self.sandbox, workspace=workspace, limits=self.limits)
                        if check
                        else None
                    )
                    if verdict is not None and task.source.measured and hooks.failures:
                        # A node's hooks are part of what is measured: one that broke, in this attempt or
                        # after an earlier one, fails the run (a person's task still gets its answer).
                        verdict = Verdict(
                            False,
                            f"a hook failed during this evaluation: {hooks.failures[0]}",
                            "hooks",
                            score=0.0,
                            feedback=f"a hook failed: {hooks.failures[0]}",
                        )
                    if verdict is not None:  # before the attempt ends: it enters the index once, with its outcome
                        self.store.record_outcome(
                            trajectory.id,
                            success=verdict.success,
                            score=verdict.score,
                            verifier=verdict.verifier,
                            verifier_output=verdict.output,
                        )
                    self.store.finish_trajectory(trajectory.id, status=ended, final_answer=answer)
                    if verdict is None or verdict.success:
                        if verdict is None and answer is None:  # no check to fall back on
                            status, ending, error = "failed", Ending.NO_ANSWER, f"no answer ({ended})"
                        else:
                            status, ending = "done", Ending.ANSWERED
                        break
                    if not (params.reflect_retry and attempt < attempts):
                        ending, error = Ending.CHECK_FAILED, verdict.output
                        break
                    reflection = self._reflect(trajectory.id, task, messages, verdict, on_step, purpose)
                    told = hooks(
                        "on_failure",
                        {
                            "task": task.prompt,
                            "attempt": attempt,
                            "answer": answer,
                            "feedback": verdict.for_learner,
                            "reflection": reflection,
                        },
                        self._recorder(trajectory.id, on_step),
                    )
                    note = told.get("note") if told else None
        except Cancelled:
            status, ending, error = "cancelled", Ending.CANCELLED, "cancelled"
            self._close_open(trajectory_ids, "cancelled")
        except BudgetExceeded as exc:
            status, ending, error = "failed", Ending.BUDGET, str(exc)
            self._close_open(trajectory_ids, "budget")
        except ModelError as exc:
            status, ending, error = "failed", Ending.MODEL_ERROR, f"model error: {exc}"
            self._close_open(trajectory_ids, "error")
        except Exception as exc:  # a bug or a broken part: the task says so, the caller keeps serving
            log.exception("task %s failed inside evolver", task.id)
            status, ending, error = "failed", Ending.INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}"
            self._close_open(trajectory_ids, "error")
        finally:
            if hooks.hooks is not None:
                hooks.hooks.close()
            if not self.keep_workspaces:
                shutil.rmtree(workspace, ignore_errors=True)
        if record_status:
            self.store.set_task_status(task.id, status, error=error, ending=ending)
        return TaskResult(
            task_id=task.id,
            status=status,
            ending=ending,
            answer=answer,
            success=None if verdict is None else verdict.success,
            attempts=len(trajectory_ids),
            trajectory_ids=trajectory_ids,
            verdict=verdict.output if verdict else None,
            error=error,
        )

    def _close_open(self, trajectory_ids: list[str], status: str) -> None:
        if trajectory_ids and self.store.get_trajectory(trajectory_ids[-1]).status == "running":
            self.store.finish_trajectory(trajectory_ids[-1], status=status)

    def _prepare_workspace(self, task: Task) -> Path:
        workspace = self.workspace_root / task.id
        if workspace.exists():
            shutil.rmtree(workspace)
        workspace.mkdir(parents=True)
        os.chmod(workspace, 0o700)
        # Hand the directory to the sandbox's user first: files written into it are
        # then theirs too, so sandboxed code can change, add and delete them.
        self.sandbox.workspace_dir(workspace)
        for path, text in (task.metadata.get("files") or {}).items():
            write_text(workspace, path, text)
        return workspace

    def _hooks(self, task: Task) -> Hooks | None:
        """The scaffold's hooks for this task, in a sandboxed interpreter of their own (see hooks.py)."""
        if not self.scaffold.hooks.strip():
            return None
        return Hooks(
            self.scaffold.hooks,
            sandbox=self.sandbox,
            scratch=self.workspace_root / f"{task.id}.hooks",
            limits=self.hook_limits,
            timeout_s=self.hook_timeout_s,
        )

    def _tool_names(self, context: Context) -> list[str]:
        enabled = [n for n in self.scaffold.tools if self.registry.get(n) is not None]
        relevant = [
            hit.name for hit in context.tools if self.registry.get(hit.name) is not None and hit.name not in enabled
        ]
        # The user's MCP servers' tools are offered to every task, like built-ins; no scaffold names them.
        users = [s.name for s in self.registry.specs() if s.origin == MCP_ORIGIN and s.name not in enabled]
        return enabled + relevant + users

    def acts_in_code(self) -> bool:
        """Whether this scaffold's agent acts in code: its action_format, or for auto, whether the model
        lacks native tool calls (a code model writes Python more reliably than JSON)."""
        chosen = self.scaffold.parameters.action_format
        return chosen == "code" or (chosen == "auto" and not self.model.native_tools())

    def _opening(
        self,
        task: Task,
        prompt_context: tuple[str, str],
        reflection: str | None,
        note: str | None = None,
        *,
        code: bool = False,
        tool_names: Sequence[str] = (),
        deliverable: Deliverable | None = None,
    ) -> list[dict]:
        prompts = self.scaffold.prompts
        examples, insights = prompt_context
        user = prompts.task.format(task=shown_task(task), examples=examples, insights=insights)
        if code and deliverable is not None:
            names = ", ".join(f"`{f}`" for f in deliverable.functions)
            user += (
                f"\nWrite the complete {names}, with its whole body, in a python block, and print what it "
                f'returns for the task\'s examples to check it. When it is right, call finish("done"): the '
                f"session's definition is then saved to {deliverable.file} for you."
            )
        if reflection is not None:
            user += "\n\n" + prompts.retry.format(task=shown_task(task), reflection=reflection)
        if note:
            user += "\n\n" + note
        system = prompts.system
        if code and prompts.code:
            system = prompts.code.format(functions=self._functions(tool_names))
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def _functions(self, tool_names: Sequence[str]) -> str:
        """The session's functions as the code prompt lists them, and the tools code cannot reach."""
        lines, unreachable = [], []
        for spec in self.registry.specs(tool_names):
            if spec.name in SESSION_BUILTINS or (spec.origin != "builtin" and spec.runner is None):
                lines.append(f"- {signature(spec)}")
            elif spec.name not in BUILTIN_SOURCES:
                unreachable.append(spec.name)
        if unreachable:  # an MCP server's tools run in the daemon, which a block cannot call
            lines.append(f"(Not available in code: {', '.join(unreachable)}; they need action_format tools.)")
        return "\n".join(lines)

    def _hand_in(self, trajectory_id: str, turn: _Turn, on_step) -> None:
        """Deliver what a code task asked for if the attempt defined it but did not write the file, and keep
        the attempt's work as a step for worked examples: the delivered module, or in code what the session ran
        without an error (``worked_code``; in tool calls the steps already show the code)."""
        work = worked_code(turn.ran) if turn.code else None  # never code that raised, headed "Code that worked"
        if turn.deliverable is not None and turn.workspace is not None:
            source, own = delivered_source(turn.workspace, turn.deliverable, turn.blocks)
            if source is not None and not own:
                source, which = self._best_version(turn, source)
                write_text(turn.workspace, turn.deliverable.file, source)
                self._recorder(trajectory_id, on_step)(
                    "tool",
                    f"[delivered] the session's {which} of {', '.join(turn.deliverable.functions)} was "
                    f"written to {turn.deliverable.file}",
                )
            work = source if source is not None else work
        if work:
            self._recorder(trajectory_id, on_step)("work", work)

    def _best_version(self, turn: _Turn, latest: str) -> tuple[str, str]:
        """Which of the versions the attempt defined is handed in: the one that passed the most of the task's
        examples, the earliest of equals (a repair that passes no more examples than the draft did is no
        reason to hand in something else); never tried (no finish, no examples), the latest."""
        if not turn.tried and not turn.examples:
            return latest, "latest definition"
        if all(failed for _, failed in turn.tried) and all(source != latest for source, _ in turn.tried):
            assert turn.deliverable is not None and turn.workspace is not None  # as _hand_in, its caller, checked
            failures = try_examples(
                self.sandbox, turn.workspace, turn.deliverable.file, latest, turn.examples, self.limits
            )
            turn.tried.append((latest, len(failures)))
        best = min(range(len(turn.tried)), key=lambda n: (turn.tried[n][1], n))
        source, failed = turn.tried[best]
        which = (
            "latest definition"
            if source == latest or best == len(turn.tried) - 1
            else "earlier definition (it passed more examples)"
        )
        if not turn.examples:
            return source, which
        return source, f"{which}, passing {len(turn.examples) - failed} of the task's {len(turn.examples)} examples,"

    # --- one attempt ---------------------------------------------------------------

    def _attempt(
        self,
        trajectory_id: str,
        task: Task,
        messages: list[dict],
        schemas: list[dict],
        tools: TaskTools,
        cancel: threading.Event,
        on_step,
        purpose: str,
        turn: _Turn,
    ) -> tuple[str | None, str]:
        """Run steps until an answer or a limit; returns the answer and how it ended."""
        params = self.scaffold.parameters
        record = self._recorder(trajectory_id, on_step)
        if params.plan_first and self.scaffold.prompts.plan:
            messages.append({"role": "user", "content": self.scaffold.prompts.plan.format(task=shown_task(task))})
            reply = self._ask(messages, None, task, purpose)
            record("plan", reply.content, reply=reply)
            messages.append({"role": "assistant", "content": reply.content})
            messages.append(
                {
                    "role": "user",
                    "content": "Now carry out the plan" + (" in python blocks." if turn.code else " with the tools."),
                }
            )
        idle = 0
        turn.said.extend(m["content"] for m in messages if m["role"] == "system")
        repeats = _Repeats(params.repeat_limit)
        turn.hooks.unusable(record)
        try:
            for step in range(1, params.max_steps + 1):
                if cancel.is_set():
                    raise Cancelled()
                turn.step = step
                if step == 1 and turn.draft is not None:
                    self._draft_step(messages, tools, task, record, purpose, turn)
                elif turn.code:
                    self._code_step(messages, tools, task, record, purpose, repeats, turn)
                else:
                    idle = self._step(messages, schemas, tools, task, record, purpose, idle, repeats, turn)
            raise StepLimit(f"no answer after {params.max_steps} steps")
        except Submitted as done:
            return done.answer, "finished"
        except ContextFull:
            # The conversation outgrew the model's context: the attempt ends there, and what its session
            # defined is still handed in (a last turn would not fit either).
            return None, "context_full"
        except (StepLimit, Repeating) as ended:
            status = "step_limit" if isinstance(ended, StepLimit) else "repeating"
            if not params.last_answer_turn or cancel.is_set() or turn.deliverable is not None:
                return None, status  # a code task's answer is what it delivers, asked for or not
            answer = self._last_answer(messages, task, record, purpose, status, turn)
            return (answer, "asked") if answer else (None, status)

    def _last_answer(self, messages: list[dict], task: Task, record, purpose: str, why: str, turn: _Turn) -> str | None:
        """One last turn that can only be an answer: no tools are offered, and the reply's text is the answer
        (a code block in it is read as text), asked in the form the task's words ask for. The trajectory ends
        'asked', so this answer is told apart. The loop's own words are never taken for it."""
        reason = "You have used all your steps" if why == "step_limit" else "You kept repeating one action"
        wanted = turn.form.words if turn.form is not None else "the answer alone, as the task asks for it"
        self._tell(
            messages,
            turn,
            f"{reason}; this attempt ends now. Your next reply is taken word for word as your final answer to "
            f"the task, so write only {wanted}.",
        )
        reply = self._ask(messages, None, task, purpose)
        record("answer", reply.content, reply=reply)  # not an "assistant" step: it could only answer
        messages.append({"role": "assistant", "content": reply.content})
        text = reply.content.strip()
        blocks = [m[2] for m in FENCE.finditer(text)]
        answer = (blocks[-1] if blocks else text).strip()
        if not answer or _own_words(answer, turn.said):
            return None
        if turn.form is not None:
            answer = turn.form.shape(answer)[0] or answer
        return answer

    @staticmethod
    def _tell(messages: list[dict], turn: _Turn, text: str) -> None:
        """A message of the loop's own to the model: kept, so that it never comes back as an answer."""
        turn.said.append(text)
        messages.append({"role": "user", "content": text})

    def _ask(
        self,
        messages: list[dict],
        schemas: list[dict] | None,
        task: Task,
        purpose: str,
        max_tokens: int | None = None,
        answers: AnswerStream | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        n: int = 1,
    ) -> ModelReply:
        tap = answers.tap() if answers is not None else None
        temperature = self.scaffold.parameters.temperature if temperature is None else temperature
        return self.model.complete(
            messages,
            tools=schemas,
            temperature=temperature,
            purpose=purpose,
            task_id=task.id,
            node_id=self.node_id,
            max_tokens=max_tokens,
            stream=tap,
            seed=seed,
            n=n,
        )

    def _recorder(self, trajectory_id: str, on_step):
        def record(
            role: str,
            content: str,
            *,
            reply: ModelReply | None = None,
            tool_calls=None,
            tool_results=None,
            duration_ms: float = 0.0,
        ) -> None:
            step = self.store.add_step(
                trajectory_id,
                role=role,
                content=content,
                tool_calls=tool_calls,
                tool_results=tool_results,
                tokens_in=reply.tokens_in if reply else 0,
                tokens_out=reply.tokens_out if reply else 0,
                cost_usd=reply.cost_usd if reply else 0.0,
                duration_ms=reply.latency_ms if reply else duration_ms,
            )
            if on_step is not None:
                on_step(step)

        return record

    def _step(
        self,
        messages,
        schemas,
        tools: TaskTools,
        task: Task,
        record,
        purpose: str,
        idle: int,
        repeats: _Repeats,
        turn: _Turn,
    ) -> int:
        """One model turn and its tool calls; returns how many turns in a row had no tool call."""
        outgoing, offered = messages, schemas
        names = [s["function"]["name"] for s in schemas]
        change = turn.hooks("before_model", {**turn.data(task), "messages": _plain(messages), "tools": names}, record)
        if change:
            outgoing = change.get("messages", messages)
            if "tools" in change:
                offered = [s for s in schemas if s["function"]["name"] in change["tools"]]
        reply = self._ask(outgoing, offered, task, purpose, answers=turn.answers)
        # A call that could not be read keeps what the model sent, so a reader sees that, not null.
        calls = [
            {
                "id": c.id,
                "name": c.name,
                "arguments": c.arguments,
                "error": c.error,
                **({"raw": c.raw_arguments} if c.error else {}),
            }
            for c in reply.tool_calls
        ]
        record("assistant", reply.content, reply=reply, tool_calls=calls or None)
        messages.append(reply.assistant_message)
        if not reply.tool_calls:
            if idle >= 1 and reply.content.strip():  # said twice without a tool: that is its answer
                verdict = self._reply_as_answer(reply.content.strip(), task, turn, record)
                if isinstance(verdict, Submitted):
                    raise verdict
                self._tell(messages, turn, verdict)
                return idle
            note = (
                "You did not call a tool. If that is your final answer, call finish with it; "
                "otherwise continue with a tool."
            )
            self._tell(messages, turn, note)
            return idle + 1
        finished: str | None = None
        stop = False
        offered_names = {s["function"]["name"] for s in offered}
        for call in reply.tool_calls:
            times = repeats.see(call.name, call.arguments) if call.error is None else 0
            if call.error is None and call.name not in offered_names and call.name in names:
                repeats.reset()  # a tool a before_model hook held back this turn
                text, ok, took = f"Tool call refused: {call.name} is not offered at this step", False, 0.0
            elif call.error is not None:
                repeats.reset()
                text, ok, took = f"Tool call refused: {call.name or 'the call'}: {call.error}", False, 0.0
            elif repeats.limit and times >= repeats.limit:
                # Running it again would give the model what it already has: say so, and end a loop
                # that the note did not break.
                stop = times >= 2 * repeats.limit
                text, ok, took = self._repeat_note(call.name, times, repeats.result, stop), False, 0.0
                turn.said.append(self._repeat_note(call.name, times, "", stop))
            else:
                observation = tools.run(call.name, call.arguments)
                text, ok, took = observation.text, observation.ok, observation.duration_ms
                repeats.result = text
                code = (call.arguments or {}).get("code")
                if call.name == "run_python" and isinstance(code, str):
                    turn.blocks.append(code)
                    if observation.ok:
                        turn.ran.append(code)
                if observation.finished and observation.answer is not None and finished is None:
                    decided = self._finishing(observation.answer, task, turn, record)
                    if isinstance(decided, Submitted):
                        finished = decided.answer
                    else:
                        text, ok = decided, False
            record("tool", text, tool_results=[{"id": call.id, "name": call.name, "ok": ok}], duration_ms=took)
            turn.calls.append([call.name, call.arguments])
            if finished is None:  # after the finish, nothing more is read
                change = turn.hooks(
                    "after_tool",
                    {
                        **turn.data(task),
                        "name": call.name,
                        "arguments": call.arguments,
                        "result": text,
                        "ok": ok,
                        "calls": turn.calls,
                    },
                    record,
                )
                if change:
                    text = change["result"]
            messages.append(self._tool_message(reply, call, text))
        if finished is not None:
            raise Submitted(finished)
        if stop:
            raise Repeating()
        return 0

    def _code_step(
        self, messages: list[dict], tools: TaskTools, task: Task, record, purpose: str, repeats: _Repeats, turn: _Turn
    ) -> None:
        """One model turn in code: its Python runs in the session, and what it printed is the next message.
        A reply without code is the answer; ``finish(answer)`` in the code ends the attempt."""
        outgoing = messages
        change = turn.hooks("before_model", {**turn.data(task), "messages": _plain(messages), "tools": []}, record)
        if change:
            outgoing = change.get("messages", messages)
        reply = self._ask(outgoing, None, task, purpose)
        blocks = code_blocks(reply.content)
        code = "\n\n".join(blocks)
        arguments = {"code": code}
        calls = [{"id": f"code_{turn.step}", "name": "run_python", "arguments": arguments}]
        record("assistant", reply.content, reply=reply, tool_calls=calls if blocks else None)
        messages.append({"role": "assistant", "content": reply.content})
        if not blocks and any(m[1].lower() in _SHELL for m in FENCE.finditer(reply.content)):
            # an action, not an answer, in the wrong language
            self._tell(
                messages,
                turn,
                "Only ```python blocks run here. Run a shell command from Python: print(run_shell('...')).",
            )
            return
        if not blocks:
            decided = self._reply_as_answer(reply.content.strip(), task, turn, record)
            if isinstance(decided, Submitted):
                raise decided
            self._tell(messages, turn, decided)
            return
        times = repeats.see("run_python", arguments)
        if repeats.limit and times >= repeats.limit:
            stop = times >= 2 * repeats.limit
            text, ok, took = self._repeat_note("this code", times, repeats.result, stop), False, 0.0
            turn.said.append(self._repeat_note("this code", times, "", stop))
            if stop:
                record("tool", text, tool_results=[{"id": calls[0]["id"], "name": "run_python", "ok": ok}])
                raise Repeating()
            observation = None
        else:
            observation = tools.run_code(code)
            turn.blocks.append(code)
            if observation.ok:
                turn.ran.append(code)
            text, ok, took = observation.text, observation.ok, observation.duration_ms
        finished: str | None = None
        if observation is not None and observation.finished and observation.answer is not None:
            decided = self._finishing(observation.answer, task, turn, record)
            if isinstance(decided, Submitted):
                finished = decided.answer
            else:
                text, ok = decided, False
        elif observation is not None and observation.ok and self._passes_examples(turn, code):
            # A definition that passes the task's examples is handed in, in any turn as after a draft: the
            # 0.5B model, its function right, printed the examples' results again and again and never
            # called finish, until the conversation outgrew its context and the attempt failed.
            assert turn.deliverable is not None  # as _passes_examples checked
            decided = self._finishing(f"{turn.deliverable.file} defines the functions", task, turn, record)
            if isinstance(decided, Submitted):
                finished = decided.answer
                text += "\n\n[the task's examples pass: handed in]"
        if observation is not None:
            repeats.result = text  # what a repeat is told it already has: the refusal, if it was refused
        record("tool", text, tool_results=[{"id": calls[0]["id"], "name": "run_python", "ok": ok}], duration_ms=took)
        turn.calls.append(["run_python", arguments])
        if finished is not None:
            raise Submitted(finished)
        change = turn.hooks(
            "after_tool",
            {
                **turn.data(task),
                "name": "run_python",
                "arguments": arguments,
                "result": text,
                "ok": ok,
                "calls": turn.calls,
            },
            record,
        )
        if change:
            text = change["result"]
        messages.append({"role": "user", "content": f"Output of your code:\n{text}"})

    def _draft_step(
        self, messages: list[dict], tools: TaskTools, task: Task, record, purpose: str, turn: _Turn
    ) -> None:
        """The first turn of a code task with a stub: the model completes the stub as it would alone (the draft
        prompt, no system message, temperature 0). Its code runs in the session; a definition that passes the task's
        examples is handed in at once. Otherwise, up to ``drafts`` in all, the stub is completed again at
        ``draft_temperature`` (all of them in one request of n completions), each tried alike; if none passes, the
        attempt goes on from the draft that passed the most examples (the first of equals), told what failed."""
        assert turn.deliverable is not None  # a draft completes the stub of a deliverable (``task_stub``)
        params = self.scaffold.parameters
        draft = [{"role": "user", "content": turn.draft}]
        change = turn.hooks("before_model", {**turn.data(task), "messages": draft, "tools": []}, record)
        asked = change.get("messages", draft) if change else draft
        names = ", ".join(turn.deliverable.functions)
        drafted: list[tuple[int, str, str, str]] = []  # examples failed, reply, code, observation
        waiting: list[ModelReply] = []  # drafts asked for together, not tried yet
        for n in range(params.drafts):
            if not waiting:
                # The first alone, at temperature 0 (it is handed in if it passes); the rest in one request of
                # n completions at draft_temperature, which llama-server's slots write at once.
                temperature = 0.0 if n == 0 else params.draft_temperature
                more = 1 if n == 0 else params.drafts - n
                first = self._ask(
                    asked, None, task, purpose, temperature=temperature, seed=draft_seed(asked, n), n=more
                )
                waiting = [first] + [_another(first, text) for text in first.others[: more - 1]]
            reply = waiting.pop(0)
            code = draft_code(reply.content, turn.stub, turn.deliverable.functions)
            call = {"id": DRAFT_CALL, "name": "run_python", "arguments": {"code": code}}
            record("assistant", reply.content, reply=reply, tool_calls=[call])
            observation = tools.run_code(code)
            turn.blocks.append(code)
            turn.calls.append(["run_python", call["arguments"]])
            tried = len(turn.tried)
            decided = self._finishing(f"{turn.deliverable.file} defines {names}", task, turn, record, draft=code)
            text = observation.text if isinstance(decided, Submitted) else f"{observation.text}\n\n{decided}"
            record(
                "tool",
                text,
                tool_results=[{"id": DRAFT_CALL, "name": "run_python", "ok": observation.ok}],
                duration_ms=observation.duration_ms,
            )
            if isinstance(decided, Submitted):
                raise decided
            failed = turn.tried[-1][1] if len(turn.tried) > tried else len(turn.examples) + 1  # none: defined nothing
            drafted.append((failed, reply.content, code, text))
        _, content, code, text = min(drafted, key=lambda d: d[0])  # min keeps the first of equals
        if code != turn.blocks[-1]:  # the session goes on from this draft's definitions, as its conversation
            tools.run_code(code)
            turn.blocks.append(code)
        messages.append({"role": "assistant", "content": content})
        messages.append({"role": "user", "content": f"Output of your code:\n{text}"})

    def _finishing(self, answer: str, task: Task, turn: _Turn, record, *, draft: str | None = None) -> Submitted | str:
        decided = self._decide(answer, task, turn, record, draft=draft)
        if isinstance(decided, str):
            turn.said.append(decided)
        return decided

    def _decide(self, answer: str, task: Task, turn: _Turn, record, *, draft: str | None = None) -> Submitted | str:
        """The answer handed in (``before_finish`` may change it), or why the finish was refused: for a code
        task, first its deliverable must be defined and pass the task's own examples (a few rounds; a draft's
        refusal uses none of them). A draft (its code) is tried as it was written, as the model alone's
        completion would be saved, not rebuilt from the session."""
        refusal = "finish was refused: " if draft is None else "Your draft is not handed in yet: "
        refused = self._examples_refuse(turn, counted=draft is None, source=draft)
        if refused:
            return refusal + refused
        if turn.deliverable is None:  # a code task's answer is what it delivers: its words are not read
            answer, refused = self._answer_refuses(answer, turn)
            if refused:
                return refusal + refused
        change = turn.hooks("before_finish", {**turn.data(task), "answer": answer}, record)
        if change and "reject" in change:
            return refusal + change["reject"]
        return Submitted(change["answer"] if change else answer)

    def _passes_examples(self, turn: _Turn, code: str) -> bool:
        """Whether ``code`` defined a requested function and what would be delivered now passes every one of
        the task's examples (a task whose words give none is never handed in unasked)."""
        if turn.deliverable is None or not turn.examples or turn.example_rounds <= 0:
            return False
        if module_source([code], turn.deliverable.functions) is None:
            return False
        return self._examples_refuse(turn, counted=False) is None

    def _reply_as_answer(self, text: str, task: Task, turn: _Turn, record) -> Submitted | str:
        """A reply without code or tool call, read as the answer (``_finishing``) unless it is talk: a long
        reply on a task that asks for an answer (the 0.5B model described its session's output, "The output
        of your code is an empty list, which means…", and that was taken as its answer), until the attempt's
        answer rounds run out. A task that asks for no form of answer and is checked by no answer (a chat
        turn, "explain this") may well be answered at length."""
        shaped = turn.form.shape(text)[0] if turn.form is not None else None
        answer_checked = isinstance(task.check, dict) and task.check.get("type") == "answer" and bool(turn.blocks)
        talk = shaped is None and len(text) > SHORT_ANSWER_CHARS and (turn.form is not None or answer_checked)
        if turn.deliverable is None and talk and turn.answer_rounds > 0:
            turn.answer_rounds -= 1
            wanted = turn.form.words if turn.form is not None else "the answer alone"
            return (
                "A reply without code is taken as your final answer, and this one reads as an explanation, not "
                f"an answer. If you know the answer, call finish(answer) in a python block with {wanted}; "
                "otherwise go on in code."
            )
        return self._finishing(text, task, turn, record)

    @staticmethod
    def _answer_refuses(answer: str, turn: _Turn) -> tuple[str, str | None]:
        """The answer in the form the task asks for, or why it is refused: the loop's own words are never an
        answer; one not in the task's form ("the number only") is refused while answer rounds are left, and
        one that holds the form's answer among other words is shaped to it."""
        if _own_words(answer, turn.said):
            return answer, (
                "that is this conversation's own instruction, not an answer to the task. "
                "Work out the answer, then call finish(answer) with it."
            )
        if turn.form is None:
            return answer, None
        shaped, why = turn.form.shape(answer)
        if shaped is not None:
            return shaped, None
        if turn.answer_rounds <= 0:
            return answer, None
        turn.answer_rounds -= 1
        return answer, f"{why}. Call finish again with {turn.form.words}."

    def _examples_refuse(self, turn: _Turn, counted: bool = True, source: str | None = None) -> str | None:
        """Why a finish is refused now: the requested function is not defined, or the task's examples fail on
        what would be delivered (``source``, or the module rebuilt from the session). None to let it through
        (no deliverable, or no rounds left). Each source tried is kept with its failures, for the hand-in."""
        if turn.deliverable is None or turn.workspace is None or (turn.example_rounds <= 0 and counted):
            return None  # a draft is still refused when it defines nothing: handed in, it would deliver nothing
        deliverable = turn.deliverable
        found, own = delivered_source(turn.workspace, deliverable, turn.blocks)
        if own or source is None or module_source([source], deliverable.functions) is None:
            source = found  # a file of the agent's own wins; a draft that defines nothing is no candidate
        names = ", ".join(f"`{f}`" for f in deliverable.functions)
        if source is None:
            turn.example_rounds -= 1 if counted else 0
            return (
                f"{names} is not defined yet (a docstring alone is no definition). "
                f"Write it with its whole body"
                + (" in a python block" if turn.code else " (run_python, or write_file " + deliverable.file + ")")
                + ", then finish again."
            )
        if not turn.examples or turn.example_rounds <= 0:  # no examples, or none to be tried (example_rounds 0)
            if not own:
                turn.tried.append((source, 0))
            return None
        failures = try_examples(self.sandbox, turn.workspace, deliverable.file, source, turn.examples, self.limits)
        if not own:
            turn.tried.append((source, len(failures)))
        if not failures:
            return None
        turn.example_rounds -= 1 if counted else 0
        shown = "\n".join(f"- {clip(f, 300)}" for f in failures[:6])
        return (
            f"the task's own examples fail on what would be saved to {deliverable.file}:"
            f"\n{shown}\nFix {names}, print the examples' results to check them, then finish again."
        )

    @staticmethod
    def _repeat_note(name: str, times: int, result: str, stop: bool) -> str:
        if stop:
            return (
                f"This attempt ends here: {name} was called with the same arguments {times} times in a row, "
                "and repeating it cannot give anything new."
            )
        return (
            f"You have called {name} with these same arguments {times} times in a row; it was not run again. "
            f"Its result was:\n{result}\nYou already have that. Do something else: another tool, other "
            "arguments, or call finish with your answer."
        )

    @staticmethod
    def _tool_message(reply: ModelReply, call, text: str) -> dict:
        if "tool_calls" in reply.assistant_message:
            return {"role": "tool", "tool_call_id": call.id, "content": text}
        return {"role": "user", "content": f"Result of {call.name}:\n{text}"}  # JSON-in-text models

    def _reflect(
        self, trajectory_id: str, task: Task, messages: list[dict], verdict: Verdict, on_step, purpose: str
    ) -> str:
        prompt = self.scaffold.prompts.reflection.format(task=shown_task(task), verdict=verdict.for_learner)
        reply = self._ask(
            messages + [{"role": "user", "content": prompt}], None, task, purpose, max_tokens=self.reflection_tokens
        )
        self._recorder(trajectory_id, on_step)("reflection", reply.content, reply=reply)
        return reply.content


def _own_words(answer: str, said: list[str]) -> bool:
    """Whether an answer is the loop's own words given back: it stands inside one of the loop's messages (the
    repeat guard's, a refusal, the last-answer turn's), or holds a long run of one. Short answers never are:
    "42" may well appear in an instruction."""
    text = " ".join(answer.split()).casefold()
    if len(text) < 16:
        return False
    for message in said:
        words = " ".join(message.split()).casefold()
        if text in words:
            return True
        if len(words) >= 40 and any(words[i : i + 40] in text for i in range(0, len(words) - 39, 10)):
            return True
    return False


def shown_task(task: Task) -> str:
    """The task as the model is shown it: its words, then the files it came with, pasted (``given``)."""
    return task_text(task.prompt, task.metadata.get("files"))


def task_deliverable(task: Task) -> Deliverable | None:
    """What the task asks to be handed in: its metadata's ``deliver`` if it has one (and names it well), else
    the file and functions its words ask for (``asks.deliverable_in_words``)."""
    data = task.metadata.get("deliver")
    if data is None:
        return deliverable_in_words(task.prompt, set(task.metadata.get("files") or {}))
    try:
        return parse_deliverable(data)
    except ValueError as exc:  # the doors refuse a bad one; an old row is only not used
        log.warning("task %s: its deliverable is not used: %s", task.id, exc)
        return None
