"""A seccomp filter that keeps sandboxed code from creating user namespaces.

Run unprivileged, bubblewrap forbids nested user namespaces itself
(``--disable-userns``). Run as root it creates no user namespace (see
``bwrap.py``), so that option is not available, and code that ``setpriv`` has
dropped to uid 65534 could still call ``unshare(CLONE_NEWUSER)`` and be "root"
with every capability inside a namespace of its own: the kernel surface most
local privilege escalations go through. This classic-BPF program, handed to
bubblewrap's ``--seccomp``, refuses that:

    unshare / clone with CLONE_NEWUSER   EPERM
    clone3                               ENOSYS (its flags sit behind a pointer; the C
                                         library then falls back to clone, checked above)
    x32 system calls, other ABIs         EPERM (a 32-bit binary would dodge the numbers)
    everything else                      allowed
"""

from __future__ import annotations

import errno
import os
import platform
import struct

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_CLONE_NEWUSER = 0x10000000
_X32_BIT = 0x40000000
# offsets in struct seccomp_data: nr, arch, instruction pointer, args[6] (low half first: little-endian)
_NR, _ARCH, _ARG0_LOW = 0, 4, 16

# machine -> (AUDIT_ARCH, clone, unshare, clone3, has the x32 ABI)
_ARCHES = {
    "x86_64": (0xC000003E, 56, 272, 435, True),
    "aarch64": (0xC00000B7, 220, 97, 435, False),
}

# An instruction: (code, k), or a jump (code, k, if true, if false), each an offset or the name of a block.
_Insn = tuple[int, int] | tuple[int, int, int | str, int | str]


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def no_userns_program(machine: str | None = None) -> bytes | None:
    """The filter for this machine's architecture, or None where its numbers are not known."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, clone, unshare, clone3, x32 = arch
    # Jumps name a block at the end; offsets (instructions to skip) are worked out below.
    body: list[_Insn] = [
        (_LD_W_ABS, _ARCH),
        (_JEQ, audit_arch, 0, "deny"),
        (_LD_W_ABS, _NR),
        *([(_JGE, _X32_BIT, "deny", 0)] if x32 else []),
        (_JEQ, clone3, "enosys", 0),
        (_JEQ, unshare, "flags", 0),
        (_JEQ, clone, "flags", 0),
        (_RET, _ALLOW),
    ]
    tail: dict[str, list[_Insn]] = {
        "flags": [(_LD_W_ABS, _ARG0_LOW), (_JSET, _CLONE_NEWUSER, "deny", 0), (_RET, _ALLOW)],
        "enosys": [(_RET, _ERRNO | errno.ENOSYS)],
        "deny": [(_RET, _ERRNO | errno.EPERM)],
    }
    labels: dict[str, int] = {}
    program = list(body)
    for name, block in tail.items():
        labels[name] = len(program)
        program.extend(block)
    out = []
    for index, (code, k, *jumps) in enumerate(program):
        jt, jf = (labels[j] - index - 1 if isinstance(j, str) else j for j in (jumps or [0, 0]))
        out.append(_op(code, k, jt, jf))
    return b"".join(out)


def program_fd(program: bytes) -> int:
    """A pipe's read end holding ``program``, for bubblewrap's ``--seccomp FD`` (it reads and closes it)."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, program)  # far below a pipe's buffer: never blocks
    finally:
        os.close(write_end)
    return read_end
