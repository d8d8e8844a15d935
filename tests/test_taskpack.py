"""The bundled task pack is sound, and the loader refuses bad packs with file and line.

For every task of ``evolver/data/packs/basic.jsonl`` a reference solution
(``tests/data/basic_solutions.json``) passes the task's own check in the real
bubblewrap sandbox, and a wrong attempt (the task's files untouched, the answer
"wrong") fails it: no check is vacuous, none is unsatisfiable.

A reference solution is ``{"answer": ..., "files": {path: text}, "run": "sh command"}``,
every key optional: the files the agent would write, and a shell command it would
run in the workspace (for renames, moves and deletions, which files cannot express).
Its ``near_misses`` are attempts of the same shape that make a classic mistake
(off by one, glob order, copy instead of move...); each must fail.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from evolver.judge.checks import AnswerCheck, PythonCheck
from evolver.judge.taskpack import (
    SPLITS,
    PackTask,
    TaskPackError,
    bundled_pack,
    load_pack,
    parse_pack,
)
from evolver.judge.verify import verify
from sandbox import Limits, write_text

PACK = bundled_pack("basic")
SOLUTIONS: dict[str, dict] = json.loads(
    (Path(__file__).parent / "data" / "basic_solutions.json").read_text(encoding="utf-8")
)
LIMITS = Limits(timeout_s=30)
KINDS = ("arith", "text", "files", "func")


def _kind(task: PackTask) -> str:
    check = task.check
    return f"answer:{check.match}" if isinstance(check, AnswerCheck) else check.type


# -- the pack as a whole ---------------------------------------------------------------------------


def test_pack_size_ids_and_splits():
    assert len(PACK) >= 40
    ids = [t.id for t in PACK]
    assert len(ids) == len(set(ids))
    splits = Counter(t.split for t in PACK)
    assert set(splits) == set(SPLITS)
    assert 0.2 <= splits["test"] / len(PACK) <= 0.35, splits


def test_pack_covers_every_kind_of_check_and_task():
    assert {_kind(t) for t in PACK} == {"answer:exact", "answer:numeric", "answer:regex", "command", "python"}
    by_prefix = Counter(t.id.split("-")[0] for t in PACK)
    assert set(by_prefix) == set(KINDS)
    assert min(by_prefix.values()) >= len(PACK) // len(KINDS) - 2, by_prefix
    for prefix in KINDS:  # every kind is held out too
        assert {t.split for t in PACK if t.id.startswith(prefix + "-")} == set(SPLITS), prefix


def test_tasks_are_tagged_small_and_solved():
    assert set(SOLUTIONS) == {t.id for t in PACK}
    for task in PACK:
        assert task.tags, task.id
        size = sum(len(text.encode()) for text in task.files.values())
        size += sum(len(text.encode()) for text in getattr(task.check, "files", {}).values())
        assert size <= 4096, (task.id, size)
        assert set(SOLUTIONS[task.id]) <= {"answer", "files", "run", "near_misses"}, task.id


def test_check_files_do_not_clobber_task_files():
    """A check's files are written over the workspace; they must not replace what the task gives."""
    for task in PACK:
        overlap = set(getattr(task.check, "files", {})) & set(task.files)
        assert not overlap, (task.id, overlap)


# -- every task, in the real sandbox ------------------------------------------------------------


def _workspace(box, root: Path, *file_sets: dict[str, str]) -> Path:
    """A fresh workspace owned by the sandbox user, seeded with ``file_sets`` in order."""
    workspace = root / "ws"
    workspace.mkdir()
    box.workspace_dir(workspace)  # hand it to the sandbox user first: seeded files and folders follow
    for files in file_sets:
        for path, text in files.items():
            write_text(workspace, path, text)
    return workspace


def _ids(tasks):
    return [t.id for t in tasks]


def _attempt(box, root: Path, task: PackTask, attempt: dict):
    """Play one attempt (its files, then its run) in a fresh workspace and judge it."""
    workspace = _workspace(box, root, task.files, attempt.get("files", {}))
    if "run" in attempt:
        ran = box.run(["/bin/sh", "-c", attempt["run"]], workspace=workspace, limits=LIMITS)
        assert ran.ok, f"the attempt's run failed: {ran.stdout}\n{ran.stderr}\n{ran.error or ''}"
    return verify(task.check, answer=attempt.get("answer"), sandbox=box, workspace=workspace, limits=LIMITS)


@pytest.mark.parametrize("task", PACK, ids=_ids(PACK))
def test_reference_solution_passes(task: PackTask, box, tmp_path):
    verdict = _attempt(box, tmp_path, task, SOLUTIONS[task.id])
    assert verdict.success, verdict.output
    assert verdict.score == 1.0


