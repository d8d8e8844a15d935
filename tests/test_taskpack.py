"""The bundled task packs are sound, and the loader refuses bad packs with file and line.

For every task of ``evolver/data/packs/basic.jsonl`` and ``prose.jsonl`` a reference
solution (``tests/data/basic_solutions.json``, ``prose_solutions.json``) passes the task's
own check in the real bubblewrap sandbox, and a wrong attempt (the task's files untouched,
the answer "wrong") fails it: no check is vacuous, none is unsatisfiable.

A reference solution is ``{"answer": ..., "files": {path: text}, "run": "sh command"}``,
every key optional: the files the agent would write, and a shell command it would
run in the workspace (for renames, moves and deletions, which files cannot express).
Its ``near_misses`` are attempts of the same shape that make a classic mistake
(off by one, glob order, copy instead of move...); each must fail.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from evolver.judge.catalog import resolve_pack
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


def _solutions(name: str) -> dict[str, dict]:
    return json.loads((Path(__file__).parent / "data" / f"{name}_solutions.json").read_text(encoding="utf-8"))


PACK = bundled_pack("basic")
SOLUTIONS: dict[str, dict] = _solutions("basic")
PROSE = bundled_pack("prose")
PROSE_SOLUTIONS: dict[str, dict] = _solutions("prose")
PACKS = {"basic": (PACK, SOLUTIONS), "prose": (PROSE, PROSE_SOLUTIONS)}
"""Every bundled pack with reference solutions: its tasks and their solutions."""
TASKS = [task for pack, _ in PACKS.values() for task in pack]
REFERENCE = {task_id: s for _, solutions in PACKS.values() for task_id, s in solutions.items()}
LIMITS = Limits(timeout_s=30)
KINDS = ("arith", "text", "files", "func")
PROSE_KINDS = {"fn": 20, "data": 8, "file": 6, "math": 10}
"""The prose pack's kinds of task (the id's prefix), and how many of each it has at least."""
CODE_PREFIXES = ("func-", "fn-")


def _kind(task: PackTask) -> str:
    check = task.check
    return f"answer:{check.match}" if isinstance(check, AnswerCheck) else check.type


# -- the pack as a whole ---------------------------------------------------------------------------


def test_the_packs_ids_are_unique_across_packs():
    assert len({t.id for t in TASKS}) == len(TASKS) == len(REFERENCE)


@pytest.mark.parametrize("name", PACKS)
def test_bundled_packs_load_by_name(name):
    assert [t.id for t in resolve_pack(name)] == [t.id for t in PACKS[name][0]]


@pytest.mark.parametrize("name", PACKS)
def test_pack_size_ids_and_splits(name):
    pack = PACKS[name][0]
    assert len(pack) >= 40
    ids = [t.id for t in pack]
    assert len(ids) == len(set(ids))
    splits = Counter(t.split for t in pack)
    assert set(splits) == set(SPLITS)
    assert 0.2 <= splits["test"] / len(pack) <= 0.35, splits


def test_pack_covers_every_kind_of_check_and_task():
    assert {_kind(t) for t in PACK} == {"answer:exact", "answer:numeric", "answer:regex", "command", "python"}
    by_prefix = Counter(t.id.split("-")[0] for t in PACK)
    assert set(by_prefix) == set(KINDS)
    assert min(by_prefix.values()) >= len(PACK) // len(KINDS) - 2, by_prefix
    for prefix in KINDS:  # every kind is held out too
        assert {t.split for t in PACK if t.id.startswith(prefix + "-")} == set(SPLITS), prefix


@pytest.mark.parametrize("name", PACKS)
def test_tasks_are_tagged_small_and_solved(name):
    pack, solutions = PACKS[name]
    assert set(solutions) == {t.id for t in pack}
    for task in pack:
        assert task.tags, task.id
        size = sum(len(text.encode()) for text in task.files.values())
        size += sum(len(text.encode()) for text in getattr(task.check, "files", {}).values())
        assert size <= 4096, (task.id, size)
        assert set(solutions[task.id]) <= {"answer", "files", "run", "near_misses"}, task.id


@pytest.mark.parametrize("name", PACKS)
def test_check_files_do_not_clobber_task_files(name):
    """A check's files are written over the workspace; they must not replace what the task gives."""
    for task in PACKS[name][0]:
        overlap = set(getattr(task.check, "files", {})) & set(task.files)
        assert not overlap, (task.id, overlap)


# -- the prose pack: tasks as people write them -----------------------------------------------------


def _module_and_functions(task: PackTask) -> tuple[str, list[str]]:
    """The module a prose code task's check loads, and the functions it takes from it."""
    code = task.check.code
    (module,) = re.findall(r"solution\('(\w+)'\)", code)
    return module, re.findall(r"= attempt\.(\w+)", code)


