"""Learned packs: export from one store, import into another; tampered packs refused whole; tools quarantined."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import re
import tarfile
from types import SimpleNamespace

import pytest

from evolver.agent.scaffold import default_scaffold, load_scaffold
from evolver.config import load_config
from evolver.engine import Engine
from evolver.llm import scripted
from evolver.meta import packfile, packs
from evolver.meta.revert import RevertError, revert_event
from evolver.meta.synthesize import synthesize_round
from evolver.tree.incumbent import ensure_root
from memory import NewTrajectory, Store
from tests.test_cli import run
from tests.test_synthesize import (  # the same tools, written once
    REVERSE,
    REVERSE_TESTS,
    SHOUT,
    SHOUT_TESTS,
)
from tools import code_hash

INSIGHTS = [
    "Check the answer's format against the task before calling finish.",
    "For arithmetic on big numbers, compute it with run_python rather than in your head.",
]


def _python_call(code: str, output: str, n: int) -> list[dict]:
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": f"c{n}", "name": "run_python", "arguments": {"code": code}, "error": None}],
        },
        {"role": "tool", "content": output, "tool_results": [{"id": f"c{n}", "name": "run_python", "ok": True}]},
    ]


def _proposal() -> str:
    return json.dumps(
        {
            "name": "reverse_text",
            "code": REVERSE,
            "tests": REVERSE_TESTS,
            "replays": [{"call": 1, "arguments": {"text": "hello"}}, {"call": 2, "arguments": {"text": "abc"}}],
            "rationale": "reversing strings came up in several tasks",
        }
    )


@pytest.fixture
def engine(open_store, sandbox, tmp_path):
    """Engines on data dirs under tmp_path, sharing the session's embedder and sandbox; closed afterwards."""
    opened = []
    scripted.register_script("packs", {"rules": [{"match": "", "reply": _proposal()}]})

    def make(name: str, **env) -> Engine:
        config = load_config(env={"EVOLVER_MODEL_NAME": "scripted/packs", **env})
        data = tmp_path / name
        e = Engine.open(config, data_dir=data, store=open_store(data), sandbox=sandbox)
        opened.append(e)
        return e

    yield make
    for e in opened:
        e.close()


def learned(e: Engine) -> list[str]:
    """What a store learned: a tool synthesized and quarantined from two tasks, and two distilled insights."""
    ids = [
        *e.store.attempts.ingest(
            [
                NewTrajectory(
                    prompt="Reverse the word hello",
                    final_answer="olleh",
                    success=True,
                    steps=_python_call("word = 'hello'\nprint(word[::-1])", "olleh", 1),
                )
            ]
        ),
        *e.store.attempts.ingest(
            [
                NewTrajectory(
                    prompt="Reverse the word abc",
                    final_answer="cba",
                    success=True,
                    steps=_python_call("word = 'abc'\nprint(word[::-1])", "cba", 2),
                )
            ]
        ),
    ]
    assert synthesize_round(e).startswith("registered reverse_text v1")
    e.store.insights.record_insight_changes(
        "distill",
        "two insights",
        [{"op": "ADD", "text": text, "importance": 2, "provenance": ids} for text in INSIGHTS],
        evidence=ids,
    )
    return ids


@pytest.fixture(scope="module")
def pack(embedder, sandbox, tmp_path_factory) -> bytes:
    """The pack of a store that learned (made once: synthesis runs quarantine in the sandbox)."""
    scripted.register_script("packs", {"rules": [{"match": "", "reply": _proposal()}]})
    data = tmp_path_factory.mktemp("packs") / "source"
    config = load_config(env={"EVOLVER_MODEL_NAME": "scripted/packs"})
    with Engine.open(config, data_dir=data, store=Store.open(data, embedder=embedder), sandbox=sandbox) as source:
        learned(source)
        return packs.export_pack(source.store, model="scripted/packs")[0]


# --- forging packs: what a tamperer (or a careless author) could hand over ---------------------------------


def members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}


