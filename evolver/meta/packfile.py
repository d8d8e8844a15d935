"""The pack file: its layout, its manifest, writing it, and reading it back verified (``evolver.meta.packs``
fills it and takes it in).

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
directory, a device, a sparse file), an absolute path or one that climbs out
with ``..``, a name outside the layout above or not in the manifest, a name
twice, a member over ``MAX_MEMBER_BYTES``, an unknown manifest version, a
manifest that does not match its hash, a file that does not match the
manifest's, a tool whose ``code_hash`` does not match its code and tests, and
any other byte (a header, padding, data after the end) that differs from what
``write_pack`` writes for those members. Nothing is written before all of it
passed; nothing of the pack runs on the host: reading never extracts to disk.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tools import code_hash

from .. import __version__

__all__ = [
    "FORMAT",
    "MANIFEST",
    "MANIFEST_HASH",
    "MAX_INSIGHTS",
    "MAX_MEMBER_BYTES",
    "MAX_PACK_BYTES",
    "MAX_TOOLS",
    "PROMPTS",
    "PROMPT_CHARS",
    "VERSION",
    "Pack",
    "PackError",
    "PackInsight",
    "PackNode",
    "PackTool",
    "read_pack",
    "write_pack",
]

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


def write_pack(manifest: dict, files: dict[str, bytes]) -> tuple[bytes, str]:
    """The pack of ``manifest`` (its items; ``files`` and its header are filled in here) and ``files``:
    its bytes and its sha256 (the manifest's). PackError when import would refuse it."""
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "evolver": __version__,
        **manifest,
        "files": {name: {"sha256": _sha(data), "bytes": len(data)} for name, data in sorted(files.items())},
    }
    body = _canonical(manifest)
    try:
        _Manifest.model_validate(json.loads(body))  # what import would refuse is never written
    except ValidationError as exc:
        raise PackError(f"the pack would not be valid: {exc.errors()[0]['msg']}") from None
    digest = _sha(body)
    data = _tar([(MANIFEST, body), (MANIFEST_HASH, f"{digest}  {MANIFEST}\n".encode()), *sorted(files.items())])
    if len(data) > MAX_PACK_BYTES:
        raise PackError(
            f"the pack would be {len(data)} bytes, over the {MAX_PACK_BYTES}-byte cap; export "
            "fewer kinds of items at once (--insights, --tools)"
        )
    return data, digest


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
                    raise PackError(
                        f"unknown member {name!r}: a pack holds only {MANIFEST}, {MANIFEST_HASH}, "
                        "insights/NNNN.txt, tools/NAME/code.py, tools/NAME/tests.py and "
                        "node/scaffold.json"
                    )
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
        raise PackError(
            f"the manifest does not match its hash ({MANIFEST_HASH} says {claimed.group(1)[:16]}, "
            f"its bytes hash to {digest[:16]}): the pack was altered or damaged"
        )
    if expect is not None and digest != expect.lower():
        raise PackError(f"the pack is {digest}, not the {expect} you expected: it is another pack, or it was altered")

    def no_constant(name: str):
        raise ValueError(f"{name} is not a JSON number")

    try:
        raw = json.loads(_text(members, MANIFEST), parse_constant=no_constant)
    except (ValueError, RecursionError) as exc:
        raise PackError(f"{MANIFEST} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise PackError(f"{MANIFEST} is not an evolver pack's manifest (its format is not {FORMAT!r})")
    if raw.get("version") != VERSION:
        raise PackError(
            f"pack format version {raw.get('version')!r} is not supported (this evolver, "
            f"{__version__}, reads version {VERSION})"
        )
    try:
        return _Manifest.model_validate(raw), digest
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        raise PackError(f"{MANIFEST}: {where}: {problem['msg']}") from None


def read_pack(data: bytes, *, expect: str | None = None) -> Pack:
    """The verified pack in ``data``, or PackError naming the first problem (the pack is refused whole).
    With ``expect``, the pack's id must be it, whole: a prefix a person pinned is cheap to forge (8 hex
    digits take a forger minutes), the 64 digits are not."""
    if not data:
        raise PackError("the pack is empty")
    if len(data) > MAX_PACK_BYTES:
        raise PackError(f"the pack is {len(data)} bytes, over the {MAX_PACK_BYTES}-byte cap")
    if expect is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", expect):
        whole = (
            "a prefix is refused, as one is cheap to forge"
            if re.fullmatch(r"[0-9a-fA-F]{1,63}", expect)
            else f"not {expect!r}"
        )
        raise PackError(f"--expect takes the pack's whole id, the 64 hex digits `evolver export` prints; {whole}")
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
            raise PackError(f"member {name!r} does not match its hash in the manifest: the pack was altered or damaged")
    # The members are what the hashes vouch for; the rest of the file (headers, padding, the end) must be
    # exactly what export writes for them, so no byte of a pack goes unchecked.
    if _tar(list(members.items())) != data:
        raise PackError(
            "the pack's bytes are not exactly what `evolver export` writes for its members (headers, "
            "padding or trailing data differ): the pack was altered or damaged"
        )
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

    insights = [
        PackInsight(
            number=n,
            text=claim(i.file, r"insights/\d{4}\.txt", f"insight {n}"),
            importance=i.importance,
            provenance=i.provenance.model_dump(exclude_none=True),
        )
        for n, i in enumerate(manifest.insights, start=1)
    ]
    tools, names = [], set()
    for t in manifest.tools:
        if t.name in names:
            raise PackError(f"tool {t.name!r} appears twice")
        names.add(t.name)
        code = claim(t.code, rf"tools/{t.name}/code\.py", f"tool {t.name}")
        tests = claim(t.tests, rf"tools/{t.name}/tests\.py", f"tool {t.name}")
        if code_hash(code, tests) != t.code_hash:
            raise PackError(
                f"tool {t.name!r}: its code_hash {t.code_hash} does not match its code and tests "
                f"({code_hash(code, tests)}): the pack was altered or damaged"
            )
        tools.append(
            PackTool(
                name=t.name,
                version=t.version,
                description=t.description,
                code=code,
                tests=tests,
                code_hash=t.code_hash,
                provenance=t.provenance.model_dump(exclude_none=True),
            )
        )
    node = None
    if manifest.node is not None:
        n = manifest.node
        node = PackNode(
            id=n.id,
            scaffold=claim(n.file, r"node/scaffold\.json", f"node {n.id}"),
            scaffold_hash=n.scaffold_hash,
            rationale=n.rationale,
            provenance=n.provenance.model_dump(exclude_none=True),
        )
    for name in sorted(listed - used):
        raise PackError(f"file {name!r} is listed in the manifest but belongs to no item")
    return Pack(
        sha256=digest, evolver=manifest.evolver, model=manifest.model, insights=insights, tools=tools, node=node
    )
