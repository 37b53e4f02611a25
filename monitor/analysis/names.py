"""Kernel names: readable short names from mangled symbols, and which kernels are collectives; NVTX range names."""

from __future__ import annotations

from functools import lru_cache


def demangle_head(name: str) -> str:
    """The qualified name of an Itanium-mangled symbol, templates dropped (`_ZN2at6native6kernelI...` -> at::native::kernel)."""
    if not name.startswith("_Z"):
        return name
    i = 2
    nested = i < len(name) and name[i] == "N"
    if nested:
        i += 1
        while i < len(name) and name[i] in "rVK":  # cv-qualifiers of a nested name
            i += 1
    parts = []
    while i < len(name) and name[i].isdigit():
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        n = int(name[i:j])
        parts.append(name[j:j + n])
        i = j + n
        if not nested:
            break
    if not parts:
        return name
    return "::".join("(anon)" if p.startswith("_GLOBAL__N") else p for p in parts)


@lru_cache(maxsize=8192)  # every window names the same kernels again
def short_kernel_name(name: str, width: int = 48) -> str:
    """A readable kernel name: demangled, templates and argument lists dropped, namespaces trimmed."""
    n = demangle_head(name)
    depth, out = 0, []
    for ch in n:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    n = "".join(out).strip() or name
    n = n.replace("void ", "").split(" ")[-1]
    parts = [p for p in n.split("::") if p and p != "(anon)"]
    n = "::".join(parts[-2:]) if len(parts) > 2 else "::".join(parts) or n
    return n if len(n) <= width else n[: width - 1] + "…"


def is_collective_kernel(name: str) -> bool:
    """Whether a kernel is a collective: NCCL's kernels (all-reduce, all-gather, ...) carry its name."""
    return "nccl" in name.lower()


def range_name(w, i: int) -> str:
    """The name of NVTX range `i` of a window (an index into `w.nvtx_names`), or "nvtx range" if it has none."""
    names = getattr(w, "nvtx_names", None) or []
    return names[i] if 0 <= i < len(names) else "nvtx range"