def test_prose_pack_covers_its_kinds():
    by_prefix = Counter(t.id.split("-")[0] for t in PROSE)
    assert set(by_prefix) == set(PROSE_KINDS)
    for prefix, least in PROSE_KINDS.items():
        assert by_prefix[prefix] >= least, by_prefix
        assert {t.split for t in PROSE if t.id.startswith(prefix + "-")} == set(SPLITS), prefix  # held out too
    for task in PROSE:
        if task.id.startswith(("data-", "math-")):
            assert isinstance(task.check, AnswerCheck), task.id
        else:
            assert isinstance(task.check, PythonCheck), task.id
    assert {_kind(t) for t in PROSE} >= {"answer:exact", "answer:numeric", "answer:regex", "python"}
    # files to read, not to write: the task names a file it gives, which the check wants left as it was
    reads = [t for t in PROSE if t.id.startswith("file-") and "read" in t.tags]
    assert len(reads) >= 2 and all(t.files for t in reads)
    for task in reads:
        given = set(task.files)
        assert any(given & set(m.get("files", {})) for m in PROSE_SOLUTIONS[task.id]["near_misses"]), task.id


def test_prose_tasks_say_what_they_want_in_words_only():
    """No deliverable, no stub to fill in, no doctest: the file and function are named in the prose."""
    for task in PROSE:
        assert task.deliver is None, task.id
        assert ">>>" not in task.prompt and '"""' not in task.prompt, task.id
        assert PROSE_SOLUTIONS[task.id].get("near_misses"), task.id  # a classic mistake for every task
        if task.id.startswith("fn-"):
            assert not task.files, task.id  # nothing to start from
            module, functions = _module_and_functions(task)
            assert f"{module}.py" in task.prompt, task.id
            assert functions and all(f"{name}(" in task.prompt for name in functions), task.id
            assert set(REFERENCE[task.id]["files"]) == {f"{module}.py"}, task.id
    code_prompts = [t.prompt for t in PROSE if t.id.startswith("fn-")]
    assert len({p.split()[0] for p in code_prompts}) >= 8, "the code tasks' phrasings should vary"
    basic_prompts = {t.prompt for t in PACK}
    assert not basic_prompts & {t.prompt for t in PROSE}


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


@pytest.mark.parametrize("task", TASKS, ids=_ids(TASKS))
def test_reference_solution_passes(task: PackTask, box, tmp_path):
    verdict = _attempt(box, tmp_path, task, REFERENCE[task.id])
    assert verdict.success, verdict.output
    assert verdict.score == 1.0


NEAR_MISSES = [(task, miss) for task in TASKS for miss in REFERENCE[task.id].get("near_misses", [])]


@pytest.mark.parametrize("task, miss", NEAR_MISSES, ids=[f"{t.id}: {m['why']}" for t, m in NEAR_MISSES])
def test_a_classic_mistake_fails(task: PackTask, miss: dict, box, tmp_path):
    """Plausible wrong solutions (off by one, glob order, copy instead of move...) are refused."""
    verdict = _attempt(box, tmp_path, task, miss)
    assert not verdict.success, f"{task.id}: {miss['why']} passes: {verdict.output}"


@pytest.mark.parametrize("task", TASKS, ids=_ids(TASKS))
def test_wrong_attempt_fails(task: PackTask, box, tmp_path):
    workspace = _workspace(box, tmp_path, task.files)
    verdict = verify(task.check, answer="wrong", sandbox=box, workspace=workspace, limits=LIMITS)
    assert not verdict.success, f"{task.id}: an untouched workspace passes: {verdict.output}"
    assert verdict.output


def _stubs(files: dict[str, str]) -> dict[str, str]:
    """The reference's Python files with every top-level function's body replaced by ``return None``."""
    stubbed = {}
    for path, text in files.items():
        if path.endswith(".py"):
            names = [n.name for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)]
            stubbed[path] = "".join(f"def {name}(*args, **kwargs):\n    return None\n\n\n" for name in names)
    return stubbed


STUBBED = [t for t in TASKS if t.id.startswith(CODE_PREFIXES) and _stubs(REFERENCE[t.id].get("files", {}))]


@pytest.mark.parametrize("task", STUBBED, ids=_ids(STUBBED))
def test_a_stub_returning_none_fails(task: PackTask, box, tmp_path):
    """A code task's check refuses its functions defined to return None: it tests what they return."""
    verdict = _attempt(box, tmp_path, task, {"files": _stubs(REFERENCE[task.id]["files"])})
    assert not verdict.success, f"{task.id}: a stub passes: {verdict.output}"


@pytest.mark.parametrize(
    "task",
    [t for t in TASKS if isinstance(t.check, AnswerCheck)],
    ids=_ids(t for t in TASKS if isinstance(t.check, AnswerCheck)),
)
def test_answer_tasks_refuse_no_answer_and_near_misses(task: PackTask):
    """No answer fails; nor does the right one with its last digit changed (tolerances are tight)."""

    def passes(answer):
        return verify(task.check, answer=answer, sandbox=None, workspace=".").success  # type: ignore[arg-type]

    right = REFERENCE[task.id]["answer"]
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
    for task in TASKS:
        if task.id.startswith(CODE_PREFIXES):
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
