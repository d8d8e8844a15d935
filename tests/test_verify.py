"""Checks are validated where they enter, and the verifier judges in the sandbox."""

from __future__ import annotations

import pytest

from evolver.judge.checks import CheckError, parse_check
from evolver.judge.verify import verify


def judge(check: dict, answer, sandbox, workspace):
    return verify(parse_check(check), answer=answer, sandbox=sandbox, workspace=workspace)


@pytest.mark.parametrize(
    ("check", "answer", "success"),
    [
        ({"type": "answer", "expected": "165"}, " 165\n", True),
        ({"type": "answer", "expected": "165"}, "165 minutes", False),
        ({"type": "answer", "expected": "Paris", "casefold": True}, "paris", True),
        ({"type": "answer", "expected": 397.8, "match": "numeric"}, "397.80", True),
        ({"type": "answer", "expected": "1,024", "match": "numeric"}, "1024", True),
        ({"type": "answer", "expected": 3, "match": "numeric"}, "It is 3 apples", True),
        ({"type": "answer", "expected": 0.3333, "match": "numeric", "tolerance": 0.001}, "0.33329", True),
        ({"type": "answer", "expected": 2, "match": "numeric"}, "2 or 3", False),
        ({"type": "answer", "expected": "[a-z]+@[a-z]+\\.com", "match": "regex"}, "bob@mail.com", True),
        ({"type": "answer", "expected": "[a-z]+", "match": "regex"}, "abc1", False),
        ({"type": "answer", "expected": "x"}, None, False),
    ],
)
def test_answer_checks(sandbox, tmp_path, check, answer, success):
    assert judge(check, answer, sandbox, tmp_path).success is success


def test_command_checks_run_in_the_workspace(sandbox, tmp_path):
    (tmp_path / "out.txt").write_text("hello\n")
    passed = judge({"type": "command", "command": "grep -q hello out.txt"}, None, sandbox, tmp_path)
    assert passed.success and passed.output.startswith("`grep -q hello out.txt` exited 0")
    failed = judge({"type": "command", "command": "test -f missing.txt"}, None, sandbox, tmp_path)
    assert not failed.success and "exited 1" in failed.output


def test_a_check_file_overrides_what_the_agent_left_there(sandbox, tmp_path):
    (tmp_path / "out.txt").write_text("4\n")
    (tmp_path / "expected.txt").write_text("4\n")  # the agent's "fix"
    check = {"type": "command", "command": "cmp -s out.txt expected.txt", "files": {"expected.txt": "5\n"}}
    verdict = judge(check, None, sandbox, tmp_path)
    assert not verdict.success and "exited 1" in verdict.output
    assert (tmp_path / "expected.txt").read_text() == "5\n"


def test_a_command_check_that_would_import_the_attempt_is_refused():
    check = {
        "type": "command",
        "command": "python3 test_solution.py",
        "files": {"test_solution.py": "import unittest\nfrom solution import add\nassert add(2, 3) == 5\n"},
    }
    with pytest.raises(CheckError, match=r"test_solution.py imports solution.*os._exit\(0\).*solution\('solution'\)"):
        parse_check(check)
    # its own helper files, and the standard library, are fine
    parse_check(
        {
            "type": "command",
            "command": "python3 t.py",
            "files": {"t.py": "import json, helpers\n", "helpers.py": "import os.path\n"},
        }
    )


def test_a_python_check_reaches_the_attempt_through_solution_and_run(sandbox, tmp_path):
    (tmp_path / "solution.py").write_text(
        "def add(a, b):\n    print('working')\n    return a + b\ndef grow(items):\n    items.append(len(items))\n"
    )
    (tmp_path / "hello.py").write_text("import sys\nprint('hi', sys.stdin.read())\n")
    code = (
        "def check(answer, workspace):\n"
        "    attempt = solution()\n"
        "    items = [1]\n"
        "    attempt.grow(items)\n"
        "    ran = run(['python3', 'hello.py'], stdin='you')\n"
        "    return attempt.add(2, 3) == 5 and items == [1, 1] and ran.stdout == 'hi you\\n', 'fine'\n"
    )
    verdict = judge({"type": "python", "code": code}, None, sandbox, tmp_path)
    assert verdict.success, verdict.output
    importing = (
        "def check(answer, workspace):\n    import sys\n    sys.path.insert(0, workspace)\n    import solution\n"
    )
    verdict = judge({"type": "python", "code": importing}, None, sandbox, tmp_path)
    assert not verdict.success and "may not import solution from the workspace" in verdict.output