NEAR_MISSES = [(task, miss) for task in PACK for miss in SOLUTIONS[task.id].get("near_misses", [])]


@pytest.mark.parametrize("task, miss", NEAR_MISSES, ids=[f"{t.id}: {m['why']}" for t, m in NEAR_MISSES])
def test_a_classic_mistake_fails(task: PackTask, miss: dict, box, tmp_path):
    """Plausible wrong solutions (off by one, glob order, copy instead of move...) are refused."""
    verdict = _attempt(box, tmp_path, task, miss)
    assert not verdict.success, f"{task.id}: {miss['why']} passes: {verdict.output}"


@pytest.mark.parametrize("task", PACK, ids=_ids(PACK))
def test_wrong_attempt_fails(task: PackTask, box, tmp_path):
    workspace = _workspace(box, tmp_path, task.files)
    verdict = verify(task.check, answer="wrong", sandbox=box, workspace=workspace, limits=LIMITS)
    assert not verdict.success, f"{task.id}: an untouched workspace passes: {verdict.output}"
    assert verdict.output


@pytest.mark.parametrize(
    "task",
    [t for t in PACK if isinstance(t.check, AnswerCheck)],
    ids=_ids(t for t in PACK if isinstance(t.check, AnswerCheck)),
)
def test_answer_tasks_refuse_no_answer_and_near_misses(task: PackTask):
    """No answer fails; nor does the right one with its last digit changed (tolerances are tight)."""

    def passes(answer):
        return verify(task.check, answer=answer, sandbox=None, workspace=".").success  # type: ignore[arg-type]

    right = SOLUTIONS[task.id]["answer"]
    assert passes(right)
    assert not passes(None) and not passes("")
    digits = [i for i, c in enumerate(right) if c.isdigit()]
    if digits:
        i = digits[-1]
        near = right[:i] + str((int(right[i]) + 1) % 10) + right[i + 1 :]
    else:
        near = right[:-1]
    assert not passes(near), (right, near)


def test_answer_tasks_accept_the_answer_in_natural_forms():
    """Numeric checks take "$11.50", "1,124.86" and "75 km/h"; checks of other kinds take stray spaces."""
    by_id = {t.id: t for t in PACK}
    for task_id, answer in [
        ("arith-01", "$11.50"),
        ("arith-05", "1,124.86"),
        ("arith-02", "75 km/h"),
        ("arith-05", "1124.864"),
        ("text-09", "sam okafor"),
        ("arith-11", " 5 / 36 "),
        ("text-10", "api, cache, worker"),
        ("arith-06", "12:35\n"),
    ]:
        verdict = verify(by_id[task_id].check, answer=answer, sandbox=None, workspace=".")  # type: ignore[arg-type]
        assert verdict.success, (task_id, answer, verdict.output)


def test_code_tasks_run_the_attempt_outside_the_checker():
    """Code tasks are Python checks whose tests live in the check's code (out of the attempt's reach),
    and which reach the attempt only through solution() or run(): never by importing it."""
    for task in PACK:
        if task.id.startswith("func-"):
            assert isinstance(task.check, PythonCheck), task.id
            assert "solution(" in task.check.code or "run(" in task.check.code, task.id
            assert not any(p.endswith(".py") for p in task.check.files), task.id


def test_a_planted_unittest_module_does_not_pass_a_code_task(box, tmp_path):
    """The pack's test files import the standard library before the workspace joins the import path."""
    task = next(t for t in PACK if t.id == "func-01")
    fake = "import os\nclass TestCase: pass\ndef main(): os._exit(0)\n"
    workspace = _workspace(
        box, tmp_path, task.files, {"unittest.py": fake, "solution.py": "def fizzbuzz(n): return []\n"}
    )
    verdict = verify(task.check, answer=None, sandbox=box, workspace=workspace, limits=LIMITS)
    assert not verdict.success, verdict.output


def test_a_test_file_the_agent_writes_plays_no_part(box, tmp_path):
    task = next(t for t in PACK if t.id == "func-02")
    workspace = _workspace(box, tmp_path, {"test_solution.py": "print('all good')\n"})
    verdict = verify(task.check, answer=None, sandbox=box, workspace=workspace, limits=LIMITS)
    assert not verdict.success, verdict.output


def test_python_checks_do_not_trust_a_planted_json_module(box, tmp_path):
    task = next(t for t in PACK if t.id == "text-05")
    assert isinstance(task.check, PythonCheck)
    right = json.loads(SOLUTIONS["text-05"]["files"]["inventory.json"])
    planted = f"def load(*a, **k): return {right!r}\nloads = load\n"  # what the checker would see
    workspace = _workspace(box, tmp_path, task.files, {"json.py": planted, "inventory.json": "{}"})
    verdict = verify(task.check, answer=None, sandbox=box, workspace=workspace, limits=LIMITS)
    assert not verdict.success, verdict.output


