"""Where a running interpreter keeps its C API: ELF symbol tables of the files mapped into a process.

A symbol's run-time address is its file offset (through the PT_LOAD segment that holds it) placed in the mapping of
that file which covers the offset, so one rule serves PIE and non-PIE executables and shared libraries alike.
`.dynsym` is read first (an interpreter exports its API there, whether libpython is shared or linked into the
executable); `.symtab` only when the dynamic table lacks a name.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

SHT_SYMTAB, SHT_DYNSYM, PT_LOAD, PF_X = 2, 11, 1, 1
_SYM = struct.Struct("<IBBHQQ")  # st_name, st_info, st_other, st_shndx, st_value, st_size
_SHDR = struct.Struct("<IIQQQQIIQQ")
_PHDR = struct.Struct("<IIQQQQQQ")


class ElfError(ValueError):
    """A file that is not a readable 64-bit little-endian ELF."""


@dataclass(frozen=True)
class Mapping:
    """One line of /proc/PID/maps."""

    start: int
    end: int
    perms: str
    offset: int
    path: str


def read_maps(pid: int) -> list[Mapping]:
    """The process's memory mappings; OSError if /proc/PID/maps cannot be read."""
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(None, 5)
        lo, hi = parts[0].split("-")
        out.append(Mapping(int(lo, 16), int(hi, 16), parts[1], int(parts[2], 16),
                           parts[5].strip() if len(parts) > 5 else ""))
    return out


def _sections(data) -> list[tuple]:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    return [_SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]


def _load_headers(data) -> list[tuple]:
    """The PT_LOAD program headers: (p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align)."""
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    headers = (_PHDR.unpack_from(data, phoff + i * phentsize) for i in range(phnum))
    return [h for h in headers if h[0] == PT_LOAD]


def _loads(data) -> list[tuple[int, int, int]]:
    """(p_vaddr, p_memsz, p_offset) of each PT_LOAD segment."""
    return [(vaddr, memsz, offset) for _t, _f, offset, vaddr, _p, _fs, memsz, _a in _load_headers(data)]


def _lookup(data, secs, kind: int, wanted: set[str]) -> dict[str, int]:
    """Defined symbols among `wanted` in the symbol table of type `kind`: name -> st_value (a virtual address)."""
    found: dict[str, int] = {}
    for _name, sh_type, _fl, _addr, off, size, link, _info, _align, entsize in secs:
        if sh_type != kind or entsize != _SYM.size or link >= len(secs):
            continue
        str_off, str_size = secs[link][4], secs[link][5]
        strtab = bytes(data[str_off:str_off + str_size])
        by_offset = {}
        for name in wanted:
            needle = b"\0" + name.encode() + b"\0"
            i = strtab.find(needle)
            while i >= 0:
                by_offset[i + 1] = name
                i = strtab.find(needle, i + 1)
        if not by_offset:
            continue
        for st_name, _info, _other, shndx, value, _size in _SYM.iter_unpack(data[off:off + size - size % _SYM.size]):
            if shndx != 0 and value and st_name in by_offset:
                found.setdefault(by_offset[st_name], value)
    return found


def file_symbols(path: str, names: list[str]) -> tuple[dict[str, int], list[tuple[int, int, int]]]:
    """({name: file offset} for the names defined in `path`, its PT_LOAD segments). ElfError/OSError if unreadable."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        secs, loads = _sections(data), _loads(data)
        vaddrs = _lookup(data, secs, SHT_DYNSYM, set(names))
        missing = set(names) - set(vaddrs)
        if missing:
            vaddrs.update(_lookup(data, secs, SHT_SYMTAB, missing))
    offsets = {}
    for name, v in vaddrs.items():
        for p_vaddr, p_memsz, p_offset in loads:
            if p_vaddr <= v < p_vaddr + p_memsz:
                offsets[name] = v - p_vaddr + p_offset
                break
    return offsets, loads


def _runtime(maps: list[Mapping], path: str, file_offset: int) -> int | None:
    for m in maps:
        if m.path == path and m.offset <= file_offset < m.offset + (m.end - m.start):
            return m.start + file_offset - m.offset
    return None


def _readable(pid: int, path: str) -> str:
    """The file as the target sees it (its mount namespace), else the path in ours."""
    inside = f"/proc/{pid}/root{path}"
    return inside if os.path.exists(inside) else path


@dataclass(frozen=True)
class Interpreter:
    """A Python interpreter found in a process: the file that exports its API, its version and symbol addresses."""

    path: str
    version: tuple[int, int] | None
    addresses: dict[str, int]


LIBPYTHON = re.compile(r"libpython3\.(\d+)")
PYTHON_EXE = re.compile(r"python3\.(\d+)")


def interpreter_candidates(pid: int, maps: list[Mapping]) -> list[str]:
    """The executable first, then every mapped libpython."""
    exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    libs = sorted({m.path for m in maps if LIBPYTHON.search(os.path.basename(m.path))})
    return [exe] + [p for p in libs if p != exe]


def _addresses(pid: int, maps: list[Mapping], path: str, names: list[str]) -> dict[str, int]:
    """Run-time addresses of those of `names` that `path` defines and the process has mapped."""
    try:
        offsets, _loads = file_symbols(_readable(pid, path), names)
    except (OSError, ElfError, ValueError, struct.error):
        return {}
    addrs = {n: _runtime(maps, path, off) for n, off in offsets.items()}
    return {n: a for n, a in addrs.items() if a is not None}


def symbol_addresses(pid: int, path: str, names: list[str]) -> dict[str, int]:
    """{name: run-time address} for those of `names` that the mapped file `path` defines; OSError if no maps."""
    return _addresses(pid, read_maps(pid), path, names)


def find_interpreter(pid: int, names: list[str]) -> Interpreter | None:
    """The first candidate file that defines every one of `names`, with their run-time addresses; None if none."""
    maps = read_maps(pid)
    for path in interpreter_candidates(pid, maps):
        addrs = _addresses(pid, maps, path, names)
        if set(addrs) != set(names):
            continue
        m = LIBPYTHON.search(os.path.basename(path)) or PYTHON_EXE.search(os.path.basename(path))
        return Interpreter(path, (3, int(m.group(1))) if m else None, addrs)
    return None


def _exec_segment_ends(path: str) -> list[int]:
    """File offsets just past each executable PT_LOAD segment's bytes in the file."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ElfError("not a 64-bit little-endian ELF file")
        return [offset + filesz for _t, flags, offset, _v, _p, filesz, memsz, _a in _load_headers(data)
                if flags & PF_X and filesz and filesz == memsz]


def code_cave(pid: int, maps: list[Mapping], nbytes: int) -> int | None:
    """A 16-byte aligned run-time address of `nbytes` that are mapped executable and never executed: the tail of the
    last page of an executable segment, past its end. Files in the order they are mapped; None if none has room."""
    page = mmap.PAGESIZE
    for path in dict.fromkeys(m.path for m in maps if "x" in m.perms and m.path.startswith("/")):
        try:
            ends = _exec_segment_ends(_readable(pid, path))
        except (OSError, ElfError, ValueError, struct.error):
            continue
        for end in ends:
            for m in maps:  # the executable mapping of this file that holds the segment's last byte
                if m.path == path and "x" in m.perms and m.offset < end <= m.offset + (m.end - m.start):
                    start = (m.start + end - m.offset + 15) & ~15
                    page_end = (start + page - 1) & ~(page - 1) if start % page else start
                    if page_end <= m.end and page_end - start >= nbytes:
                        return start
                    break
    return None
