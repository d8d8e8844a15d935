"""The learning-curve benchmark's path, end to end, with the scripted model: ``--quick`` runs a real daemon
through the direct reference, the seed measurement and one generation of learning, and leaves its JSON
and its plot. Nothing is asserted about success rates: the scripted model only makes the path work."""

from __future__ import annotations

import json
import subprocess
import sys

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

    assert report["seed_scaffold"] == curve.seed_identity(None, None)  # what a --baseline from it must match
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


def test_a_baseline_is_taken_only_from_a_run_of_the_same_agent_on_the_same_tasks(tmp_path):
    """--baseline reuses the model alone and generation 0 of an earlier report only when that run had this
    run's split, models and seed limits; otherwise it names what differs."""
    args = curve.parse(["--held-out", "4", "--train", "2", "--basic", "0", "--promotion", "1", "--max-steps", "6"])
    held, trained, promote, _ = curve.split_tasks(args.seed, args.held_out, args.train, args.basic, args.promotion)
    earlier = {
        "settings": {name: json.loads(json.dumps(getattr(args, name))) for name in curve.BASELINE_SAME},
        "tasks": {
            "held_out": [t.id for t in held],
            "train": [t.id for t in trained],
            "promotion": [t.id for t in promote],
        },
        "seed_scaffold": curve.seed_identity(6, None),
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
