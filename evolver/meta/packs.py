"""Learned packs: insights, synthesized tools and a node's scaffold, carried from one installation to another.

A pack is one uncompressed POSIX tar file::

    manifest.json        what the pack holds: each file's sha256 and size, each item's provenance
    manifest.sha256      the manifest's sha256, as `sha256sum` writes it: the pack's id
    insights/0001.txt    an insight's text (UTF-8), one file each
    tools/NAME/code.py   a synthesized tool's function,
    tools/NAME/tests.py  and its tests
    node/scaffold.json   a tree node's scaffold (its canonical JSON)

Why a tar and not a zip or one JSON document: the code and tests stay files a
person can read before importing (``tar tvf``, ``tar xOf PACK tools/x/code.py``)
and check (``sha256sum -c``), with nothing but the standard library on either
side. A zip has two directories that may disagree (its central directory and
its local headers) and compression a bomb can hide in; an uncompressed tar is
read front to back, exactly as it is, and is never bigger inside than on disk.
The pack is content-addressed the way a Merkle tree is: the manifest names
every file by its hash, and the manifest's own hash names the pack, so one
changed byte anywhere changes the id or fails a check. Packs are written
deterministically (sorted, no times or owners), so the same items make the
same bytes and the same id. The hash proves integrity, not authorship: to
know a pack is the one its author published, compare its id with the one
they gave you (``evolver import PACK --expect ID``).

Reading a pack is refusing it whole at the first thing wrong, naming it: over
``MAX_PACK_BYTES``, not a tar, a member that is not a plain file (a link, a
directory, a device), an absolute path or one that climbs out with ``..``, a
name outside the layout above or not in the manifest, a name twice, a member
over ``MAX_MEMBER_BYTES``, an unknown manifest version, a manifest that does
not match its hash, a file that does not match the manifest's, a tool whose
``code_hash`` does not match its code and tests. Nothing is written before
all of it passed; nothing of the pack runs on the host.

Importing a verified pack goes through what the meta-agent's own changes go
through: every tool through quarantine in the sandbox, with the checks of
tool synthesis (``synthesize.candidate_spec`` and ``synthesize.vet_tool``: its
tests, and the tests of the version it would replace, a duplicate of another
tool refused), insights through distillation's ADD with its similarity
dedup (``insights.plan_changes``/``apply_changes``). A tool that fails is refused
with its reason while the rest may still come in (a failing tool is not
tampering). Nothing local is overwritten silently: a tool under the name of an
active one is its next version only if it also passes that one's tests (as
synthesis does it), one whose code is already here is skipped, an insight too
similar to an active one is skipped, and each is reported. A node's scaffold
is checked as the proposer's edits are and becomes a proposed child of the
incumbent (a store without a tree gets its seed root first, as the daemon's
start makes it), which the tree search validates (hooks in their sandbox, a
smoke task) and evaluates like any other: never served until it earns a
promotion. Everything imported is one ``import`` event that `evolver history
revert` undoes (``revert.revert_event``).

What quarantine cannot judge is intent: an insight is an instruction the agent
will read, and a tool's docstring is shown to the model. Both are plain files
in the pack, to be read before importing; once here, the prune job measures
them like anything learned here and retires what does not help.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memory import ExperienceStore, NewTool, NotFound
from tools import BUILTIN_SOURCES, ToolFileError, ToolFiles, code_hash

from .. import __version__
from ..agent.engine import Engine
from ..agent.scaffold import ScaffoldError, load_scaffold
from ..text import clip
from ..tree.incumbent import ensure_root, incumbent, scaffold_of
from ..tree.proposer import EDITABLE, InvalidProposal, apply_edit, scaffold_diff
from .insights import InsightOp, InsightOpError, apply_changes, parse_ops, plan_changes
from .prune import insight_effects, tool_effects
from .synthesize import ToolRejected, candidate_spec, vet_tool

__all__ = ["FORMAT", "MAX_PACK_BYTES", "VERSION", "Pack", "PackError", "export_json", "export_pack", "import_pack",
           "read_pack"]

FORMAT, VERSION = "evolver-pack", 1
MAX_PACK_BYTES = 8 * 1024 * 1024
MAX_MEMBER_BYTES = 1024 * 1024
MAX_INSIGHTS, MAX_TOOLS = 200, 200
MAX_MEMBERS = 3 + MAX_INSIGHTS + 2 * MAX_TOOLS
PROMPTS, PROMPT_CHARS = 3, 160  # source prompts shown per item, clipped

MANIFEST, MANIFEST_HASH = "manifest.json", "manifest.sha256"
_LAYOUT = re.compile(r"^(?:insights/\d{4}\.txt|tools/[a-z][a-z0-9_]{1,63}/(?:code|tests)\.py|node/scaffold\.json)$")
_HASH_LINE = re.compile(r"^([0-9a-f]{64})  manifest\.json\n?$")


class PackError(ValueError):
    """The pack is refused whole (or cannot be made); the message names the problem. Nothing was changed."""


# --- the manifest --------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


Short = Annotated[str, Field(max_length=200)]


class _File(_Strict):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0, le=MAX_MEMBER_BYTES)


class _TestResult(_Strict):
    name: Short
    ok: bool
    error: str | None = Field(default=None, max_length=1000)


class _Effect(_Strict):
    exposures: int = Field(ge=0)
    helped: int = Field(ge=0)
    hurt: int = Field(ge=0)
    difference: float = Field(ge=-1, le=1)
    interval: list[float] = Field(min_length=2, max_length=2)


class _Counts(_Strict):
    successes: int = Field(ge=0)
    failures: int = Field(ge=0)


class _Provenance(_Strict):
    """Where an item came from, as its exporter saw it (shown and kept in the import's event; never trusted)."""

    trajectories: int = Field(default=0, ge=0)  # how many source trajectories
    prompts: list[Annotated[str, Field(max_length=PROMPT_CHARS)]] = Field(default_factory=list, max_length=PROMPTS)
    packs: list[Annotated[str, Field(max_length=80)]] = Field(default_factory=list, max_length=20)  # imported from
    event: str | None = Field(default=None, max_length=40)  # the kind of event that made it
    made_at: float | None = None
    model: str | None = Field(default=None, max_length=200)
    cost_usd: float | None = Field(default=None, ge=0)
    tests: str | None = Field(default=None, max_length=500)  # quarantine's summary
    test_results: list[_TestResult] = Field(default_factory=list, max_length=200)
    uses: int | None = Field(default=None, ge=0)
    successes: int | None = Field(default=None, ge=0)
    failures: int | None = Field(default=None, ge=0)
    effect: _Effect | None = None
    train: _Counts | None = None  # a node's evaluations
    held_out: _Counts | None = None


class _Insight(_Strict):
    file: str
    importance: int = Field(ge=0, le=1000)
    provenance: _Provenance = _Provenance()


class _Tool(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{1,63}$")
    version: int = Field(ge=1)
    description: str = Field(max_length=4000)
    code: str
    tests: str
    code_hash: str = Field(pattern=r"^[0-9a-f]{16}$")
    provenance: _Provenance = _Provenance()


class _Node(_Strict):
    id: Short
    file: str
    scaffold_hash: str = Field(pattern=r"^[0-9a-f]{16}$")
    status: str = Field(max_length=40)
    rationale: str = Field(max_length=4000)
    provenance: _Provenance = _Provenance()


class _Manifest(_Strict):
    format: Literal["evolver-pack"]
    version: Literal[1]
    evolver: str = Field(max_length=40)
    model: str | None = Field(default=None, max_length=200)
    files: dict[str, _File] = Field(max_length=MAX_MEMBERS)
    insights: list[_Insight] = Field(default_factory=list, max_length=MAX_INSIGHTS)
    tools: list[_Tool] = Field(default_factory=list, max_length=MAX_TOOLS)
    node: _Node | None = None


@dataclass(frozen=True)
class PackInsight:
    number: int
    text: str
    importance: int
    provenance: dict


@dataclass(frozen=True)
class PackTool:
    name: str
    version: int
    description: str
    code: str
    tests: str
    code_hash: str
    provenance: dict


@dataclass(frozen=True)
class PackNode:
    id: str
    scaffold: str
    scaffold_hash: str
    rationale: str
    provenance: dict


@dataclass(frozen=True)
class Pack:
    """A verified pack: every hash checked, every file accounted for."""

    sha256: str
    evolver: str
    model: str | None
    insights: list[PackInsight]
    tools: list[PackTool]
    node: PackNode | None

    @property
    def id(self) -> str:
        return self.sha256[:16]


def _canonical(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- export -------------------------------------------------------------------------------------------


def _prompts(store: ExperienceStore, ids: list) -> tuple[int, list[str]]:
    """How many source trajectories, and a few of their prompts (only learnable ones: a held-out task's
    prompt never leaves in a pack)."""
    trajectories = [i for i in ids if isinstance(i, str) and i.startswith("traj_")]
    shown = []
    for trajectory_id in sorted(store.learnable(trajectories))[:PROMPTS]:
        try:
            shown.append(clip(store.get_trajectory(trajectory_id).prompt, PROMPT_CHARS, one_line=True))
        except NotFound:
            continue
    return len(trajectories), shown


def _effect(effect) -> dict:
    data = effect.as_dict()
    return {k: data[k] for k in ("exposures", "helped", "hurt", "difference", "interval")}


def _event_provenance(store: ExperienceStore, event_id: int | None) -> dict:
    if event_id is None:
        return {}
    try:
        event = store.get_event(event_id)
    except NotFound:
        return {}
    packs = [f"pack:{event.payload['pack'][:16]}"] if event.kind == "import" and event.payload.get("pack") else []
    return {"event": event.kind, "made_at": event.at, "cost_usd": event.cost_usd, "packs": packs,
            **({"tests": clip(event.payload["quarantine"], 500)} if event.payload.get("quarantine") else {}),
            "test_results": [{"name": clip(str(t.get("name")), 200), "ok": bool(t.get("ok")),
                              "error": None if t.get("error") is None else clip(str(t["error"]), 1000)}
                             for t in (event.payload.get("tests") or [])[:200] if isinstance(t, dict)]}


def _insight_items(store: ExperienceStore, model: str | None) -> list[tuple[dict, bytes]]:
    rows = store.list_insights(status="active", limit=MAX_INSIGHTS)
    effects = insight_effects(store, rows)
    items = []
    for n, insight in enumerate(rows, start=1):
        count, prompts = _prompts(store, list(insight.provenance))
        history = store.insight_history(insight.id)
        made = _event_provenance(store, history[0]["event_id"] if history else None)
        made.pop("test_results", None)
        packs = sorted({*made.pop("packs", []), *(p for p in insight.provenance
                                                  if isinstance(p, str) and p.startswith("pack:"))})[:20]
        provenance = {"trajectories": count, "prompts": prompts, "packs": packs, "model": model, **made,
                      "effect": _effect(effects[insight.id])}
        items.append(({"file": f"insights/{n:04d}.txt", "importance": insight.importance,
                       "provenance": provenance}, insight.text.encode()))
    return items


def _tool_items(store: ExperienceStore, model: str | None, names: set[str] | None,
                left_out: list[dict]) -> list[tuple[dict, bytes, bytes]]:
    rows = [t for t in store.list_tools(status="active") if t.origin == "synthesized"
            and (names is None or t.name in names)]
    effects = tool_effects(store, rows)
    files = ToolFiles(Path(store.data_dir) / "tools")
    items = []
    for tool in rows:
        try:
            code, tests = files.read(tool.name, tool.version, tool.code_hash)
        except ToolFileError as exc:  # never ship what is not what was tested
            left_out.append({"kind": "tool", "name": tool.name, "reason": str(exc)})
            continue
        made = _event_provenance(store, tool.event_id)
        evidence = []
        if tool.event_id is not None:
            evidence = store.get_event(tool.event_id).evidence
        count, prompts = _prompts(store, list(evidence))
        provenance = {"trajectories": count, "prompts": prompts, "model": model, **made, "uses": tool.uses,
                      "successes": tool.successes, "failures": tool.failures,
                      "effect": _effect(effects[tool.name])}
        entry = {"name": tool.name, "version": tool.version, "description": clip(tool.description, 4000),
                 "code": f"tools/{tool.name}/code.py", "tests": f"tools/{tool.name}/tests.py",
                 "code_hash": code_hash(code, tests), "provenance": provenance}
        items.append((entry, code.encode(), tests.encode()))
    return items


def _node_item(store: ExperienceStore, node_id: str, model: str | None) -> tuple[dict, bytes, set[str]]:
    node = store.get_node(node_id)  # NotFound names it
    scaffold = scaffold_of(store, node)
    counts = {"train": [0, 0], "test": [0, 0]}
    for evaluation in store.evaluations_of(node.id):
        if evaluation.success is not None and evaluation.split in counts:
            counts[evaluation.split][0 if evaluation.success else 1] += 1
    provenance = {"model": model, "cost_usd": node.cost_usd,
                  "train": {"successes": counts["train"][0], "failures": counts["train"][1]},
                  "held_out": {"successes": counts["test"][0], "failures": counts["test"][1]}}
    entry = {"id": node.id, "file": "node/scaffold.json", "scaffold_hash": scaffold.hash, "status": node.status,
             "rationale": clip(node.rationale, 4000), "provenance": provenance}
    synthesized = {name for name in scaffold.tools if name not in BUILTIN_SOURCES}
    return entry, scaffold.canonical_json().encode(), synthesized


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    """The members as an uncompressed tar, byte for byte the same for the same members."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime, info.uid, info.gid = len(data), 0o644, 0, 0, 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def export_pack(store: ExperienceStore, *, insights: bool = False, tools: bool = False, node: str | None = None,
                model: str | None = None) -> tuple[bytes, dict]:
    """A pack of the active insights (``insights``), the active synthesized tools (``tools``) and node
    ``node``'s scaffold with the synthesized tools it names; with none of them, insights and tools.
    ``model`` is the model this installation is configured with (the store does not record which
    model wrote each item). Returns the pack's bytes and a summary; PackError when it would be empty."""
    if not (insights or tools or node):
        insights = tools = True
    left_out: list[dict] = []
    files: dict[str, bytes] = {}
    manifest: dict = {"format": FORMAT, "version": VERSION, "evolver": __version__, "model": model,
                      "insights": [], "tools": [], "node": None}
    wanted: set[str] | None = None if tools else set()
    if node:
        entry, body, named = _node_item(store, node, model)
        manifest["node"] = entry
        files[entry["file"]] = body
        if wanted is not None:
            wanted |= named
    if insights:
        for entry, text in _insight_items(store, model):
            manifest["insights"].append(entry)
            files[entry["file"]] = text
    if wanted is None or wanted:
        for entry, code, tests in _tool_items(store, model, wanted, left_out):
            manifest["tools"].append(entry)
            files[entry["code"]], files[entry["tests"]] = code, tests
        if wanted:
            missing = wanted - {t["name"] for t in manifest["tools"]}
            left_out += [{"kind": "tool", "name": name, "reason": "the scaffold names it, but it is not an active "
                          "synthesized tool here"} for name in sorted(missing)]
    if not (manifest["insights"] or manifest["tools"] or manifest["node"]):
        raise PackError("nothing to export: there are no active insights or synthesized tools "
                        "(`evolver insights`, `evolver tools`)")
    manifest["files"] = {name: {"sha256": _sha(data), "bytes": len(data)} for name, data in sorted(files.items())}
    body = _canonical(manifest)
    _Manifest.model_validate(json.loads(body))  # what import would refuse is never written
    digest = _sha(body)
    data = _tar([(MANIFEST, body), (MANIFEST_HASH, f"{digest}  {MANIFEST}\n".encode()),
                 *sorted(files.items())])
    if len(data) > MAX_PACK_BYTES:
        raise PackError(f"the pack would be {len(data)} bytes, over the {MAX_PACK_BYTES}-byte cap; export "
                        "fewer kinds of items at once (--insights, --tools)")
    summary = {"id": digest[:16], "sha256": digest, "bytes": len(data), "insights": len(manifest["insights"]),
               "tools": [t["name"] for t in manifest["tools"]],
               "node": manifest["node"]["id"] if manifest["node"] else None, "left_out": left_out}
    return data, summary


def export_json(store: ExperienceStore, model: str | None = None, *, insights: bool = False, tools: bool = False,
                node: str | None = None) -> dict:
    """``export_pack`` as JSON (the API's answer, and the CLI's when the daemon is down): the summary and
    the pack's bytes in base64."""
    data, summary = export_pack(store, insights=insights, tools=tools, node=node, model=model)
    return {**summary, "pack": base64.b64encode(data).decode("ascii")}


# --- reading and verifying ----------------------------------------------------------------------------


def _kind_of(info: tarfile.TarInfo) -> str:
    if info.issym():
        return f"a symbolic link (to {info.linkname!r})"
    if info.islnk():
        return f"a hard link (to {info.linkname!r})"
    if info.isdir():
        return "a directory"
    if info.issparse() or info.type == tarfile.CONTTYPE:
        return "a sparse or continued file"
    return "a device or other special file"


def _check_name(name: str) -> None:
    if name.startswith("/"):
        raise PackError(f"member {name!r} has an absolute path; a pack holds only its own relative paths")
    parts = name.split("/")
    if ".." in parts:
        raise PackError(f"member {name!r} would leave the pack (its path climbs out with '..')")
    if "\\" in name or "\x00" in name or any(p in ("", ".") for p in parts):
        raise PackError(f"member {name!r} has a path that is not plain (empty or '.' parts, a backslash)")


def _members(data: bytes) -> dict[str, bytes]:
    """Every member of the tar, each checked before it is read; PackError at the first thing wrong."""
    members: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for count, info in enumerate(tar, start=1):
                if count > MAX_MEMBERS:
                    raise PackError(f"the pack has more than {MAX_MEMBERS} members")
                name = info.name
                _check_name(name)
                # Plain files only: not links, directories or devices, nor sparse or continued files,
                # whose contents could be bigger than the bytes the pack holds.
                if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
                    raise PackError(f"member {name!r} is {_kind_of(info)}; a pack holds only plain files")
                if name in members:
                    raise PackError(f"member {name!r} appears twice")
                if name not in (MANIFEST, MANIFEST_HASH) and not _LAYOUT.match(name):
                    raise PackError(f"unknown member {name!r}: a pack holds only {MANIFEST}, {MANIFEST_HASH}, "
                                    "insights/NNNN.txt, tools/NAME/code.py, tools/NAME/tests.py and "
                                    "node/scaffold.json")
                if info.size > MAX_MEMBER_BYTES:
                    raise PackError(f"member {name!r} is {info.size} bytes, over the {MAX_MEMBER_BYTES}-byte cap")
                total += info.size
                if total > len(data):
                    raise PackError(f"member {name!r} claims more bytes than the pack holds")
                handle = tar.extractfile(info)
                content = handle.read(MAX_MEMBER_BYTES + 1) if handle is not None else b""
                if len(content) != info.size:
                    raise PackError(f"member {name!r} is cut short ({len(content)} of {info.size} bytes)")
                members[name] = content
    except PackError:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError, UnicodeError, OverflowError) as exc:
        raise PackError(f"not a pack (an uncompressed tar as `evolver export` writes): {exc}") from None
    return members


def _text(members: dict[str, bytes], name: str) -> str:
    try:
        return members[name].decode("utf-8")
    except UnicodeDecodeError:
        raise PackError(f"member {name!r} is not UTF-8 text") from None


def _manifest(members: dict[str, bytes], expect: str | None) -> tuple[_Manifest, str]:
    if MANIFEST not in members:
        raise PackError(f"the pack has no {MANIFEST}; is it a pack `evolver export` wrote?")
    if MANIFEST_HASH not in members:
        raise PackError(f"the pack has no {MANIFEST_HASH}, the manifest's hash that names the pack")
    claimed = _HASH_LINE.match(members[MANIFEST_HASH].decode("ascii", errors="replace"))
    if claimed is None:
        raise PackError(f"{MANIFEST_HASH} is malformed: it must be one line, '<sha256>  {MANIFEST}'")
    digest = _sha(members[MANIFEST])
    if digest != claimed.group(1):
        raise PackError(f"the manifest does not match its hash ({MANIFEST_HASH} says {claimed.group(1)[:16]}, "
                        f"its bytes hash to {digest[:16]}): the pack was altered or damaged")
    if expect is not None and not digest.startswith(expect.lower()):
        raise PackError(f"the pack is {digest[:16]}, not the {expect} you expected: it is another pack, or "
                        "it was altered")

    def no_constant(name: str):
        raise ValueError(f"{name} is not a JSON number")

    try:
        raw = json.loads(_text(members, MANIFEST), parse_constant=no_constant)
    except (ValueError, RecursionError) as exc:
        raise PackError(f"{MANIFEST} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise PackError(f"{MANIFEST} is not an evolver pack's manifest (its format is not {FORMAT!r})")
    if raw.get("version") != VERSION:
        raise PackError(f"pack format version {raw.get('version')!r} is not supported (this evolver, "
                        f"{__version__}, reads version {VERSION})")
    try:
        return _Manifest.model_validate(raw), digest
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        raise PackError(f"{MANIFEST}: {where}: {problem['msg']}") from None


def read_pack(data: bytes, *, expect: str | None = None) -> Pack:
    """The verified pack in ``data``, or PackError naming the first problem (the pack is refused whole).
    With ``expect``, the pack's id must start with it."""
    if not data:
        raise PackError("the pack is empty")
    if len(data) > MAX_PACK_BYTES:
        raise PackError(f"the pack is {len(data)} bytes, over the {MAX_PACK_BYTES}-byte cap")
    if expect is not None and not re.fullmatch(r"[0-9a-fA-F]{8,64}", expect):
        raise PackError(f"--expect takes a pack id: 8 to 64 hex digits, not {expect!r}")
    members = _members(data)
    manifest, digest = _manifest(members, expect)
    listed = set(manifest.files)
    for name in sorted(set(members) - {MANIFEST, MANIFEST_HASH} - listed):
        raise PackError(f"unknown member {name!r}: the manifest does not list it")
    for name in sorted(listed):
        if name not in members:
            raise PackError(f"member {name!r}, listed in the manifest, is missing")
        entry, content = manifest.files[name], members[name]
        if len(content) != entry.bytes or _sha(content) != entry.sha256:
            raise PackError(f"member {name!r} does not match its hash in the manifest: the pack was altered or "
                            "damaged")
    # The members are what the hashes vouch for; the rest of the file (headers, padding, the end) must be
    # exactly what export writes for them, so no byte of a pack goes unchecked.
    if _tar(list(members.items())) != data:
        raise PackError("the pack's bytes are not exactly what `evolver export` writes for its members (headers, "
                        "padding or trailing data differ): the pack was altered or damaged")
    used: set[str] = set()

    def claim(name: str, pattern: str, what: str) -> str:
        if not re.fullmatch(pattern, name):
            raise PackError(f"{what} names file {name!r}, which is not where such an item lives")
        if name not in listed:
            raise PackError(f"{what} names file {name!r}, which the manifest does not list")
        if name in used:
            raise PackError(f"file {name!r} belongs to two items")
        used.add(name)
        return _text(members, name)

    insights = [PackInsight(number=n, text=claim(i.file, r"insights/\d{4}\.txt", f"insight {n}"),
                            importance=i.importance, provenance=i.provenance.model_dump(exclude_none=True))
                for n, i in enumerate(manifest.insights, start=1)]
    tools, names = [], set()
    for t in manifest.tools:
        if t.name in names:
            raise PackError(f"tool {t.name!r} appears twice")
        names.add(t.name)
        code = claim(t.code, rf"tools/{t.name}/code\.py", f"tool {t.name}")
        tests = claim(t.tests, rf"tools/{t.name}/tests\.py", f"tool {t.name}")
        if code_hash(code, tests) != t.code_hash:
            raise PackError(f"tool {t.name!r}: its code_hash {t.code_hash} does not match its code and tests "
                            f"({code_hash(code, tests)}): the pack was altered or damaged")
        tools.append(PackTool(name=t.name, version=t.version, description=t.description, code=code, tests=tests,
                              code_hash=t.code_hash, provenance=t.provenance.model_dump(exclude_none=True)))
    node = None
    if manifest.node is not None:
        n = manifest.node
        node = PackNode(id=n.id, scaffold=claim(n.file, r"node/scaffold\.json", f"node {n.id}"),
                        scaffold_hash=n.scaffold_hash, rationale=n.rationale,
                        provenance=n.provenance.model_dump(exclude_none=True))
    for name in sorted(listed - used):
        raise PackError(f"file {name!r} is listed in the manifest but belongs to no item")
    return Pack(sha256=digest, evolver=manifest.evolver, model=manifest.model, insights=insights, tools=tools,
                node=node)


# --- import ---------------------------------------------------------------------------------------------


@dataclass
class _Outcome:
    kind: str  # "insight", "tool" or "node"
    name: str
    status: str  # "added", "skipped" or "refused"
    reason: str = ""
    detail: dict | None = None


def _vet_tools(engine: Engine, files: ToolFiles, pack: Pack, node_id: str | None, outcomes: list[_Outcome]):
    """Each tool of the pack through quarantine, as tool synthesis checks its own; returns those that pass."""
    store = engine.store
    passed = []
    local = store.list_tools(status=None)
    for tool in pack.tools:
        same = [t for t in local if t.name == tool.name and t.code_hash == tool.code_hash]
        if same:
            here = same[-1]
            reason = (f"v{here.version} here has this code and tests" if here.status == "active" else
                      f"v{here.version} here has this code and tests and is {here.status}, as decided here; "
                      f"`evolver tools show {tool.name}` shows the event that did it, which `evolver history "
                      "revert` undoes")
            outcomes.append(_Outcome("tool", tool.name, "skipped", reason))
            continue
        held = engine.registry.get(tool.name)
        if held is not None and held.origin not in ("synthesized", "builtin"):  # a built-in: candidate_spec says
            outcomes.append(_Outcome("tool", tool.name, "refused", f"the name belongs to a {held.origin} tool here"))
            continue
        if not engine.sandbox.isolated:
            outcomes.append(_Outcome("tool", tool.name, "refused", "the sandbox is degraded (no bubblewrap): a "
                                     "pack's code is never run without isolation"))
            continue
        try:
            spec = candidate_spec(tool.name, tool.code, tool.tests, node_id=node_id)
            replaced, report = vet_tool(engine, files, spec)
        except ToolRejected as exc:
            outcomes.append(_Outcome("tool", tool.name, "refused", str(exc)))
            continue
        passed.append((tool, spec, replaced, report))
    return passed


def _plan_insights(engine: Engine, pack: Pack, outcomes: list[_Outcome]) -> list[dict]:
    """The changes distillation's ADD would make of the pack's insights, less those its similarity dedup
    would merge into an active insight here (skipped: a pack never upvotes or edits a local insight)."""
    store, e = engine.store, engine.config.evolution
    known = {" ".join(i.text.split()): i for i in store.list_insights(status=None, limit=100_000)}
    ops: list[tuple[InsightOp, str, dict]] = []
    seen: dict[str, int] = {}
    for insight in pack.insights:
        label = clip(insight.text, 80, one_line=True)
        try:
            (op,) = parse_ops([{"op": "ADD", "text": insight.text}], shown=0, max_ops=1)
        except InsightOpError as exc:
            outcomes.append(_Outcome("insight", label, "refused",
                                     str(exc).replace("operation 1", f"insight {insight.number}")))
            continue
        if op.text in seen:
            outcomes.append(_Outcome("insight", label, "skipped", f"the same text as the pack's insight "
                                                                  f"{seen[op.text]}"))
            continue
        seen[op.text] = insight.number
        here = known.get(op.text)
        if here is not None:
            outcomes.append(_Outcome("insight", label, "skipped", f"insight {here.id} here has this text "
                                                                  f"({here.status})"))
            continue
        ops.append((op, label, insight.provenance))
    planned = plan_changes(store, [op for op, _, _ in ops], [], provenance=[f"pack:{pack.id}"], cap=e.max_insights,
                           merge_threshold=e.insight_merge_threshold) if ops else []
    changes = []
    for (_, label, provenance), change in zip(ops, planned):
        if change["op"] != "ADD":
            outcomes.append(_Outcome("insight", label, "skipped",
                                     f"too similar to insight {change['id']} here (at or over "
                                     f"insight_merge_threshold {e.insight_merge_threshold}): "
                                     f"{clip(store.get_insight(change['id']).text, 80, one_line=True)!r}"))
            continue
        changes.append(change)
        outcomes.append(_Outcome("insight", label, "added", detail={"provenance": provenance}))
    return changes


def _plan_node(engine: Engine, pack: Pack, outcomes: list[_Outcome]):
    """The pack's scaffold as a proposed child of the incumbent: (scaffold, parent) or None."""
    if pack.node is None:
        return None
    store = engine.store
    try:
        scaffold = load_scaffold(pack.node.scaffold)
    except ScaffoldError as exc:
        outcomes.append(_Outcome("node", pack.node.id, "refused", str(exc)))
        return None
    if scaffold.hash != pack.node.scaffold_hash:
        outcomes.append(_Outcome("node", pack.node.id, "refused", f"its scaffold is {scaffold.hash} here, not "
                                 f"{pack.node.scaffold_hash} as the pack says (another evolver version?)"))
        return None
    twin = next((n for n in store.list_nodes() if n.scaffold_hash == scaffold.hash), None)
    if twin is not None:
        outcomes.append(_Outcome("node", pack.node.id, "skipped", f"node {twin.id} here has this scaffold"))
        return None
    parent = incumbent(store) or ensure_root(store, engine.seed_scaffold())
    # As an edit of the incumbent, checked as the proposer's edits are (its prompts render, within bounds).
    data = scaffold.model_dump(mode="json")
    try:
        child = apply_edit(scaffold_of(store, parent), {key: data[key] for key in EDITABLE})
    except InvalidProposal as exc:
        outcomes.append(_Outcome("node", pack.node.id, "refused", str(exc)))
        return None
    return child, parent


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def import_pack(engine: Engine, data: bytes, *, expect: str | None = None) -> dict:
    """Verify the pack (PackError refuses it whole, nothing changed), vet what it holds, and record what
    passes as one ``import`` event. Returns the report: each item added, skipped or refused, with why."""
    pack = read_pack(data, expect=expect)
    store, e = engine.store, engine.config.evolution
    files = ToolFiles(engine.data_dir / "tools")
    served = incumbent(store)
    outcomes: list[_Outcome] = []
    tools = _vet_tools(engine, files, pack, served.id if served else None, outcomes)
    insight_changes = _plan_insights(engine, pack, outcomes)
    planned_node = _plan_node(engine, pack, outcomes)
    new_tools, replaced_ids, tool_payload = [], {}, []
    for tool, spec, replaced, report in tools:
        version = store.next_tool_version(spec.name)
        digest = files.write(spec.name, version, spec.code, spec.tests)  # durable before the row names it
        new_tools.append(NewTool(name=spec.name, description=spec.description, code_hash=digest, version=version,
                                 node_id=spec.node_id))
        if replaced is not None:
            replaced_ids[replaced.id] = "replaced"
        tool_payload.append({"name": spec.name, "version": version, "pack_version": tool.version,
                             "replaces": replaced.version if replaced else None, "quarantine": report.summary(),
                             "tests": report.tests, "provenance": tool.provenance})
        outcomes.append(_Outcome("tool", spec.name, "added", report.summary(),
                                 {"version": version, "replaces": replaced.version if replaced else None}))
    added = [o for o in outcomes if o.status == "added"]
    counts = {s: sum(o.status == s for o in outcomes) for s in ("added", "skipped", "refused")}
    what = (f"imported pack {pack.id}: {_count(sum(o.kind == 'insight' for o in added), 'insight')}, "
            f"{_count(len(new_tools), 'tool')}" + (f" ({', '.join(t.name for t in new_tools)})" if new_tools else "") +
            (", 1 node" if planned_node else "") +
            (f"; {counts['refused']} refused" if counts["refused"] else "") +
            (f"; {counts['skipped']} skipped" if counts["skipped"] else ""))
    payload = {"pack": pack.sha256, "evolver": pack.evolver, "model": pack.model, "tools": tool_payload,
               "insights": [{"text": o.name, **(o.detail or {})} for o in added if o.kind == "insight"],
               "refused": [{"kind": o.kind, "name": o.name, "reason": o.reason} for o in outcomes
                           if o.status == "refused"],
               "skipped": [{"kind": o.kind, "name": o.name, "reason": o.reason} for o in outcomes
                           if o.status == "skipped"]}
    with store.transaction():  # the event, its tools, its insights and its node: all or nothing
        for tool in new_tools:
            if store.next_tool_version(tool.name) != tool.version:
                raise PackError(f"tool {tool.name} changed here while the pack was checked; import it again")
        node = None
        if planned_node is not None:
            scaffold, parent = planned_node
            store.put_scaffold(scaffold.hash, scaffold.canonical_json())
            rationale = clip(f"imported from pack {pack.id} (node {pack.node.id} there): {pack.node.rationale}",
                             4000)
            node = store.add_node(scaffold.hash, parent_id=parent.id, status="proposed", rationale=rationale,
                                  diff=scaffold_diff(scaffold_of(store, parent), scaffold))
            payload["node_changes"] = [{"id": node.id, "before": None, "after": "proposed"}]
            payload["node"] = {"id": node.id, "pack_node": pack.node.id, "provenance": pack.node.provenance}
            outcomes.append(_Outcome("node", pack.node.id, "added", f"proposed as node {node.id}, a child of "
                                     f"{parent.id}; the tree search validates and evaluates it",
                                     {"node_id": node.id}))
        served = incumbent(store)
        event = store.apply_tool_changes("import", what, why=f"a learned pack from evolver {pack.evolver}"
                                         f"{f' ({pack.model})' if pack.model else ''}",
                                         node_id=served.id if served else None, payload=payload, new=new_tools,
                                         status=replaced_ids)
        if insight_changes:  # planned outside the transaction: embedding is slow, and the store waits
            apply_changes(store, insight_changes, cap=e.max_insights, event_id=event.id)
    engine.toolbox.refresh()
    changes = store.insight_changes_of(event.id)
    ids = iter(c["insight_id"] for c in changes if c["op"] == "ADD")
    for outcome in outcomes:
        if outcome.kind == "insight" and outcome.status == "added":
            outcome.detail = {"id": next(ids, None)}
    return {"id": pack.id, "sha256": pack.sha256, "evolver": pack.evolver, "model": pack.model,
            "event_id": event.id, **counts,
            "retired_by_cap": [c["insight_id"] for c in changes if c["op"] == "CAP"],
            "items": [{k: v for k, v in asdict(o).items() if v not in (None, "")} for o in outcomes]}
