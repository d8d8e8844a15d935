"""The task the model is shown: its words, then the files it came with, pasted as a person pastes them."""

from __future__ import annotations

from evolver.agent.given import PASTE_CHARS, PASTE_TOTAL_CHARS, task_text


def test_words_alone_without_files():
    assert task_text("What is 6 * 7?") == "What is 6 * 7?"
    assert task_text("What is 6 * 7?", {}) == task_text("What is 6 * 7?", None) == "What is 6 * 7?"


def test_each_file_follows_the_words_under_its_path_in_order():
    shown = task_text("Total of b.csv?", {"b.csv": "x\n1\n", "a.txt": "hello"})
    assert shown == "Total of b.csv?\n\na.txt:\n```\nhello\n```\n\nb.csv:\n```\nx\n1\n```"


def test_a_long_file_is_cut_and_says_the_whole_is_in_the_workspace():
    log = "".join(f"line {n}\n" for n in range(2_000))
    shown = task_text("Count the errors in app.log.", {"app.log": log})
    assert log[:PASTE_CHARS] in shown and log[: PASTE_CHARS + 1] not in shown
    assert f"the first {PASTE_CHARS:,} of its {len(log):,} characters; the whole file is in your workspace" in shown


def test_all_files_together_stay_within_their_budget_and_the_rest_are_named():
    files = {f"f{n}.txt": "q" * PASTE_CHARS for n in range(4)}
    shown = task_text("Merge them.", files)
    assert shown.count("q") == PASTE_TOTAL_CHARS
    assert f"f2.txt: ({PASTE_CHARS:,} characters, in your workspace)" in shown
    assert "f3.txt: (" in shown


def test_a_file_that_is_not_text_is_named_not_pasted():
    shown = task_text("Look.", {"blob.bin": "a\x00b"})
    assert "blob.bin: (not text; it is in your workspace)" in shown and "\x00" not in shown
