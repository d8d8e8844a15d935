"""The learning-curve benchmark's path, end to end, with the scripted model: ``--quick`` runs a real daemon
through the direct reference, the seed measurement and one generation of learning, and leaves its JSON
and its plot. Nothing is asserted about success rates: the scripted model only makes the path work."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import REPO

from evolver.meta.distill import NOTHING_NEW

sys.path.insert(0, str(REPO / "benchmarks"))

import learning_curve as curve

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_quick_runs_the_whole_path_and_leaves_its_json_and_plot(tmp_path):
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "learning_curve.py"), "--quick", "--aa", "--out", str(out)],
        check=False,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert json.loads((out / "learning_curve.json").read_text()) == report
    assert (out / "learning_curve.png").read_bytes()[:8] == PNG_MAGIC

    assert report["seed_scaffold"] == curve.seed_identity({})  # what a --baseline from it must match
    held, train = report["tasks"]["held_out"], report["tasks"]["train"]
    assert len(held) == 3 and not set(held) & set(train)
    assert set(report["direct"]["per_task"]) == set(held)
    assert report["direct"]["model_calls"] == len(held) and report["direct"]["sandbox_isolated"] is True

    generations = report["generations"]
    assert [g["generation"] for g in generations] == [0, 1]  # the seed, then one generation of learning
    for g in generations:
        assert set(g["per_task"]) == set(held)
        assert g["held_out"]["total"] == len(held) and len(g["held_out"]["ci95"]) == 2
        assert g["paired_vs_seed"]["tasks"] == len(held)
        assert g["model_calls"] > 0 and g["tokens"] > 0 and g["wall_s"] >= 0
        assert {"insights", "tools", "incumbent", "tree"} <= set(g["learned"])
        assert g["learned"]["incumbent"]["node"]
    # The A/A check: the seed measured again on the same tasks, paired with the first measurement.
    assert set(report["aa"]["per_task"]) == set(held) and report["aa"]["paired_again_minus_first"]["tasks"] == 3
    learning = generations[1]["learning"]
    assert learning["training"]["total"] == len(train)
    # Distill rounds until one finds nothing new, so every training trajectory is read; then one synthesis.
    assert {r["job"] for r in learning["distill"]} == {"distill"} and len(learning["distill"]) >= 2
    assert NOTHING_NEW in learning["distill"][-1]["summary"]
    assert not any(NOTHING_NEW in r["summary"] for r in learning["distill"][:-1])
    assert [r["job"] for r in learning["synthesize"]] == ["synthesize"]
    assert learning["evolve"]["rounds"] >= 1 and learning["evolve"]["evaluations_recorded"] >= 1
    assert learning["by_purpose"].get("task", {}).get("model_calls", 0) > 0
    assert sum(m["model_calls"] for m in learning["by_model"].values()) == learning["model_calls"]


def test_the_direct_code_is_the_prompt_then_the_models_function_or_its_body():
    problem = {"entry_point": "add", "prompt": 'from typing import List\n\n\ndef add(a, b):\n    """Sum."""\n'}
    whole = curve.solution_code("Here:\n```python\ndef add(a, b):\n    return a + b\n```\nDone.", problem)
    assert whole.startswith(problem["prompt"]) and whole.endswith("def add(a, b):\n    return a + b\n")
    body = curve.solution_code("    return a + b\n", problem)
    assert body == problem["prompt"] + "    return a + b\n"
    cut = curve.solution_code("```python\ndef add(a, b):\n    return a + b", problem)  # no closing fence
    assert cut.endswith("def add(a, b):\n    return a + b")
    for code in (whole, body, cut):
        namespace: dict = {}
        exec(code, namespace)  # noqa: S102 (this test's own code, as the checker would load it)
        assert namespace["add"](2, 3) == 5


def test_the_paired_difference_counts_each_task_against_itself():
    before = {"a": True, "b": False, "c": False, "d": True}
    after = {"a": True, "b": True, "c": True, "d": False}
    result = curve.paired(after, before)
    assert (result["tasks"], result["improved"], result["worsened"], result["difference"]) == (4, 2, 1, 0.25)
    low, high = result["ci95"]
    assert low < 0.25 < high
    assert result["mcnemar_exact_p"] == 1.0  # 2 against 1 is no evidence
    assert curve.wilson(0, 10)[0] == 0.0 and curve.wilson(10, 10)[1] == 1.0


def test_the_agents_draft_is_asked_and_read_exactly_as_the_model_alone_is():
    """The seed's first turn on a HumanEval task is the model alone: the same prompt, and the same code is
    taken from the same reply (with nothing learned yet, the draft's context is empty)."""
    from evolver.agent.delivery import draft_code, task_stub
    from evolver.agent.loop import draft_prompt
    from evolver.agent.scaffold import default_scaffold

    held, _, _, problems = curve.split_tasks(0, 8, 0, 0)
    for task in held:
        problem = problems[task.id]
        stub = task_stub(task.prompt, task.deliver.functions)
        assert draft_prompt(default_scaffold(), stub, ("", "")) == curve.DIRECT_PROMPT.format(prompt=problem["prompt"])
        reply = f"Sure:\n```python\ndef {problem['entry_point']}(*args):\n    return 1\n```\nIt returns 1."
        assert draft_code(reply, stub, task.deliver.functions) == curve.solution_code(reply, problem)


def _part(shard: str, direct: dict, seed: dict) -> dict:
    work = {t: {"attempts": 1, "turns": 2, "tokens": 10, "wall_s": 1.0, "ended": "finished"} for t in seed}
    row = {
        "generation": 0,
        "per_task": seed,
        "failures": {},
        "tokens": 10,
        "model_calls": 2,
        "wall_s": 3.0,
        "learned": {},
        "measurement": {"wall_s": 3.0, "model_calls": 2, "tokens_in": 5, "tokens_out": 5, "work": work},
    }
    return {
        "machine": {},
        "model": {},
        "selection_note": "",
        "finished": True,
        "wall_s": 5.0,
        "settings": {"seed": 0, "held_out": 4, "shard": shard},
        "tasks": {"held_out": list(seed)},
        "direct": {
            "per_task": direct,
            "failures": {},
            "tokens_in": 1,
            "tokens_out": 2,
            "model_calls": 2,
            "wall_s": 2.0,
            "prompt": "p",
            "temperature": 0.0,
        },
        "generations": [row],
    }


def test_the_parts_of_a_sharded_run_merge_into_one_paired_report():
    one = _part([1, 2], {"a": True, "b": False}, {"a": True, "b": True})
    two = _part([2, 2], {"c": True, "d": False}, {"c": False, "d": True})
    merged = curve.merge([one, two])
    assert merged["direct"]["successes"] == 2 and merged["direct"]["total"] == 4
    assert merged["direct"]["model_calls"] == 4 and merged["tasks"]["held_out"] == ["a", "b", "c", "d"]
    seed = merged["generations"][0]
    assert seed["held_out"]["successes"] == 3
    pairs = seed["paired_vs_direct"]
    assert (pairs["tasks"], pairs["improved"], pairs["worsened"], pairs["difference"]) == (4, 2, 1, 0.25)
    assert seed["measurement"]["per_task_mean"]["turns"] == 2 and seed["wall_s"] == 6.0
    with pytest.raises(SystemExit, match="given twice"):
        curve.merge([one, one])


def _report_of(args, held, trained, promote) -> dict:
    """The settings, tasks and seed an earlier report of this run's arguments and split would record."""
    return {
        "settings": {name: json.loads(json.dumps(getattr(args, name))) for name in curve.BASELINE_SAME},
        "tasks": {
            "held_out": [t.id for t in held],
            "train": [t.id for t in trained],
            "promotion": [t.id for t in promote],
        },
        "seed_scaffold": curve.seed_identity(curve.seed_changes(args)),
    }


def test_a_baseline_is_taken_only_from_a_run_of_the_same_agent_on_the_same_tasks(tmp_path):
    """--baseline reuses the model alone and generation 0 of an earlier report only when that run had this
    run's split, models and seed limits; otherwise it names what differs."""
    args = curve.parse(["--held-out", "4", "--train", "2", "--basic", "0", "--promotion", "1", "--max-steps", "6"])
    held, trained, promote, _ = curve.split_tasks(args.seed, args.held_out, args.train, args.basic, args.promotion)
    earlier = {
        **_report_of(args, held, trained, promote),
        "direct": {"per_task": dict.fromkeys((t.id for t in held), True)},
        "generations": [{"generation": 0, "per_task": dict.fromkeys((t.id for t in held), False)}],
    }
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    baseline = curve.baseline_of(path, args, held, trained, promote)
    assert baseline["direct"] == earlier["direct"]
    assert baseline["generation_0"]["per_task"] == earlier["generations"][0]["per_task"]
    assert baseline["generation_0"]["reused_from"] == str(path)

    other = curve.parse(["--held-out", "4", "--train", "2", "--basic", "0", "--promotion", "1", "--max-steps", "8"])
    with pytest.raises(RuntimeError, match="its max_steps, seed scaffold differ from this run.s"):
        curve.baseline_of(path, other, held, trained, promote)
    with pytest.raises(RuntimeError, match="its the held_out tasks differ"):
        curve.baseline_of(path, args, held[:3], trained, promote)
    # The same limits on another seed (here one whose other parameters changed since) is another agent.
    changed = earlier | {"seed_scaffold": {**earlier["seed_scaffold"], "sha256": "0" * 64}}
    path.write_text(json.dumps(changed))
    with pytest.raises(RuntimeError, match="its seed scaffold differ"):
        curve.baseline_of(path, args, held, trained, promote)
    path.write_text(json.dumps({k: v for k, v in earlier.items() if k != "seed_scaffold"}))
    with pytest.raises(RuntimeError, match=r"its seed scaffold \(not recorded\) differ"):
        curve.baseline_of(path, args, held, trained, promote)
    # The same scaffold before its drafts were seeded drew other drafts: another agent.
    unseeded = earlier | {"seed_scaffold": {k: v for k, v in earlier["seed_scaffold"].items() if k != "drafts"}}
    path.write_text(json.dumps(unseeded))
    with pytest.raises(RuntimeError, match="its draft sampling .its drafts after the first were drawn unseeded"):
        curve.baseline_of(path, args, held, trained, promote)
    path.write_text("{}")
    with pytest.raises(RuntimeError, match="not a learning-curve report with a generation 0"):
        curve.baseline_of(path, args, held, trained, promote)
    with pytest.raises(SystemExit):  # --aa measures generation 0, which --baseline does not
        curve.parse(["--aa", "--baseline", str(path)])
    with pytest.raises(SystemExit):  # --baseline takes the model alone already
        curve.parse(["--baseline", str(path), "--direct-from", str(path)])


def test_the_model_alone_is_taken_from_a_run_that_asked_the_same_model_the_same_problems(tmp_path):
    """--direct-from reuses only the model alone, whatever the agent was then (drafts unseeded here), and
    only from a run of the same model on the same held-out problems."""
    args = curve.parse(["--held-out", "4", "--train", "2", "--basic", "0", "--promotion", "1", "--local", "0.5b"])
    held, *_ = curve.split_tasks(args.seed, args.held_out, args.train, args.basic, args.promotion)
    earlier = {
        "settings": {"model": "local", "local": "0.5b", "seed": 0, "shard": None, "max_steps": 9},
        "tasks": {"held_out": [t.id for t in held]},
        "direct": {"successes": 1, "per_task": {t.id: t.id == held[0].id for t in held}},
    }
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    direct = curve.direct_of(path, args, held)
    assert direct["per_task"] == earlier["direct"]["per_task"] and direct["reused_from"] == str(path)
    bigger = curve.parse(["--held-out", "4", "--train", "2", "--basic", "0", "--promotion", "1", "--local", "1.5b"])
    with pytest.raises(RuntimeError, match="its local differ"):
        curve.direct_of(path, bigger, held)
    with pytest.raises(RuntimeError, match="its the held_out tasks differ"):
        curve.direct_of(path, args, held[1:])
    path.write_text("[]")
    with pytest.raises(RuntimeError, match="not a learning-curve report"):
        curve.direct_of(path, args, held)


# --- a pack split by family ---------------------------------------------------------------------------------


def _answer_task(task_id: str, prompt: str, expected, family: str | None, **extra) -> dict:
    check = {"type": "answer", "expected": expected, "match": "numeric" if isinstance(expected, int) else "exact"}
    return {"id": task_id, "prompt": prompt, "check": check, **({"family": family} if family else {}), **extra}


def _write(path, lines: list[dict]):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def _synthetic_pack(tmp_path):
    """4 families of 10 instances (some the pack itself holds out), one family of a single instance and 3 tasks
    of no family: every task worded apart, checked by an answer."""
    lines = []
    for family in ("add", "double", "square", "negate"):
        for n in range(10):
            lines.append(_answer_task(f"{family}-{n}", f"{family} {n}?", n, family, split="test" if n < 3 else "train"))
    lines.append(_answer_task("lonely-0", "the only one of its kind?", "yes", "lonely"))
    lines += [_answer_task(f"loose-{n}", f"no family {n}?", n, None) for n in range(3)]
    from evolver.judge.taskpack import load_pack

    return load_pack(_write(tmp_path / "pack.jsonl", lines))


def test_a_pack_splits_by_seed_into_disjoint_sets_in_proportion_to_each_family(tmp_path):
    tasks = _synthetic_pack(tmp_path)
    sizes = {"held": 8, "train": 12, "promotion": 4}

    def ids(split):
        return {name: [t.id for t in getattr(split, name)] for name in sizes}

    one = curve.split_pack(tasks, 0, sizes["held"], sizes["train"], sizes["promotion"])
    assert ids(one) == ids(curve.split_pack(tasks, 0, 8, 12, 4))  # the same seed, the same split
    assert ids(one) != ids(curve.split_pack(tasks, 1, 8, 12, 4))  # another seed, another
    every = [i for name in sizes for i in ids(one)[name]]
    assert len(every) == len(set(every)) == sum(sizes.values())  # disjoint, and of the sizes asked
    # The pack's own split is ignored: the curve makes its own.
    assert {t.split for t in one.held} == {t.split for t in one.promotion} == {"test"}
    assert {t.split for t in one.train} == {"train"}
    families = {t.id: t.family or curve.NO_FAMILY for t in tasks}
    assert {families[i] for i in every} <= set(families.values()) and one.families == {i: families[i] for i in every}
    size = {f: list(families.values()).count(f) for f in set(families.values())}
    for seed in range(5):  # each family gives each set the floor or the ceiling of its share
        split = curve.split_pack(tasks, seed, sizes["held"], sizes["train"], sizes["promotion"])
        for name, total in sizes.items():
            for family, n in size.items():
                share = total * n / len(tasks)
                got = sum(families[i] == family for i in ids(split)[name])
                assert abs(got - share) < 1, (seed, name, family, got, share)
    assert one.across == [] and one.held_out_families == []


def test_a_held_out_family_is_never_learned_from_and_is_measured_across(tmp_path):
    tasks = _synthetic_pack(tmp_path)
    held_out = set()
    for seed in range(6):
        split = curve.split_pack(tasks, seed, 8, 12, 4, held_out_families=1)
        (unseen,) = split.held_out_families
        held_out.add(unseen)
        assert not [t for t in [*split.train, *split.promotion] if split.families[t.id] == unseen]
        measured_unseen = [t.id for t in split.held if split.families[t.id] == unseen]
        assert split.across == measured_unseen and measured_unseen  # all of it measured across, none within
        assert [t.id for t in split.held][-len(split.across) :] == split.across  # after the within-family ones
        within = [t for t in split.held if t.id not in split.across]
        assert len(within) == 8
        seen = {t.family or curve.NO_FAMILY for t in tasks} - {unseen}
        size = sum(1 for t in tasks if (t.family or curve.NO_FAMILY) == unseen)
        assert len(split.across) == min(size, -(-8 // len(seen)))  # as many as a seen family's, rounded up
    assert len(held_out) > 1  # the seed chooses which


def test_a_pack_too_small_for_the_split_is_refused_with_a_reason(tmp_path):
    tasks = _synthetic_pack(tmp_path)
    too_small = r"too small: --held-out 30 \+ --train 10 \+ --promotion 5 is more than the 44 instances"
    with pytest.raises(SystemExit, match=too_small):
        curve.split_pack(tasks, 0, 30, 10, 5)
    with pytest.raises(SystemExit, match="has 6 families, and at least one must be left to learn from"):
        curve.split_pack(tasks, 0, 2, 2, 1, held_out_families=6)
    with pytest.raises(SystemExit, match=r"more than the \d+ instances of its 5 families"):
        curve.split_pack(tasks, 0, 30, 14, 0, held_out_families=1)  # 44: all, and a family is held out


def test_a_training_instance_worded_as_a_promotion_instance_is_still_learned_from(tmp_path):
    """A family's instances may share their words and differ in their files (a count from another log). The
    daemon holds out its pack's promotion tasks, by their words and files: the training instances of the same
    words come in as training tasks, learnable."""
    from evolver.judge.taskpack import load_pack
    from evolver.tree.split import Admission, held_out_tasks

    lines = [
        _answer_task(f"log-{n}", "How many errors are in app.log?", n, "log", files={"app.log": "E\n" * n})
        for n in range(8)
    ]
    split = curve.split_pack(load_pack(_write(tmp_path / "words.jsonl", lines)), 0, 2, 4, 2)
    assert {t.prompt for t in split.train} == {t.prompt for t in split.promotion}  # one wording for all
    pack = tmp_path / "daemon-pack.jsonl"
    curve.write_pack(pack, [*split.train, *split.promotion])
    door = Admission(held_out=held_out_tasks([str(pack)]))
    for task in split.train:
        item = door.admit("bench", task.prompt, check=task.check_data(), metadata=task.metadata())
        assert item["metadata"]["split"] == "train", task.id
    for task in [*split.promotion, *split.held]:
        item = door.admit("bench", task.prompt, check=task.check_data(), metadata=task.metadata())
        assert item["metadata"]["split"] == "test", task.id


def test_the_model_alone_on_a_pack_task_is_its_words_and_files_its_reply_the_answer_its_code_delivered(tmp_path):
    from evolver.judge.taskpack import parse_pack

    data, code = parse_pack(
        json.dumps(_answer_task("d", "How many lines in a.txt?", 2, None, files={"a.txt": "x\ny\n"}))
        + "\n"
        + json.dumps(
            {
                "id": "c",
                "prompt": "I need a function twice(x) in twice.py that returns 2 * x.",
                "check": {"type": "python", "code": "def check(answer, workspace):\n    return True\n"},
            }
        )
    )
    assert curve.direct_message(data, {}) == "How many lines in a.txt?\n\na.txt:\n```\nx\ny\n```"
    assert curve.direct_message(data, {}) == curve.alone_prompt(data)
    workspace = tmp_path / "w"
    workspace.mkdir()
    assert curve.direct_work(workspace, data, "  2\n", {}) == "2"
    assert (workspace / "a.txt").read_text() == "x\ny\n"
    reply = "Here:\n```python\ndef twice(x):\n    return 2 * x\n```"
    assert curve.direct_work(workspace, code, reply, {}) == reply.strip()
    assert (workspace / "twice.py").read_text() == "def twice(x):\n    return 2 * x\n"  # what its words ask for


def test_the_merge_recomputes_within_across_and_by_family_over_the_parts(tmp_path):
    families = {"a": "f", "b": "f", "c": "g", "d": "h"}  # h is held out: d is measured across
    one = _part([1, 2], {"a": True, "b": False}, {"a": True, "b": True})
    two = _part([2, 2], {"c": True, "d": False}, {"c": False, "d": True})
    for part, ids in ((one, ("a", "b")), (two, ("c", "d"))):
        part["settings"] |= {"pack": "p.jsonl", "held_out_families": 1}
        part["tasks"] |= {"families": {i: families[i] for i in ids}, "across": [i for i in ids if i == "d"]}
    learned = [{**row, "generation": 1} for row in (one["generations"][0], two["generations"][0])]
    learned[0]["per_task"], learned[1]["per_task"] = {"a": True, "b": False}, {"c": True, "d": True}
    one["generations"].append(learned[0])
    two["generations"].append(learned[1])
    merged = curve.merge([one, two])
    assert merged["tasks"]["across"] == ["d"] and merged["tasks"]["families"] == families
    direct = merged["direct"]
    assert (direct["within"]["successes"], direct["within"]["total"]) == (2, 3)
    assert (direct["across"]["successes"], direct["across"]["total"]) == (0, 1)
    assert direct["by_family"] == {
        "f": {"successes": 1, "total": 2, "rate": 0.5},
        "g": {"successes": 1, "total": 1, "rate": 1.0},
        "h": {"successes": 0, "total": 1, "rate": 0.0},
    }
    seed, after = merged["generations"]
    assert seed["within"]["successes"] == 2 and seed["across"]["successes"] == 1
    assert seed["within"]["paired_vs_direct"]["worsened"] == 1 and seed["across"]["paired_vs_direct"]["improved"] == 1
    assert seed["within"]["per_task_mean"]["turns"] == 2 and seed["across"]["per_task_mean"]["tokens"] == 10
    # Generation 1 against the seed: b worsened in f (True -> False), c improved in g (False -> True).
    assert after["by_family"]["f"]["paired_vs_seed"] == {"improved": 0, "worsened": 1}
    assert after["by_family"]["g"]["paired_vs_seed"] == {"improved": 1, "worsened": 0}
    assert after["within"]["paired_vs_seed"]["difference"] == 0.0 and after["across"]["rate"] == 1.0
    # The same figures as the run computes from one part's tasks: one function makes both.
    assert (
        after["by_family"]
        == curve.breakdown(
            after["per_task"],
            families,
            ["d"],
            {"paired_vs_seed": seed["per_task"], "paired_vs_direct": direct["per_task"]},
        )["by_family"]
    )
    other = json.loads(json.dumps(two))
    other["settings"]["held_out_families"] = 2
    with pytest.raises(SystemExit, match="held_out_families"):
        curve.merge([one, other])


def _families_pack(path):
    """A small pack of four families of six instances and two tasks of no family: sums and words reversed
    (answers), counts from a log whose words every instance shares, and functions in a file (a Python check)."""
    lines = []
    for n in range(6):
        lines.append(
            _answer_task(f"add-{n}", f"Add {10 + 7 * n} and {3 + 5 * n}. Reply with the sum.", 13 + 12 * n, "add")
        )
        word = ("apple", "river", "stone", "cloud", "maple", "tiger")[n]
        lines.append(_answer_task(f"reverse-{n}", f"Spell the word {word} backwards.", word[::-1], "reverse"))
        log = "".join(f"{'ERROR' if k < n + 2 else 'INFO'} line {k}\n" for k in range(n + 5))
        lines.append(
            _answer_task(f"errors-{n}", "How many lines of app.log say ERROR?", n + 2, "errors", files={"app.log": log})
        )
        code = f"def check(answer, workspace):\n    return solution('times').times(3) == {3 * (n + 2)}\n"
        lines.append(
            {
                "id": f"times-{n}",
                "family": "times",
                "prompt": f"I need a function times(x) in times.py that returns x times {n + 2}.",
                "check": {"type": "python", "code": code},
            }
        )
    lines += [_answer_task(f"loose-{n}", f"What is {n + 4} times {n + 6}?", (n + 4) * (n + 6), None) for n in range(2)]
    return _write(path, lines)


def test_quick_on_a_pack_with_a_held_out_family_never_lets_a_measured_task_reach_a_learner(tmp_path):
    """--quick --pack: the model alone and the agent on a pack split by family, reported within and across
    families and by family; and in the kept daemon's store, every attempt at a measured task is held out."""
    from evolver.judge.taskpack import load_pack
    from evolver.testing.daemon import remove_root
    from memory.search import learnable_sql

    pack, out = _families_pack(tmp_path / "families.jsonl"), tmp_path / "out"
    command = [sys.executable, str(REPO / "benchmarks" / "learning_curve.py"), "--quick", "--aa", "--keep"]
    run = subprocess.run(
        [*command, "--pack", str(pack), "--held-out-families", "1", "--out", str(out)],
        check=False,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    kept = re.search(r"\] kept (\S+)", run.stderr)
    root = Path(kept[1]) if kept else None
    try:
        assert run.returncode == 0, run.stderr[-3000:]
        report = json.loads(run.stdout)
        assert report["settings"]["pack"] == str(pack) and report["settings"]["held_out_families"] == 1
        tasks = report["tasks"]
        held, train, promotion, across = tasks["held_out"], tasks["train"], tasks["promotion"], tasks["across"]
        (unseen,) = tasks["held_out_families"]
        assert len(train) == 6 and len(promotion) == 2 and 6 < len(held) == 6 + len(across)
        assert across and {tasks["families"][i] for i in across} == {unseen}
        assert unseen not in {tasks["families"][i] for i in held if i not in across}
        assert unseen not in {tasks["families"][i] for i in [*train, *promotion]}
        assert not set(held) & set(train) and not set(held) & set(promotion) and not set(train) & set(promotion)
        assert report["direct"]["prompt"] == curve.PACK_PROMPT and set(report["direct"]["per_task"]) == set(held)
        assert report["direct"]["total"] == len(held) == report["direct"]["model_calls"]

        within = [i for i in held if i not in across]
        for measured in [report["direct"], report["aa"], *report["generations"]]:
            assert measured["within"]["total"] == len(within) and measured["across"]["total"] == len(across)
            assert {f: row["total"] for f, row in measured["by_family"].items()} == {
                f: sum(tasks["families"][i] == f for i in held) for f in set(tasks["families"][i] for i in held)
            }
        assert [g["generation"] for g in report["generations"]] == [0, 1]
        for g in report["generations"]:
            for kind in ("within", "across"):
                part = g[kind]
                assert part["paired_vs_seed"]["tasks"] == part["paired_vs_direct"]["tasks"] == part["total"]
                assert set(part["per_task_mean"]) == {"turns", "tokens", "wall_s", "asked"}
            assert all(set(row) >= {"paired_vs_seed", "paired_vs_direct"} for row in g["by_family"].values())
        assert report["aa"]["across"]["paired_again_minus_first"]["tasks"] == len(across)
        # The scripted model solved some and failed some: both kinds of ending were judged.
        assert 0 < report["generations"][0]["held_out"]["successes"] < len(held)

        # The measured tasks are in no pack of the daemon's, and were never trained on.
        assert root is not None and root.is_dir()
        daemon_pack = {t.id for t in load_pack(root / "pack.jsonl")}
        assert daemon_pack == set(train) | set(promotion) and not daemon_pack & set(held)
        assert all(t.family is None for t in load_pack(root / "pack.jsonl"))  # no family name reaches the daemon
        # Held-out instances never reach a learner: every attempt at a measured task is held out ("test"), and the
        # store's one rule of what a learner may see leaves every one of them out.
        with sqlite3.connect(f"file:{root / 'data' / 'evolver.db'}?mode=ro", uri=True) as db:
            rows = db.execute(
                "SELECT t.id, json_extract(k.metadata, '$.pack_task'), json_extract(k.metadata, '$.split') "
                "FROM trajectories t JOIN tasks k ON k.id = t.task_id"
            ).fetchall()
            measured_rows = [r for r in rows if r[1] in held]
            assert {r[1] for r in measured_rows} == set(held)  # each measured, in each measurement
            assert {r[2] for r in measured_rows} == {"test"}
            ids = [r[0] for r in measured_rows]
            learnable = db.execute(
                f"SELECT count(*) FROM trajectories t WHERE t.id IN ({','.join('?' * len(ids))}) "
                f"AND {learnable_sql('t')}",
                ids,
            ).fetchone()[0]
            assert learnable == 0
            # ... while the training tasks' attempts are learnable: the rule is not simply shutting everything out.
            trained = [r[0] for r in rows if r[1] in train]
            assert trained and db.execute(
                f"SELECT count(*) FROM trajectories t WHERE t.id IN ({','.join('?' * len(trained))}) "
                f"AND {learnable_sql('t')}",
                trained,
            ).fetchone()[0] == len(trained)
    finally:
        if root is not None:
            remove_root(root)


def test_a_baseline_on_a_pack_is_taken_only_from_a_run_of_the_same_pack_and_held_out_families(tmp_path):
    """--pack and --held-out-families are part of what a --baseline must share; a report from before they
    existed ran on HumanEval with no family held out, and still serves a HumanEval run."""
    pack = _families_pack(tmp_path / "families.jsonl")
    args = curve.parse(["--pack", str(pack), "--held-out", "6", "--train", "6", "--promotion", "2"])
    assert args.basic == 0 and args.held_out_families == 0
    held, trained, promote, problems, split = curve.tasks_of(args)
    assert problems == {} and split.held_out_families == []
    earlier = {
        **_report_of(args, held, trained, promote),
        "direct": {"per_task": dict.fromkeys((t.id for t in held), True)},
        "generations": [{"generation": 0, "per_task": dict.fromkeys((t.id for t in held), False)}],
    }
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    assert curve.baseline_of(path, args, held, trained, promote)["direct"] == earlier["direct"]
    other = curve.parse(["--pack", str(pack), "--held-out", "6", "--train", "6", "--promotion", "2"])
    other.held_out_families = 1
    with pytest.raises(RuntimeError, match="its held_out_families differ"):
        curve.baseline_of(path, other, held, trained, promote)
    other = curve.parse(["--held-out", "6", "--train", "6", "--promotion", "2", "--basic", "0"])
    with pytest.raises(RuntimeError, match="its pack"):
        curve.baseline_of(path, other, held, trained, promote)
    # A report from before --pack: the settings it lacks are those of a HumanEval run.
    old = earlier | {
        "settings": {k: v for k, v in earlier["settings"].items() if k not in ("pack", "held_out_families")}
    }
    held, trained, promote, _ = curve.split_tasks(0, 6, 6, 0, 2)
    old["tasks"] = {
        "held_out": [t.id for t in held],
        "train": [t.id for t in trained],
        "promotion": [t.id for t in promote],
    }
    path.write_text(json.dumps(old))
    assert curve.baseline_of(path, other, held, trained, promote)["generation_0"]["reused_from"] == str(path)


def test_the_pack_flags_are_refused_where_they_mean_nothing():
    with pytest.raises(SystemExit):  # HumanEval has no families
        curve.parse(["--held-out-families", "1"])
    with pytest.raises(SystemExit):  # --basic adds HumanEval's companions
        curve.parse(["--pack", "families", "--basic", "3"])
    quick = curve.parse(["--quick", "--pack", "families"])
    assert (quick.held_out, quick.train, quick.basic, quick.promotion, quick.generations) == (6, 6, 0, 2, 1)
    assert curve.parse(["--quick"]).basic == 3  # HumanEval's quick run as before


def test_the_learners_asked_are_the_jobs_a_generation_runs_and_without_examples_the_seed_retrieves_none():
    args = curve.parse(["--quick", "--learners", "tree,examples"])
    assert args.learners == ("examples", "tree")  # in their own order
    assert curve.seed_changes(args) == {}
    alone = curve.parse(["--quick", "--learners", "insights", "--max-steps", "6"])
    assert curve.seed_changes(alone) == {"max_steps": 6, "similar_trajectories": 0}
    assert curve.seed_identity(curve.seed_changes(alone))["parameters"]["similar_trajectories"] == 0
    assert curve.parse(["--quick"]).learners == curve.LEARNERS
    with pytest.raises(SystemExit):
        curve.parse(["--quick", "--learners", "examples,magic"])


def test_a_run_stopped_in_its_aa_goes_on_with_resume_where_it_stopped(tmp_path):
    """SIGTERM during the A/A leaves the report so far and the daemon's root (kept whatever the run's --keep says,
    which here keeps it at the end too, for the store to be read); --resume DIR goes on from there:
    the model alone and generation 0 are not measured again, the A/A's tasks are the ones it had submitted
    (each phase's submits are idempotent), and the run ends as a whole run would."""
    import signal

    from evolver.testing.daemon import remove_root, wait_for

    out, script = tmp_path / "out", str(REPO / "benchmarks" / "learning_curve.py")
    stderr = tmp_path / "first.log"
    with open(stderr, "w") as log:
        first = subprocess.Popen(
            [sys.executable, script, "--quick", "--aa", "--keep", "--out", str(out)], cwd=str(REPO),
            stdout=subprocess.DEVNULL, stderr=log, text=True,
        )  # fmt: skip
        try:
            wait_for(lambda: "A/A: the seed again" in stderr.read_text(), timeout_s=240, what="the A/A to start")
            first.send_signal(signal.SIGTERM)
            assert first.wait(timeout=120) != 0
        finally:
            if first.poll() is None:
                first.kill()
    said = stderr.read_text()
    assert f"--resume {out}" in said, said[-2000:]
    before = json.loads((out / "learning_curve.json").read_text())
    assert before["finished"] is False and [g["generation"] for g in before["generations"]] == [0]
    root = Path(before["resume"]["root"])
    assert root.is_dir()
    try:
        refused = subprocess.run(
            [sys.executable, script, "--resume", str(out), "--keep"], cwd=str(REPO), capture_output=True, text=True
        )
        assert refused.returncode != 0 and "no other option" in refused.stderr
        again = subprocess.run(
            [sys.executable, script, "--resume", str(out)], cwd=str(REPO), capture_output=True, text=True, timeout=300
        )
        assert again.returncode == 0, again.stderr[-3000:]
        report = json.loads(again.stdout)
        assert report["finished"] is True and report["resume"]["resumed"] == 1
        assert report["direct"] == before["direct"]  # not asked again
        assert report["generations"][0] == before["generations"][0]  # nor measured again
        assert [g["generation"] for g in report["generations"]] == [0, 1] and set(report["aa"]["per_task"]) == set(
            report["tasks"]["held_out"]
        )
        # Each measured task was submitted once per phase (the seed, the A/A, generation 1), the stopped A/A's
        # tasks taken up again rather than submitted twice.
        with sqlite3.connect(f"file:{root / 'data' / 'evolver.db'}?mode=ro", uri=True) as db:
            rows = db.execute(
                "SELECT json_extract(metadata, '$.pack_task') FROM tasks WHERE source = 'bench'"
            ).fetchall()
        held = report["tasks"]["held_out"]
        assert sorted(r[0] for r in rows if r[0] in held) == sorted(held * 3)
        assert f"kept {root}" in again.stderr  # as the run was started: with --keep
    finally:
        remove_root(root)
