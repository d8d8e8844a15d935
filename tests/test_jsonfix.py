"""The repair of JSON a model writes (``evolver.llm.jsonfix``): what is repaired, and what is left as an error
because any repair would be a guess."""

from __future__ import annotations

import json

import pytest

from evolver.llm import jsonfix
from evolver.llm.client import parse_text_tool_calls
from evolver.llm.jsonfix import loads

# Shaped as the real Qwen2.5-Coder-0.5B-Instruct wrote them through evolver (learning-curve run, 2026-12-05):
# 83 of its first 101 replies on HumanEval problems carried Python's triple quotes and all 83 were refused as
# invalid JSON, so each task spent its steps repeating one refused call; with this repair 65 of them are read.
DOCSTRING_IN_STRING = (
    '```json\n{"tool": "run_python", "arguments": {"code": "def add(a, b):\\n    """Add two numbers.'
    '"""\\n    return a + b\\nprint(add(2, 3))"}}\n```'
)
VALUE_AS_TRIPLE_STRING = (
    '```json\n{"tool": "run_python", "arguments": {"code": """\ndef specialFilter(nums):\n'
    '    """Count the numbers over 10.\n    specialFilter([15, -73, 14, -15]) => 1\n    """\n'
    "    return sum(1 for n in nums if n > 10)\n}}\n```"
)


def test_a_docstring_inside_a_json_string_is_escaped():
    (call,) = parse_text_tool_calls(DOCSTRING_IN_STRING)
    assert call.error is None and call.name == "run_python"
    assert call.arguments["code"] == 'def add(a, b):\n    """Add two numbers."""\n    return a + b\nprint(add(2, 3))'


def test_a_value_written_as_a_triple_quoted_string_runs_to_the_closing_braces():
    (call,) = parse_text_tool_calls(VALUE_AS_TRIPLE_STRING)
    assert call.error is None
    code = call.arguments["code"]
    assert code.startswith("\ndef specialFilter(nums):\n") and code.rstrip().endswith("if n > 10)")
    compile(code, "<call>", "exec")  # the docstring's own quotes are kept


def test_a_triple_quoted_value_with_its_own_closing_quotes():
    data, repaired = loads('{"tool": "run_python", "arguments": {"code": """print(1)\nprint(2)"""}}')
    assert repaired and data["arguments"]["code"] == "print(1)\nprint(2)"


@pytest.mark.parametrize(
    "text",
    [
        '{"code": """print(1)""", "more": 1',  # the triple-quoted value is not the last one: where it ends is a guess
        '{"a": "x" "y"}',
    ],
)
def test_what_would_be_a_guess_stays_an_error(text):
    with pytest.raises(json.JSONDecodeError):
        loads(text)


def test_valid_json_is_untouched():
    assert loads('{"a": "he said \\"hi\\""}') == ({"a": 'he said "hi"'}, False)


def test_a_refusal_shows_the_text_around_the_fault_not_only_the_start():
    text = '{"rationale": "' + "r" * 400 + '", "edit": {"prompts": {"task": "say "hi" then"}}}'
    with pytest.raises(json.JSONDecodeError) as refused:
        jsonfix.loads(text)
    reason = jsonfix.not_json("the proposer's answer", text, refused.value)
    assert refused.value.pos > 400
    assert reason.startswith(
        f"the proposer's answer is not JSON (Expecting ',' delimiter at character {refused.value.pos})"
    )
    assert 'say "hi" then' in reason  # the fault, which the start alone would not show