# -- the loader's refusals ---------------------------------------------------------------------

GOOD = {
    "id": "t-1",
    "prompt": "What is 2+2? Answer with the number only.",
    "check": {"type": "answer", "expected": "4"},
}


def _line(**changes) -> str:
    data = {**GOOD, **changes}
    return json.dumps({k: v for k, v in data.items() if v is not None})


def _refusal(text: str, source: str = "bad.jsonl") -> str:
    with pytest.raises(TaskPackError) as caught:
        parse_pack(text, source)
    return str(caught.value)


def test_a_good_line_loads():
    [task] = parse_pack("# a comment\n\n" + _line() + "\n", "good.jsonl")
    assert task.id == "t-1" and task.split == "train" and task.files == {} and task.tags == ()


@pytest.mark.parametrize(
    "bad_line, words",
    [
        ('{"id": "t-2", "prompt": "x", ', "not valid JSON"),
        ('["a", "list"]', "a task is a JSON object"),
        (_line(id="t-2", check=None), "has no check"),
        (_line(id="t-2", colour="red"), "unknown keys ['colour']"),
        (_line(id="t-2", split="dev"), "split must be one of"),
        (_line(id="t-2", files={"../outside.txt": "x"}), "must be relative, inside the workspace"),
        (_line(id="t-2", files={"/etc/passwd": "x"}), "must be relative, inside the workspace"),
        (_line(id="t-2", files={"data/../../up.txt": "x"}), "must be relative, inside the workspace"),
        (
            _line(id="t-2", check={"type": "command", "command": "true", "files": {"../t.py": "x"}}),
            "must be a relative path inside the workspace",
        ),
        (
            _line(id="t-2", check={"type": "answer", "expected": "(unclosed", "match": "regex"}),
            "expected is not a valid regex",
        ),
        (
            _line(id="t-2", check={"type": "answer", "expected": "forty-two", "match": "numeric"}),
            "a numeric check needs a number",
        ),
        (
            _line(id="t-2", check={"type": "python", "code": "def chek(answer, workspace): return True"}),
            "must define a top-level function check",
        ),
        (
            _line(id="t-2", check={"type": "python", "code": "def check(answer, workspace):\nreturn True"}),
            "does not parse",
        ),
        (_line(id="t-2", check={"type": "shell", "command": "true"}), "check type must be"),
        (_line(id="t-2", tags="math"), "tags must be a list of strings"),
        (_line(id="t-2", prompt=" "), "prompt must be a non-empty string"),
        (_line(id=""), "id must be a non-empty string"),
        (_line(id="t-2", files={"a.txt": 3}), "files must map relative paths to text"),
    ],
    ids=[
        "json",
        "not-object",
        "no-check",
        "unknown-key",
        "split",
        "dotdot",
        "absolute",
        "dotdot-inner",
        "check-file-escapes",
        "regex",
        "numeric",
        "no-check-function",
        "checker-syntax",
        "check-type",
        "tags",
        "empty-prompt",
        "empty-id",
        "file-not-text",
    ],
)
def test_a_bad_line_is_refused_with_file_and_line(bad_line, words):
    message = _refusal(f"# comment\n{_line()}\n\n{bad_line}\n")
    assert "bad.jsonl:4:" in message, message
    assert words in message, message


def test_a_duplicate_id_names_both_lines():
    message = _refusal(f"{_line()}\n{_line(prompt='again')}\n")
    assert "bad.jsonl:2: duplicate id 't-1' (first on line 1)" in message


def test_every_bad_line_is_listed_and_none_is_kept():
    message = _refusal(f"{_line(id='a', split='x')}\n{_line(id='b')}\nnot json\n")
    assert "bad.jsonl:1:" in message and "bad.jsonl:3:" in message and "bad.jsonl:2:" not in message


def test_an_empty_pack_is_refused():
    assert "the pack has no tasks" in _refusal("# only a comment\n\n")


def test_load_pack_names_the_file(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(f"{_line()}\n{{broken\n", encoding="utf-8")
    with pytest.raises(TaskPackError, match=rf"{path}:2: not valid JSON"):
        load_pack(path)
    with pytest.raises(TaskPackError, match="cannot be read"):
        load_pack(tmp_path / "missing.jsonl")
    path.write_text(_line() + "\n", encoding="utf-8")
    assert [t.id for t in load_pack(path)] == ["t-1"]


def test_an_unknown_bundled_pack_is_refused():
    with pytest.raises(TaskPackError, match="no bundled pack named 'nope'"):
        bundled_pack("nope")