def test_catastrophic_regex_gives_a_verdict_in_time():
    check = parse_check({"type": "answer", "expected": "(a+)+$", "match": "regex"})
    verdict = verify(check, answer="a" * 10_000 + "!", sandbox=None, workspace=".")  # type: ignore[arg-type]
    assert not verdict.success and verdict.verifier == "answer:regex"


def test_an_overlong_answer_fails_unread():
    check = parse_check({"type": "answer", "expected": 7, "match": "numeric"})
    verdict = verify(check, answer="7" + " " * 200_000, sandbox=None, workspace=".")  # type: ignore[arg-type]
    assert not verdict.success and "characters long" in verdict.output


def test_python_checker_gets_the_answer_and_the_workspace(sandbox, tmp_path):
    (tmp_path / "result.txt").write_text("42")
    code = (
        "def check(answer, workspace):\n"
        "    import os\n"
        "    with open(os.path.join(workspace, 'result.txt')) as f:\n"
        "        return f.read() == answer, 'compared result.txt with the answer'\n"
    )
    assert (
        judge({"type": "python", "code": code}, "42", sandbox, tmp_path).output == "compared result.txt with the answer"
    )
    assert not judge({"type": "python", "code": code}, "41", sandbox, tmp_path).success


def test_a_checker_that_crashes_is_a_failure_with_its_traceback(sandbox, tmp_path):
    verdict = judge(
        {"type": "python", "code": "def check(answer, workspace):\n    raise ValueError('boom')\n"},
        "x",
        sandbox,
        tmp_path,
    )
    assert not verdict.success and "ValueError: boom" in verdict.output


def test_modules_planted_in_the_workspace_cannot_fake_a_verdict(sandbox, tmp_path):
    (tmp_path / "json.py").write_text(
        'def loads(s):\n    return \'right\'\ndef dumps(o):\n    return \'{"success": true, "message": "hacked"}\'\n'
    )
    verdict = judge(
        {"type": "python", "code": "def check(answer, workspace):\n    return answer == 'right'\n"},
        "wrong",
        sandbox,
        tmp_path,
    )
    assert not verdict.success and verdict.output == "check failed"


@pytest.mark.parametrize(
    ("check", "message"),
    [
        ("answer 42", "a check is an object"),
        ({"type": "oracle"}, "check type must be answer, command or python"),
        ({"type": "answer"}, "expected: Field required"),
        ({"type": "answer", "expected": "abc", "match": "numeric"}, "needs a number as expected"),
        ({"type": "answer", "expected": "(", "match": "regex"}, "not a valid regex"),
        ({"type": "command", "command": ""}, "command: String should have at least 1 character"),
        ({"type": "command", "command": "true", "files": {"/etc/x": ""}}, "must be a relative path"),
        ({"type": "python", "code": "def nope(:"}, "does not parse"),
        ({"type": "python", "code": "def verify(answer, workspace): pass"}, "must define a top-level function check"),
        ({"type": "answer", "expected": "1", "weight": 2}, "weight: Extra inputs are not permitted"),
    ],
)
def test_bad_checks_are_refused_naming_the_problem(check, message):
    with pytest.raises(CheckError, match=message):
        parse_check(check)


@pytest.mark.parametrize("planted", ["unittest.py", "json"])
def test_a_planted_standard_library_module_cannot_decide_a_command_check(sandbox, tmp_path, planted):
    # The attempt plants a stand-in for a module the check's test imports, which would pass it.
    fake = "import sys\nsys.exit(0)\nclass TestCase: pass\ndef main(): pass\ndumps = str\n"
    if planted.endswith(".py"):
        (tmp_path / planted).write_text(fake)
    else:
        (tmp_path / planted).mkdir()
        (tmp_path / planted / "__init__.py").write_text(fake)
    (tmp_path / "solution.py").write_text("def add(a, b):\n    return a - b\n")
    (tmp_path / "out.json").write_text('{"sum": -1}')
    check = {
        "type": "command",
        "command": "python3 test_out.py",
        "files": {
            "test_out.py": "import unittest, json\n"
            "assert json.load(open('out.json')) == {'sum': 5}, 'the sum is wrong'\n"
        },
    }
    verdict = judge(check, None, sandbox, tmp_path)
    assert not verdict.success and f"the workspace holds {planted}" in verdict.output
    (tmp_path / "out.json").write_text('{"sum": 5}')
    (tmp_path / planted).rename(tmp_path / "helpers")  # the same files under an honest name
    assert judge(check, None, sandbox, tmp_path).success
