"""The compiled module's file: its name, and whether it is whole enough to
load. Imports nothing from the package, nor torch, so that build_ffi.py can
load it by path before the package is importable.
"""

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


def elf_damage(path):
    """Why the shared object at `path` cannot be loaded safely, or None.

    A file cut short (an interrupted copy, a full disk) would be mapped anyway
    and kill the process with SIGBUS at first touch; its ELF headers say how
    long it must be, so compare before loading. Checks the headers only: a
    whole file whose contents were overwritten in place is not detected."""
    try:
        with open(path, "rb") as file:
            # The size of the file opened, not of whatever the name points
            # to by now: a build may rename a new module into place meanwhile.
            size = os.fstat(file.fileno()).st_size
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
    except OSError as error:
        return f"it cannot be read ({error.strerror or error})"
    if max(ends) > size:
        return f"it is truncated ({size} bytes; its headers describe {max(ends)})"
    return None
