"""Tool specs from typed signatures, the registry, and tool calls run in the real sandbox."""

from __future__ import annotations

import pytest

from tools import TaskTools, ToolRegistry, ToolSpecError, builtin_specs, schema_for_call, spec_from_source

COLUMN_SUM = '''
def column_sum(path: str, column: str, skip_blank: bool = True) -> float:
    """Sum a numeric column of a CSV file.

    Args:
        path: the CSV file, relative to the workspace.
        column: the header of the column.
    """
    import csv
    with open(path, newline="") as handle:
        return sum(float(row[column]) for row in csv.DictReader(handle) if row[column] or not skip_blank)
'''


def test_schema_is_derived_from_the_signature_and_docstring():
    spec = spec_from_source(COLUMN_SUM)
    assert spec.name == "column_sum" and spec.description == "Sum a numeric column of a CSV file."
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "the CSV file, relative to the workspace."},
            "column": {"type": "string", "description": "the header of the column."},
            "skip_blank": {"type": "boolean", "default": True},
        },
        "required": ["path", "column"],
        "additionalProperties": False,
    }
    assert spec.returns == {"type": "number"}


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("def broken(:\n  pass", "does not parse"),
        ("def no_doc(x: int) -> int:\n    return x", "has no docstring"),
        ('def untyped(x):\n    """Doc."""', "has no type annotation"),
        ('def star(*args: int):\n    """Doc."""', "cannot be described"),
        ('def odd(x: set[int]):\n    """Doc."""', "annotation tools cannot take"),
        ('def one(x: int):\n    """Doc."""\ndef two(y: int):\n    """Doc."""', "exactly one public function"),
        ('def BadName(x: int):\n    """Doc."""', "lower_snake_case"),
    ],
)
def test_code_that_cannot_be_a_tool_is_refused_with_the_rule_it_breaks(code, message):
    with pytest.raises(ToolSpecError, match=message):
        spec_from_source(code)


def test_argument_checking_names_each_problem():
    spec = spec_from_source(COLUMN_SUM)
    assert schema_for_call(spec, {"path": "a.csv", "column": "x"}) == []
    assert schema_for_call(spec, {"path": 3, "extra": 1}) == [
        "missing required argument 'column'",
        "unknown argument 'extra' (known: path, column, skip_blank)",
        "argument 'path' must be string, not int",
    ]
    assert schema_for_call(spec, ["a.csv"]) == ["arguments must be a JSON object"]
    assert schema_for_call(spec, {"path": "a", "column": "b", "skip_blank": 1}) == [
        "argument 'skip_blank' must be boolean, not int"
    ]


def test_registry_refuses_a_spec_whose_schema_lies_about_its_code():
    spec = spec_from_source(COLUMN_SUM)
    lying = type(spec)(**{**spec.__dict__, "parameters": {"type": "object", "properties": {}}})
    with pytest.raises(ToolSpecError, match="does not match its signature"):
        ToolRegistry().register(lying)


@pytest.fixture
def tools(sandbox, tmp_path):
    registry = ToolRegistry(builtin_specs())
    registry.register(spec_from_source(COLUMN_SUM))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with TaskTools(registry, sandbox, workspace, observation_chars=300) as task_tools:
        yield task_tools


def test_builtins_run_in_the_workspace(tools):
    assert (
        tools.run("write_file", {"path": "data/a.csv", "content": "x\n1.5\n2.5\n"}).text
        == "wrote 10 bytes to data/a.csv"
    )
    assert tools.run("list_files", {"path": "data"}).text == "file\t10\ta.csv"
    assert tools.run("read_file", {"path": "data/a.csv"}).text == "x\n1.5\n2.5\n"
    shell = tools.run("run_shell", {"command": "wc -l < data/a.csv; echo oops >&2; exit 4"})
    assert not shell.ok and shell.text == "exit code 4\n3\n[stderr]\noops"


def test_python_state_persists_between_calls_and_errors_are_observations(tools):
    assert tools.run("run_python", {"code": "total = 40\ntotal + 2"}).text == "42"
    assert tools.run("run_python", {"code": "print(total)"}).text == "40"
    failed = tools.run("run_python", {"code": "1 / 0"})
    assert not failed.ok and "ZeroDivisionError" in failed.text


def test_synthesized_tools_are_loaded_into_the_worker_and_called(tools):
    tools.run("write_file", {"path": "a.csv", "content": "x\n1.5\n\n2.5\n"})
    assert tools.run("column_sum", {"path": "a.csv", "column": "x"}).text == "4.0"


def test_malformed_calls_tell_the_model_what_was_wrong(tools):
    unknown = tools.run("delete_everything", {})
    assert not unknown.ok and unknown.text.startswith("Tool call refused: unknown tool 'delete_everything'")
    bad = tools.run("read_file", {"file": "a"})
    assert bad.text == ("Tool call refused: missing required argument 'path'; unknown argument 'file' (known: path)")
    escape = tools.run("read_file", {"path": "../../etc/passwd"})
    assert not escape.ok and "[sandbox error]" in escape.text


def test_long_output_is_cut_and_the_model_is_told(tools):
    text = tools.run("run_python", {"code": "print('x' * 1000)"}).text
    assert len(text) < 400 and text.endswith("[... 700 more characters cut]")


def test_finish_carries_the_trimmed_answer(tools):
    done = tools.run("finish", {"answer": "  42\n"})
    assert done.finished and done.answer == "42"
