"""The compiled module's file: its name, the seal its build puts on it, and
whether it is whole enough to load. Imports nothing from the package, nor
torch, so that build_ffi.py and setup.py can load it by path before the
package is importable.

The seal is the SHA-256 of the module, appended to it by its build (make's
and pip's alike): a loader maps a shared object by its program headers and
never reads past them, so the module loads as it would without it, and the
digest goes wherever the file goes (a wheel, site-packages, a copy) and is
replaced with it in one rename. A module whose contents are not those it
was sealed with (garbage written over its code, say) is refused before it
is loaded, which could kill the process (SIGSEGV, SIGILL, SIGBUS).
"""

import hashlib
import importlib.machinery
import os
import struct

STEM = "_lltm_ffi"

# By ELF class (32- or 64-bit): where the header's fields from e_phoff to
# e_shnum start and their format, where p_offset starts in a program header
# and the format from there to p_filesz, and the smallest program header.
_LAYOUTS = {1: (28, "IIIHHHHH", 4, "IIII", 32),
            2: (32, "QQIHHHHH", 8, "QQQQ", 56)}
_ET_DYN = 3
# The seal: this marker, then the SHA-256 (hex) of every byte before it.
_SEAL_MARKER = b"\nlltm_ffi module sha256 "
SEAL_SIZE = len(_SEAL_MARKER) + 64
_CHUNK = 1 << 20


def installed_name():
    """The file name a build writes: _lltm_ffi plus this Python's first
    extension suffix (.cpython-311-x86_64-linux-gnu.so, say)."""
    return STEM + importlib.machinery.EXTENSION_SUFFIXES[0]


def find(package):
    """The file `from . import _lltm_ffi` would load from `package`, or None."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if (package / (STEM + suffix)).is_file():
            return package / (STEM + suffix)
    return None


def sealed(data):
    """The bytes of a freshly linked module, `data`, with its seal appended."""
    return data + _SEAL_MARKER + hashlib.sha256(data).hexdigest().encode()


def elf_damage(path):
    """Why the shared object at `path` cannot be loaded safely by its
    headers, or None: damage() without the seal."""
    return _checked(path, seal=False)


def damage(path):
    """Why the module at `path` must not be loaded, or None: its ELF headers
    (_elf_damage), then its seal: the SHA-256 of its contents must be the one
    its build appended. Reads and hashes the whole file (docs/BUILDING.md
    says how long that takes)."""
    return _checked(path, seal=True)


def _checked(path, seal):
    try:
        with open(path, "rb") as file:
            # The size of the file opened, not of whatever the name points
            # to by now: a build may rename a new module into place meanwhile.
            size = os.fstat(file.fileno()).st_size
            return _elf_damage(file, size) or (_seal_damage(file, size) if seal else None)
    except OSError as error:
        return f"it cannot be read ({error.strerror or error})"


def _elf_damage(file, size):
    """Why the shared object open as `file`, of `size` bytes, cannot be
    loaded safely, or None.

    A file cut short (an interrupted copy, a full disk) would be mapped anyway
    and kill the process with SIGBUS at first touch; its ELF headers say how
    long it must be, so compare before loading. Checks the headers only: a
    whole file whose contents were overwritten in place is the seal's."""
    header = file.read(64)
    if (len(header) < 52 or header[:4] != b"\x7fELF" or header[4] not in _LAYOUTS
            or header[5] not in (1, 2)):
        return "it is not an ELF file"
    order = "<" if header[5] == 1 else ">"
    start, fields, entry_start, entry_fields, entry_size = _LAYOUTS[header[4]]
    if len(header) < start + struct.calcsize(order + fields):
        return f"it is truncated ({size} bytes, less than an ELF header)"
    if struct.unpack_from(order + "H", header, 16)[0] != _ET_DYN:
        return "it is not an ELF shared object"
    (program_offset, section_offset, _, _, program_size, program_count, section_size,
     section_count) = struct.unpack_from(order + fields, header, start)
    if program_count == 0 or program_size < entry_size:
        return "its ELF header describes no usable program headers"
    ends = [program_offset + program_size * program_count,
            section_offset + section_size * section_count]
    if ends[0] <= size:
        file.seek(program_offset)
        table = file.read(program_size * program_count)
        for index in range(program_count):
            # p_offset and p_filesz: where each segment lies in the file.
            offset, _, _, file_size = struct.unpack_from(
                order + entry_fields, table, index * program_size + entry_start)
            ends.append(offset + file_size)
    if max(ends) > size:
        return f"it is truncated ({size} bytes; its headers describe {max(ends)})"
    return None


def _seal_damage(file, size):
    """Why the contents of the module open as `file` are not those its
    build sealed, or None."""
    file.seek(max(0, size - 2 * SEAL_SIZE))
    tail = file.read()
    seal = tail[-SEAL_SIZE:]
    if not seal.startswith(_SEAL_MARKER):
        if _SEAL_MARKER in tail:
            return ("it is truncated or appended to: its last bytes, its digest, are cut short "
                    "or followed by others")
        return ("it carries no digest of its contents (a build's last bytes; an older build, "
                "or a tool that rewrote the file, such as strip, leaves none)")
    digest = hashlib.sha256()
    file.seek(0)
    left = size - SEAL_SIZE
    while left:
        chunk = file.read(min(_CHUNK, left))
        if not chunk:
            return f"it is truncated (it ended while being read, {size - SEAL_SIZE - left} bytes in)"
        digest.update(chunk)
        left -= len(chunk)
    if digest.hexdigest().encode() != seal[len(_SEAL_MARKER):]:
        return "it is not the file its build wrote (its SHA-256 differs from the one it carries)"
    return None
