"""What a task asks for, read from the words a person writes: the file and functions to deliver, the
examples given in prose, and the form of the answer. Pure functions, no model."""

from __future__ import annotations

import pytest

from evolver.agent.asks import answer_form, deliverable_in_words
from evolver.agent.delivery import Example, task_examples

ASKED = [
    ("Write solution.py defining run_length(s) -> str that compresses runs", "solution.py", ("run_length",)),
    ("I need a function `parse(line)` in parser.py that splits a log line.", "parser.py", ("parse",)),
    ("create `report.py` with a `main()` that prints a summary", "report.py", ("main",)),
    (
        "Can you put a function parse_duration(text) in durations.py? It returns seconds.",
        "durations.py",
        ("parse_duration",),
    ),
    ("Write stats.py. It should define mean_of(xs) and median_of(xs).", "stats.py", ("mean_of", "median_of")),
    ("In solution.py, write a function called slugify that lowercases a title.", "solution.py", ("slugify",)),
    ("Read numbers.txt and write total.py defining total(xs) that sums a list.", "total.py", ("total",)),
    ("Please implement is_leap(year) and save it in calendar_tools.py", "calendar_tools.py", ("is_leap",)),
    ("Make a module text/clean.py containing strip_tags(html).", "text/clean.py", ("strip_tags",)),
    ("temps.py should have to_f(celsius) and to_c(fahrenheit).", "temps.py", ("to_f", "to_c")),
    ("`ordinal(n)` should go in ordinals.py and turn 1 into '1st'.", "ordinals.py", ("ordinal",)),
    ("matrix.py: transpose(rows) -> the transpose of a list of lists", "matrix.py", ("transpose",)),
]

NOT_ASKED = [
    "Run check.py and tell me what it prints.",
    "config.py in your workspace defines RATE; what is RATE times 12?",
    "What does the function area(r) in shapes.py return for r=2?",
    "Write a script count.py that prints the number of lines in data.txt.",  # a script: no function named
    "Count the lines in app.log that contain ERROR.",
    "What is 17.5% of 2,340?",
    "Write solution.py defining print(x).",  # a builtin is no function of the task's
    "Write ../evil.py defining f(x).",  # outside the workspace
    "There's a helpers.py in the workspace with a discount(price) function. What is discount(80)?",
]


@pytest.mark.parametrize(("words", "file", "functions"), ASKED)
def test_the_file_and_functions_a_task_asks_for_are_read_from_its_words(words, file, functions):
    found = deliverable_in_words(words)
    assert found is not None and (found.file, found.functions) == (file, functions)


@pytest.mark.parametrize("words", NOT_ASKED)
def test_a_file_named_to_read_or_a_script_or_an_answer_is_no_deliverable(words):
    assert deliverable_in_words(words) is None


def test_a_file_the_task_itself_gives_is_never_one_it_asks_for():
    words = "Fix the add function in calc.py: write calc.py defining add(a, b) that really adds."
    assert deliverable_in_words(words) is not None
    assert deliverable_in_words(words, {"calc.py"}) is None


def test_examples_written_in_prose_are_read_wherever_they_stand():
    words = (
        "Write solution.py defining run_length(s), e.g. run_length('aaabcc') == 'a3b1c2'. run_length('') is ''. "
        "For example chunk([1, 2, 3], 2) gives [[1, 2], [3]], and chunk([], 3) should return []. "
        "f(2) == 4, f(3) -> 9. f(1.5) returns 2.25. is_even(3) is False. f(x) is the square of x."
    )
    found = task_examples(words, ("run_length", "chunk", "f", "is_even"))
    assert found == [
        Example("run_length('aaabcc')", "'a3b1c2'"),
        Example("run_length('')", "''"),
        Example("chunk([1, 2, 3], 2)", "[[1, 2], [3]]"),
        Example("chunk([], 3)", "[]"),
        Example("f(2)", "4"),
        Example("f(3)", "9"),
        Example("f(1.5)", "2.25"),
        Example("is_even(3)", "False"),
    ]


def test_a_call_of_another_function_or_without_a_literal_result_is_no_example():
    words = "Write g.py defining g(n). g(n) is twice n; h(2) == 5; g(2) is roughly 4ish; len(g(2)) == 1."
    assert task_examples(words, ("g",)) == []


FORMS = [
    ("How much change does she get? Answer with the number only.", "The change is $11.50.", "11.50"),
    ("What is the tip, rounded to the cent?", "About 12.345 dollars", "12.35"),
    ("Which weekday is 2025-03-14? Just the weekday's English name.", "It is a friday.", "Friday"),
    ("When is the invoice due? Give the date as YYYY-MM-DD.", "Due on 2025-04-01 at noon", "2025-04-01"),
    ("How many files are in the folder?", "There are 7 files", "7"),
    ("What's the total for West in sales.csv? Round to cents.", "The total is 5469.9", "5469.90"),
    ("Can you count the errors the auth service logged? A number is enough.", "It logged 3 errors.", "3"),
    ("Sales went from 100 to 150. What's the percentage change, to one decimal?", "A change of 50.0%", "50.0"),
    ("Which word comes up most often in notes.txt? Just the word.", "The most frequent word is 'backup'.", "backup"),
    ("What's the most frequent word in notes.txt?", "Backup.", "Backup"),
]


@pytest.mark.parametrize(("words", "reply", "shaped"), FORMS)
def test_the_answer_form_a_task_asks_for_shapes_an_answer_that_holds_one(words, reply, shaped):
    form = answer_form(words)
    assert form is not None and form.shape(reply) == (shaped, None)


def test_an_answer_with_none_or_several_of_the_asked_form_is_refused_with_a_reason():
    form = answer_form("What is 6 times 7? Answer with the number only.")
    assert form is not None
    for reply in ("I do not know", "either 42 or 43"):
        shaped, why = form.shape(reply)
        assert shaped is None and why and "the number only" in why
    assert answer_form("Write a haiku about autumn.") is None
    word = answer_form("Which word comes up most often? Just the word.")
    assert word is not None
    assert word.shape("either 'a' or 'b'")[0] is None and word.shape("I think it is x y")[0] is None


def test_every_bundled_function_task_in_words_is_read_right_and_its_examples_pass_its_reference(sandbox, tmp_path):
    """Over the bundled packs written in words: the agent reads the file and functions a reference solution
    defines (basic's deliver field agrees), and every example it reads from the words passes that reference
    in the sandbox: a misread example would refuse a right answer."""
    import json
    from pathlib import Path

    from evolver.agent.delivery import try_examples
    from evolver.judge.taskpack import bundled_pack

    data = Path(__file__).parent / "data"
    read = 0
    for pack in ("basic", "prose"):
        solutions = json.loads((data / f"{pack}_solutions.json").read_text(encoding="utf-8"))
        for task in bundled_pack(pack):
            asked = deliverable_in_words(task.prompt, set(task.files))
            if task.deliver is not None:
                assert asked == task.deliver, task.id
            if asked is None:
                continue
            source = solutions[task.id]["files"][asked.file]
            assert all(f"def {f}(" in source for f in asked.functions), task.id
            examples = task_examples(task.prompt, asked.functions)
            workspace = tmp_path / task.id
            workspace.mkdir(mode=0o700)
            sandbox.workspace_dir(workspace)
            assert try_examples(sandbox, workspace, asked.file, source, examples, None) == [], task.id
            read += len(examples)
    assert read >= 20  # the packs' words do give examples, and they were read
