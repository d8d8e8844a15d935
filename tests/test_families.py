"""The bundled task families are sound: each instance's right outcome, computed by its generator, passes its own
check in the real sandbox, and each classic mistake fails it; the pack is the same for the same seed, new for
another, and written in the pack format a person's own families use."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from evolver.judge.catalog import resolve_pack
from evolver.judge.checks import AnswerCheck
from evolver.judge.families import FAMILIES, Instance, Outcome, family_instances, family_pack
from evolver.judge.taskpack import parse_pack
from evolver.judge.verify import verify
from sandbox import Limits, write_text

LIMITS = Limits(timeout_s=30)
INSTANCES = family_instances()
ANSWERS = [i for i in INSTANCES if isinstance(i.task.check, AnswerCheck)]
FILES = [i for i in INSTANCES if not isinstance(i.task.check, AnswerCheck)]  # judged in the sandbox


def _judge(instance: Instance, outcome: Outcome, box, root: Path):
    """Play an outcome: the task's files, then the workspace as the outcome leaves it, then its answer."""
    if isinstance(instance.task.check, AnswerCheck):
        return verify(instance.task.check, answer=outcome.answer, sandbox=None, workspace=".")  # type: ignore[arg-type]
    workspace = root / "ws"
    workspace.mkdir(parents=True)
    box.workspace_dir(workspace)
    files = instance.task.files if outcome.workspace is None else outcome.workspace
    for path, text in files.items():
        write_text(workspace, path, text)
    return verify(instance.task.check, answer=outcome.answer, sandbox=box, workspace=workspace, limits=LIMITS)


def test_there_are_at_least_ten_families_of_both_kinds():
    kinds = Counter(type(i.task.check).__name__ for i in INSTANCES[:: len(INSTANCES) // len(FAMILIES)])
    assert len(FAMILIES) >= 10
    assert kinds["AnswerCheck"] >= 6 and kinds["PythonCheck"] >= 3  # answers from files and words, and files to write


def test_each_instance_names_its_family_and_the_pack_is_the_pack_format():
    tasks = family_pack()
    assert Counter(t.family for t in tasks) == dict.fromkeys(FAMILIES, len(tasks) // len(FAMILIES))
    assert len({t.id for t in tasks}) == len(tasks)
    text = "\n".join(json.dumps(t.data()) for t in tasks)
    assert parse_pack(text, "families.jsonl") == tasks  # a person's file of the same lines reads the same
    assert resolve_pack("families") == tasks
    assert {t.split for t in tasks} == {"train", "test"}


def test_the_family_is_the_benchmarks_label_never_the_agents():
    """What a task made from a pack task carries (its metadata) holds no family: the agent and the learners
    see the words and files, as they would a person's."""
    for task in family_pack(per_family=2):
        assert "family" not in json.dumps(task.metadata())


def test_the_same_seed_gives_the_same_pack_and_another_seed_new_data():
    assert family_pack(seed=0, per_family=3) == family_pack(seed=0, per_family=3)
    again = {t.family: t for t in family_pack(seed=1, per_family=1)}
    for task in family_pack(seed=0, per_family=1):
        other = again[task.family]
        assert other.id != task.id
        assert (other.prompt, other.files, other.check) != (task.prompt, task.files, task.check)


def test_a_familys_instances_vary_their_words_and_data():
    for name in FAMILIES:
        tasks = [t for t in family_pack(per_family=12) if t.family == name]
        assert len({(t.prompt, json.dumps(t.files)) for t in tasks}) == len(tasks), name  # no two alike
        assert len({t.prompt.split()[0] for t in tasks}) >= 2, name  # more than one phrasing
        assert len({json.dumps(t.check_data()) for t in tasks}) >= 3, name  # and more than one right answer


def test_no_instance_carries_a_stub_or_a_deliverable():
    assert all(t.deliver is None and "def " not in t.prompt for t in family_pack())


def test_every_instance_has_a_classic_mistake():
    assert all(i.mistakes for i in INSTANCES)


@pytest.mark.parametrize("instance", ANSWERS, ids=[i.task.id for i in ANSWERS])
def test_an_answer_familys_right_answer_passes_and_its_mistakes_fail(instance: Instance):
    assert _judge(instance, instance.right, None, Path()).success, instance.right
    for mistake in instance.mistakes:
        verdict = _judge(instance, mistake, None, Path())
        assert not verdict.success, f"{instance.task.id}: {mistake.why} ({mistake.answer}) passes: {verdict.output}"
    assert not _judge(instance, Outcome(answer=None), None, Path()).success


@pytest.mark.parametrize("instance", FILES, ids=[i.task.id for i in FILES])
def test_a_file_familys_right_workspace_passes_and_its_mistakes_fail(instance: Instance, box, tmp_path):
    verdict = _judge(instance, instance.right, box, tmp_path / "right")
    assert verdict.success, verdict.output
    for n, mistake in enumerate(instance.mistakes):
        verdict = _judge(instance, mistake, box, tmp_path / f"miss{n}")
        assert not verdict.success, f"{instance.task.id}: {mistake.why} passes: {verdict.output}"
    untouched = _judge(instance, Outcome(answer="done"), box, tmp_path / "untouched")
    assert not untouched.success, untouched.output