def forge(data: bytes, edit=None, *, files: bool = True, manifest_hash: bool = True) -> bytes:
    """``data`` with ``edit(manifest, contents)`` applied, then (unless told not to) every hash made to
    agree again: a well-formed pack whose content is what the forger chose."""
    contents = members(data)
    manifest = json.loads(contents.pop(packfile.MANIFEST))
    contents.pop(packfile.MANIFEST_HASH)
    if edit is not None:
        edit(manifest, contents)
    if files:
        manifest["files"] = {
            n: {"sha256": hashlib.sha256(b).hexdigest(), "bytes": len(b)} for n, b in sorted(contents.items())
        }
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(body).hexdigest() if manifest_hash else members(data)[packfile.MANIFEST_HASH][:64].decode()
    return packfile._tar(
        [
            (packfile.MANIFEST, body),
            (packfile.MANIFEST_HASH, f"{digest}  manifest.json\n".encode()),
            *sorted(contents.items()),
        ]
    )


def with_member(data: bytes, info: tarfile.TarInfo, content: bytes = b"") -> bytes:
    """``data``'s members and one more, written as is (a link, a path that climbs out, a name twice...)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, body in members(data).items():
            entry = tarfile.TarInfo(name)
            entry.size = len(body)
            tar.addfile(entry, io.BytesIO(body))
        info.size = len(content) if info.isreg() else 0
        tar.addfile(info, io.BytesIO(content) if info.isreg() else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def _failing_shout(manifest: dict, contents: dict) -> None:
    """Add a tool whose own tests fail (its hashes all in order: not tampering, a bad tool)."""
    tests = 'def test_shout():\n    assert shout("hi") == "HI?"\n'
    contents["tools/shout/code.py"], contents["tools/shout/tests.py"] = SHOUT.encode(), tests.encode()
    manifest["tools"].append(
        {
            "name": "shout",
            "version": 1,
            "description": "shout",
            "code": "tools/shout/code.py",
            "tests": "tools/shout/tests.py",
            "code_hash": code_hash(SHOUT, tests),
            "provenance": {},
        }
    )


def _state(e: Engine) -> tuple:
    """Everything an import could change."""
    tools_dir = e.data_dir / "tools"
    return (
        e.store.reports.list_events(limit=1000),
        e.store.tools.list_tools(status=None),
        e.store.insights.list_insights(status=None),
        e.store.tree.list_nodes(),
        sorted(p.name for p in tools_dir.rglob("*")) if tools_dir.exists() else [],
    )


# --- the round trip -------------------------------------------------------------------------------------------


def test_a_pack_round_trips_insights_and_tools_into_a_fresh_store_and_one_revert_undoes_it(engine):
    source = engine("source")
    evidence = learned(source)
    data, summary = packs.export_pack(source.store, model="scripted/packs")
    assert (summary["insights"], summary["tools"], summary["node"], summary["left_out"]) == (
        2,
        ["reverse_text"],
        None,
        [],
    )
    assert packs.export_pack(source.store, model="scripted/packs")[0] == data  # the same items, the same bytes
    # What a person can read before importing: files, and a manifest that names each by its hash.
    assert list(members(data)) == [
        "manifest.json",
        "manifest.sha256",
        "insights/0001.txt",
        "insights/0002.txt",
        "tools/reverse_text/code.py",
        "tools/reverse_text/tests.py",
    ]
    manifest = json.loads(members(data)["manifest.json"])
    assert hashlib.sha256(members(data)["manifest.json"]).hexdigest().startswith(summary["id"])
    assert manifest["evolver"] == "0.1.0" and manifest["model"] == "scripted/packs"
    (tool,) = manifest["tools"]
    assert members(data)[tool["code"]].decode() == REVERSE
    assert manifest["files"][tool["code"]]["sha256"] == hashlib.sha256(REVERSE.encode()).hexdigest()
    made = tool["provenance"]
    assert made["trajectories"] == 2 and sorted(made["prompts"]) == ["Reverse the word abc", "Reverse the word hello"]
    assert made["tests"].startswith("2/2 tests passed") and [t["ok"] for t in made["test_results"]] == [True, True]
    assert made["event"] == "tool_registered" and made["cost_usd"] == 0.0
    assert manifest["insights"][0]["provenance"]["trajectories"] == len(evidence)

    target = engine("target")
    report = packs.import_pack(target, data)
    assert (report["added"], report["skipped"], report["refused"]) == (3, 0, 0), report
    # The tool is active and callable through the registry (in the sandbox, as every synthesized tool).
    (row,) = target.store.tools.list_tools()
    assert (row.name, row.version, row.status, row.origin) == ("reverse_text", 1, "active", "synthesized")
    target.agent()
    assert target.registry.get("reverse_text").tool_id == row.id
    assert target.call_tool("reverse_text", {"text": "stressed"})["text"] == "desserts"
    # The insights wait on probation: shown to no task of a person's until approved or measured to help.
    assert report["probation"] == 2 and target.store.insights.list_insights() == []
    assert sorted(i.text for i in target.store.insights.list_insights(status="probation")) == sorted(INSIGHTS)
    assert all(
        i.provenance == [f"pack:{report['id']}"] for i in target.store.insights.list_insights(status="probation")
    )
    (event,) = target.store.reports.list_events(kind="import")
    assert event.id == report["event_id"] and row.event_id == event.id
    assert event.payload["pack"] == report["sha256"] and event.payload["tools"][0]["provenance"]["trajectories"] == 2
    assert [c["name"] for c in event.payload["tool_changes"]] == ["reverse_text"]
    assert len(target.store.insights.insight_changes_of(event.id)) == 2

    # One revert undoes it all: the tool withdrawn, the insights retired, as one event.
    revert = revert_event(target.store, event.id)
    assert revert.reverts == event.id and "2 insights restored" in revert.what and "reverse_text v1" in revert.what
    assert [t.status for t in target.store.tools.list_tools(status=None)] == ["reverted"]
    assert target.store.insights.list_insights(status=("active", "probation")) == []
    target.agent()
    assert target.registry.get("reverse_text") is None
    with pytest.raises(RevertError, match="already reverted"):
        revert_event(target.store, event.id)
    # Importing it again brings back nothing that was undone here: each item says why it stays out.
    again = packs.import_pack(target, data)
    assert (again["added"], again["skipped"]) == (0, 3)
    reasons = {i["kind"]: i["reason"] for i in again["items"]}
    assert "is reverted, as decided here" in reasons["tool"] and "(retired)" in reasons["insight"]
    assert [t.status for t in target.store.tools.list_tools(status=None)] == ["reverted"]
    with pytest.raises(RevertError, match="nothing to revert"):
        revert_event(target.store, again["event_id"])


def test_a_tool_whose_tests_fail_is_refused_with_its_reason_and_the_rest_comes_in(engine, pack):
    target = engine("target")
    report = packs.import_pack(target, forge(pack, _failing_shout))
    refused = [i for i in report["items"] if i["status"] == "refused"]
    assert [(i["kind"], i["name"]) for i in refused] == [("tool", "shout")]
    assert "1 of 1 tests failed; test_shout" in refused[0]["reason"]
    assert report["added"] == 3 and [t.name for t in target.store.tools.list_tools(status=None)] == ["reverse_text"]
    assert not (target.data_dir / "tools" / "shout").exists()
    (event,) = target.store.reports.list_events(kind="import")
    assert event.payload["refused"][0]["name"] == "shout" and "test_shout" in event.payload["refused"][0]["reason"]
    target.agent()
    assert target.registry.get("shout") is None


def _terminal_escapes(manifest: dict, contents: dict) -> None:
    """An insight and a tool whose texts carry terminal escapes (their hashes in order: not tampering)."""
    contents["insights/0001.txt"] = b"Set the title\x1b]0;pwned\x07 before calling finish."
    code = SHOUT.replace("exclamation mark.", "exclamation mark.\x1b[2J")
    contents["tools/shout/code.py"], contents["tools/shout/tests.py"] = code.encode(), SHOUT_TESTS.encode()
    manifest["tools"].append(
        {
            "name": "shout",
            "version": 1,
            "description": "shout",
            "code": "tools/shout/code.py",
            "tests": "tools/shout/tests.py",
            "code_hash": code_hash(code, SHOUT_TESTS),
            "provenance": {},
        }
    )


def test_an_insight_or_a_tool_with_a_control_character_is_refused_naming_where_and_the_rest_comes_in(engine, pack):
    target = engine("target")
    report = packs.import_pack(target, forge(pack, _terminal_escapes))
    refused = {i["kind"]: i["reason"] for i in report["items"] if i["status"] == "refused"}
    assert refused == {
        "insight": "insight 1: the text has a control character \\x1b at character 14; an insight is plain text",
        "tool": "a control character \\x1b at line 3, column 54 in its code; a tool's code, tests and docstring "
        "are plain text",
    }
    assert report["added"] == 2 and [t.name for t in target.store.tools.list_tools(status=None)] == ["reverse_text"]
    assert [i.text for i in target.store.insights.list_insights(status="probation")] == [INSIGHTS[1]]


def _new_version(breaks_old_tests: bool):
    def edit(manifest: dict, contents: dict) -> None:
        body = "return text[::-1] if text else 'empty'" if breaks_old_tests else "return ''.join(reversed(text))"
        code = REVERSE.replace("return text[::-1]", body)
        tests = 'def test_mine():\n    assert reverse_text("ab") == "ba"\n'
        contents["tools/reverse_text/code.py"], contents["tools/reverse_text/tests.py"] = code.encode(), tests.encode()
        manifest["tools"][0]["code_hash"] = code_hash(code, tests)

    return edit


def test_a_tool_under_a_local_name_is_a_new_version_only_if_it_passes_the_local_tests_too(engine, pack):
    target = engine("target")
    packs.import_pack(target, pack)  # reverse_text v1, with its tests, is here now
    # Its own tests pass, but quarantine runs the tests of the version it would replace: refused.
    broken = packs.import_pack(target, forge(pack, _new_version(breaks_old_tests=True)))
    (tool,) = [i for i in broken["items"] if i["kind"] == "tool"]
    assert tool["status"] == "refused" and "test_empty" in tool["reason"], tool
    assert {t.version: t.status for t in target.store.tools.list_tools(status=None)} == {1: "active"}
    # A sound one replaces it as v2 (never silently: the report and the event say so), and a revert undoes that.
    better = packs.import_pack(target, forge(pack, _new_version(breaks_old_tests=False)))
    (tool,) = [i for i in better["items"] if i["kind"] == "tool"]
    assert tool["status"] == "added" and tool["detail"] == {"version": 2, "replaces": 1}
    assert {t.version: t.status for t in target.store.tools.list_tools(status=None)} == {1: "replaced", 2: "active"}
    revert_event(target.store, better["event_id"])
    assert {t.version: t.status for t in target.store.tools.list_tools(status=None)} == {1: "active", 2: "reverted"}


def test_a_tool_that_duplicates_a_local_one_or_takes_a_builtin_name_is_refused(engine, pack):
    target = engine("target", EVOLVER_EVOLUTION_TOOL_DEDUP_THRESHOLD="0.8")
    packs.import_pack(target, pack)

    def twins(manifest: dict, contents: dict) -> None:
        for name in ("reverse_string", "run_shell"):
            code = REVERSE.replace("reverse_text", name)
            tests = REVERSE_TESTS.replace("reverse_text", name)
            contents[f"tools/{name}/code.py"], contents[f"tools/{name}/tests.py"] = code.encode(), tests.encode()
            manifest["tools"].append(
                {
                    "name": name,
                    "version": 1,
                    "description": "",
                    "code": f"tools/{name}/code.py",
                    "tests": f"tools/{name}/tests.py",
                    "code_hash": code_hash(code, tests),
                }
            )

    report = packs.import_pack(target, forge(pack, twins))
    reasons = {i["name"]: i["reason"] for i in report["items"] if i["status"] == "refused"}
    assert "duplicates tool 'reverse_text'" in reasons["reverse_string"]
    assert "built-in tool's name" in reasons["run_shell"]
    assert [t.name for t in target.store.tools.list_tools(status=None)] == ["reverse_text"]


def test_an_insight_too_similar_to_a_local_one_is_skipped_not_merged(engine, pack):
    target = engine("target")
    (local,) = target.store.insights.apply_insight_changes(
        [{"op": "ADD", "text": INSIGHTS[0] + " Always.", "importance": 3}]
    )
    report = packs.import_pack(target, pack)
    skipped = [i for i in report["items"] if i["status"] == "skipped"]
    assert len(skipped) == 1 and f"too similar to insight {local.id} here" in skipped[0]["reason"]
    assert target.store.insights.get_insight(local.id).importance == 3  # not upvoted, not edited
    assert [i.text for i in target.store.insights.list_insights()] == [local.text]
    assert [i.text for i in target.store.insights.list_insights(status="probation")] == [INSIGHTS[1]]


# --- refused whole ------------------------------------------------------------------------------------------


def _bump_version(manifest: dict, contents: dict) -> None:
    manifest["version"] = 2


def _tool_hash(manifest: dict, contents: dict) -> None:
    manifest["tools"][0]["code_hash"] = "0" * 16


def _code_edited(manifest: dict, contents: dict) -> None:
    contents["tools/reverse_text/code.py"] = contents["tools/reverse_text/code.py"].replace(b"[::-1]", b"[::+1]")


def _unlisted(manifest: dict, contents: dict) -> None:
    contents["insights/0009.txt"] = b"an insight the manifest never mentions"


def _orphan(manifest: dict, contents: dict) -> None:
    manifest["insights"].pop()


def _two_tools_one_name(manifest: dict, contents: dict) -> None:
    manifest["tools"].append(dict(manifest["tools"][0]))


def _elsewhere(manifest: dict, contents: dict) -> None:
    manifest["insights"][0]["file"] = "tools/reverse_text/code.py"


@pytest.mark.parametrize(
    "alter, problem",
    [
        # one byte of the code inside, the hashes left as they were
        (
            lambda p: p.replace(b"return text[::-1]", b"return text[::+1]"),
            "member 'tools/reverse_text/code.py' does not match its hash in the manifest",
        ),
        # a hash in the manifest changed (and the manifest's own hash not)
        (
            lambda p: p.replace(hashlib.sha256(REVERSE.encode()).hexdigest().encode(), b"0" * 64),
            "the manifest does not match its hash",
        ),
        # the code changed and the manifest made to agree, but not the tool's code_hash
        (lambda p: forge(p, _code_edited), "its code_hash"),
        (lambda p: forge(p, _tool_hash), "its code_hash 0000000000000000 does not match"),
        (lambda p: forge(p, _bump_version), "pack format version 2 is not supported"),
        (
            lambda p: forge(p, _unlisted, files=False),
            "unknown member 'insights/0009.txt': the manifest does not list it",
        ),
        (lambda p: forge(p, _orphan), "'insights/0002.txt' is listed in the manifest but belongs to no item"),
        (lambda p: forge(p, _two_tools_one_name), "tool 'reverse_text' appears twice"),
        (lambda p: forge(p, _elsewhere), "insight 1 names file 'tools/reverse_text/code.py', which is not where"),
        (lambda p: with_member(p, _member("../evil.py"), b"print('out')"), "would leave the pack"),
        (lambda p: with_member(p, _member("tools/x/../../../evil.py"), b"x"), "would leave the pack"),
        (lambda p: with_member(p, _member("/etc/cron.d/evil"), b"x"), "has an absolute path"),
        (lambda p: with_member(p, _member("tools/reverse_text/code.py"), b"x"), "appears twice"),
        (
            lambda p: with_member(p, _member("insights/0003.txt", tarfile.SYMTYPE, "/etc/passwd")),
            "is a symbolic link (to '/etc/passwd')",
        ),
        (lambda p: with_member(p, _member("insights/0003.txt", tarfile.LNKTYPE, "manifest.json")), "is a hard link"),
        (lambda p: with_member(p, _member("tools", tarfile.DIRTYPE)), "is a directory"),
        (lambda p: with_member(p, _member("insights/0003.txt", tarfile.FIFOTYPE)), "is a device or other special file"),
        # a sparse file's contents may be far bigger than the bytes it takes in the pack
        (
            lambda p: with_member(p, _member("insights/0003.txt", tarfile.GNUTYPE_SPARSE), b"x" * 10),
            "is a sparse or continued file",
        ),
        (lambda p: with_member(p, _member("notes.txt"), b"hello"), "unknown member 'notes.txt'"),
        (lambda p: p + b"\0" * 512 + b"trailing", "bytes are not exactly what `evolver export` writes"),
        (lambda p: gzip.compress(p), "not a pack"),
        (lambda p: b"PK\x03\x04 not a tar at all" * 40, "not a pack"),
        (lambda p: b"", "the pack is empty"),
        (lambda p: p + b"\0" * packs.MAX_PACK_BYTES, "over the 8388608-byte cap"),
    ],
)
def test_a_tampered_pack_is_refused_whole_naming_the_problem_and_nothing_changes(engine, pack, alter, problem):
    target = engine("target")
    before = _state(target)
    with pytest.raises(packs.PackError, match=re.escape(problem)) as refused:
        packs.import_pack(target, alter(pack))
    assert "\n" not in str(refused.value)
    assert _state(target) == before


def test_no_byte_of_a_pack_goes_unchecked(pack):
    packs.read_pack(pack)
    for position in range(0, len(pack), 97):  # headers, contents, padding and the end of the archive
        flipped = bytearray(pack)
        flipped[position] ^= 0x01
        with pytest.raises(packs.PackError):
            packs.read_pack(bytes(flipped))


def test_expect_pins_the_pack_its_author_published(pack):
    digest = packs.read_pack(pack).sha256
    assert packs.read_pack(pack, expect=digest.upper()).sha256 == digest
    other = ("0" if digest[-1] != "0" else "1").join([digest[:-1], ""])
    with pytest.raises(packs.PackError, match=f"the pack is {digest}, not the {other} you expected"):
        packs.read_pack(pack, expect=other)
    # Only the whole id: a prefix a person pinned is cheap to forge.
    for prefix in (digest[:8], digest[:16], digest[:63]):
        with pytest.raises(packs.PackError, match="the 64 hex digits `evolver export` prints; a prefix is refused"):
            packs.read_pack(pack, expect=prefix)
    with pytest.raises(packs.PackError, match="64 hex digits .*; not 'xyz'"):
        packs.read_pack(pack, expect="xyz")


# --- a node's scaffold ----------------------------------------------------------------------------------------


def test_a_node_travels_as_a_proposed_child_of_the_incumbent_and_a_revert_withdraws_it(engine):
    source = engine("source")
    root = ensure_root(source.store, default_scaffold())
    child = default_scaffold().model_copy(
        update={"parameters": default_scaffold().parameters.model_copy(update={"max_steps": 7})}
    )
    source.store.tree.put_scaffold(child.hash, child.canonical_json())
    node = source.store.tree.add_node(child.hash, parent_id=root.id, status="evaluated", rationale="fewer steps")
    data, summary = packs.export_pack(source.store, node=node.id)
    assert summary["node"] == node.id and summary["insights"] == 0 and summary["tools"] == []
    target = engine("target")
    report = packs.import_pack(target, data)
    (item,) = report["items"]
    assert item["status"] == "added" and item["kind"] == "node"
    imported = target.store.tree.get_node(item["detail"]["node_id"])
    served = target.store.get_meta("incumbent")
    assert (imported.status, imported.parent_id, imported.scaffold_hash) == ("proposed", served, child.hash)
    assert "max_steps" in imported.diff and "fewer steps" in imported.rationale
    revert_event(target.store, report["event_id"])
    assert target.store.tree.get_node(imported.id).status == "invalid"
    # The seed scaffold is already here (the target's root): skipped, not a second node.
    again, _ = packs.export_pack(source.store, node=root.id)
    (item,) = packs.import_pack(target, again)["items"]
    assert item["status"] == "skipped" and "has this scaffold" in item["reason"]

    # A scaffold is checked as the proposer's edits are: a prompt that would pad the task to a gigabyte
    # in every task (and the smoke task the search would run first) is refused before any node exists.
    def bomb(manifest: dict, contents: dict) -> None:
        body = json.loads(contents["node/scaffold.json"])
        body["prompts"]["task"] = "{task:>1000000000}"
        contents["node/scaffold.json"] = json.dumps(body).encode()
        manifest["node"]["scaffold_hash"] = load_scaffold(json.dumps(body)).hash

    nodes = target.store.tree.list_nodes()
    (item,) = packs.import_pack(target, forge(data, bomb))["items"]
    assert item["status"] == "refused" and "width or precision over 1000" in item["reason"]
    assert target.store.tree.list_nodes() == nodes


def test_nothing_to_export_is_said(engine):
    with pytest.raises(packs.PackError, match="nothing to export"):
        packs.export_pack(engine("empty").store)


# --- through the API (the daemon owns the store while it runs) ------------------------------------------------


def test_the_routes_export_and_import_and_refuse_a_tampered_pack(engine, pack, monkeypatch):
    from fastapi.testclient import TestClient

    from evolver.api import create_app

    # The in-process client looks like TCP to the app (its scope names a port): it carries the token.
    monkeypatch.setenv("PACKS_TEST_TOKEN", "secret")
    target = engine("target", EVOLVER_DAEMON_MAX_BODY_BYTES="2000000", EVOLVER_DAEMON_TCP_TOKEN_ENV="PACKS_TEST_TOKEN")
    jobs = SimpleNamespace(jobs={}, host=SimpleNamespace(engine=target))
    host = SimpleNamespace(config=target.config, store=target.store, jobs=jobs)
    with TestClient(create_app(host), headers={"Authorization": "Bearer secret"}) as http:
        assert http.get("/v1/export").json()["error"]["type"] == "nothing_to_export"
        tampered = pack.replace(b"return text[::-1]", b"return text[::+1]")
        refused = http.post("/v1/import", json={"pack": base64.b64encode(tampered).decode()})
        assert refused.status_code == 422 and "does not match its hash" in refused.json()["error"]["message"]
        assert http.post("/v1/import", json={"pack": "not base64!"}).status_code == 422
        done = http.post("/v1/import", json={"pack": base64.b64encode(pack).decode()})
        assert done.status_code == 200 and done.json()["added"] == 3, done.text
        waiting = http.get("/v1/insights", params={"status": "probation"}).json()["insights"]
        assert len(waiting) == 2 and http.get("/v1/insights").json()["insights"] == []
        approved = http.post(f"/v1/insights/{waiting[0]['id']}/approve", json={})
        assert approved.status_code == 200 and approved.json()["kind"] == "insight_approved", approved.text
        assert [i["id"] for i in http.get("/v1/insights").json()["insights"]] == [waiting[0]["id"]]
        again = http.post(f"/v1/insights/{waiting[0]['id']}/approve", json={})
        assert again.status_code == 409 and "is active, not on probation" in again.json()["error"]["message"]
        assert http.post("/v1/insights/999999/approve", json={}).status_code == 404
        exported = http.get("/v1/export", params={"tools": "true"}).json()
        assert exported["tools"] == ["reverse_text"] and exported["insights"] == 0
        assert packs.read_pack(base64.b64decode(exported["pack"])).tools[0].code == REVERSE
        big = http.post("/v1/import", json={"pack": "A" * 2_100_000})
        assert big.status_code == 413


# --- the CLI ------------------------------------------------------------------------------------------------


def test_the_cli_exports_and_imports_with_the_daemon_down(engine, tmp_path):
    source = engine("source")
    learned(source)
    source.store.close()
    out = tmp_path / "learned.pack"
    exported = run("--data-dir", str(source.data_dir), "export", "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.startswith("wrote pack ") and "2 insights, 1 tools" in exported.stdout
    again = run("--data-dir", str(source.data_dir), "export", "--tools", "-o", str(out))
    assert again.returncode == 2 and "exists; pass --force" in again.stderr

    fresh = tmp_path / "fresh"
    printed = exported.stdout.split()[2]  # the id to publish, whole: the one --expect takes
    assert printed == packs.read_pack(out.read_bytes()).sha256
    prefix = run("--data-dir", str(fresh), "import", str(out), "--expect", printed[:16])
    assert prefix.returncode == 2 and "a prefix is refused" in prefix.stderr
    imported = run("--data-dir", str(fresh), "import", str(out), "--expect", printed)
    assert imported.returncode == 0, imported.stderr
    assert "+ tool added reverse_text v1" in imported.stdout and "3 added, 0 skipped, 0 refused" in imported.stdout
    tools = json.loads(run("--data-dir", str(fresh), "tools", "--json").stdout)
    assert [t["name"] for t in tools["synthesized"]] == ["reverse_text"]

    tampered = tmp_path / "tampered.pack"
    tampered.write_bytes(out.read_bytes().replace(b"return text[::-1]", b"return text[::+1]"))
    refused = run("--data-dir", str(fresh), "import", str(tampered))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith(
        f"error: {tampered}: pack refused: member 'tools/reverse_text/code.py' does not match its hash"
    )
    assert len(refused.stderr.strip().splitlines()) == 1
    history = json.loads(run("--data-dir", str(fresh), "history", "--json").stdout)["events"]
    assert [e["kind"] for e in history].count("import") == 1  # the refused pack changed nothing

    failing = tmp_path / "failing.pack"
    failing.write_bytes(forge(out.read_bytes(), _failing_shout))
    partly = run("--data-dir", str(fresh), "import", str(failing), "--json")
    assert partly.returncode == 1, partly.stderr
    report = json.loads(partly.stdout)
    assert report["refused"] == 1 and report["skipped"] == 3

    engine("empty").close()
    empty = run("--data-dir", str(tmp_path / "empty"), "export", "-o", str(tmp_path / "none.pack"))
    assert empty.returncode == 2 and "nothing to export" in empty.stderr
    assert not (tmp_path / "none.pack").exists()


def test_the_cli_imports_through_a_running_daemon(engine, tmp_path):
    from evolver.testing.daemon import DaemonProcess, make_root, serving

    source = engine("source")
    learned(source)
    data, _ = packs.export_pack(source.store)
    root = make_root()
    (root / "learned.pack").write_bytes(data)
    with serving(DaemonProcess(root, name="packs")) as daemon:
        env = {**daemon.env}
        imported = run("--data-dir", str(daemon.data_dir), "import", str(root / "learned.pack"), env=env)
        assert imported.returncode == 0, imported.stderr + daemon.log()
        assert "3 added" in imported.stdout
        assert "2 insights on probation: shown to no task of yours until approved" in imported.stdout
        with daemon.client() as http:
            assert [t["name"] for t in http.get("/v1/tools").json()["synthesized"]] == ["reverse_text"]
            event_id = http.get("/v1/history", params={"kind": "import"}).json()["events"][0]["id"]
        listed = run("--data-dir", str(daemon.data_dir), "insights", "--json", env=env)
        waiting = json.loads(listed.stdout)["insights"]
        assert [i["status"] for i in waiting] == ["probation", "probation"]
        shown = run("--data-dir", str(daemon.data_dir), "insights", env=env).stdout
        assert "probation" in shown and "pack:" in shown
        # Approved, it is active; a revert of the approval puts it back on probation.
        approved = run("--data-dir", str(daemon.data_dir), "insights", "approve", str(waiting[0]["id"]), env=env)
        assert approved.returncode == 0, approved.stderr
        assert f"approved insight {waiting[0]['id']}: " in approved.stdout
        twice = run("--data-dir", str(daemon.data_dir), "insights", "approve", str(waiting[0]["id"]), env=env)
        assert twice.returncode == 7 and "not on probation" in twice.stderr
        active = json.loads(
            run("--data-dir", str(daemon.data_dir), "insights", "--status", "active", "--json", env=env).stdout
        )["insights"]
        assert [i["id"] for i in active] == [waiting[0]["id"]]
        approval = approved.stdout.split()[1].rstrip(":")
        undone = run("--data-dir", str(daemon.data_dir), "history", "revert", approval, env=env)
        assert undone.returncode == 0, undone.stderr
        assert (
            json.loads(
                run("--data-dir", str(daemon.data_dir), "insights", "--status", "active", "--json", env=env).stdout
            )["insights"]
            == []
        )
        exported = run("--data-dir", str(daemon.data_dir), "export", "-o", str(root / "back.pack"), env=env)
        assert exported.returncode == 0, exported.stderr
        assert packs.read_pack((root / "back.pack").read_bytes()).tools[0].code == REVERSE
        reverted = run("--data-dir", str(daemon.data_dir), "history", "revert", str(event_id), env=env)
        assert reverted.returncode == 0, reverted.stderr  # the approval came back: not in the way
