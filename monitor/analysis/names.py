"""Kernel names: readable short names from mangled symbols, and which kernels are collectives; NVTX range names."""

from __future__ import annotations

import re
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


NAME_WHOLE = 1 << 16  # a width no name reaches: short_kernel_name cuts nothing


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


# words of a template's arguments that tell no two kernels apart (namespaces, iterators, plumbing)
_PLUMBING = {"at", "native", "c10", "std", "array", "Array", "TensorIteratorBase", "TensorIterator", "detail",
             "gpu_kernel_impl_nocast", "gpu_kernel_impl", "binary_internal", "BinaryFunctor", "OpaqueType", "memory",
             "LoadWithCast", "StoreWithCast", "TrivialOffsetCalculator", "OffsetCalculator", "ReduceOp",
             "func_wrapper_t", "function_traits", "cuda", "vectorized", "unroll"}
_AFFIXES = ("_kernel_cuda", "_kernel_impl", "_kernel", "_cuda", "_impl", "Functor", "Ops")


# a run the scan read as a name that holds a substitution, template parameter or literal: no name at all
_REFERENCE = re.compile(r"[ST]\d*_|L[a-z]\d")


def _shortened(word: str) -> str:
    """One template argument's name in a few characters: `direct_copy_kernel_cuda` -> direct_copy,
    `MulFunctor` -> Mul, `CUDAFunctor_add` -> add."""
    for suffix in _AFFIXES:
        if word.endswith(suffix) and len(word) > len(suffix):
            word = word[: -len(suffix)]
    if word.startswith("CUDAFunctor"):
        word = word[len("CUDAFunctor"):].lstrip("_") or word
    return word


def _literal_or_reference(name: str, i: int) -> int:
    """Where a literal (`Li128E`) or a substitution or template parameter (`S5_`, `T0_`) starting at `i` ends, or `i`
    where none starts there: their digits are no identifier's length."""
    if name[i] == "L" and i + 1 < len(name) and name[i + 1].islower():
        end = name.find("E", i)
        return end + 1 if end > 0 else i
    if name[i] in "ST" and i + 1 < len(name) and (name[i + 1] == "_" or name[i + 1].isdigit()):
        end = name.find("_", i)
        return end + 1 if end > 0 else i
    return i


def template_words(name: str) -> tuple[str, ...]:
    """The readable names inside an Itanium-mangled kernel's template arguments, shortened, in order, each once:
    `_ZN2at6native18elementwise_kernelI...direct_copy_kernel_cuda...BFloat16...` -> ("direct_copy", "BFloat16").
    () for a name that is not mangled."""
    if not name.startswith("_Z"):
        return ()
    head = set(demangle_head(name).split("::"))
    out: list[str] = []
    i = 2
    while i < len(name):
        skip = _literal_or_reference(name, i)
        if skip != i:
            i = skip
            continue
        if not name[i].isdigit():
            i += 1
            continue
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        n, word = int(name[i:j]), name[j:j + int(name[i:j])]
        if n and j + n <= len(name) and (word[0].isalpha() or word.startswith("_GLOBAL__N")) and \
                all(c.isalnum() or c == "_" for c in word):
            i = j + n
            short = _shortened(word)
            readable = n >= 3 and word[0].isalpha() and not _REFERENCE.search(word)
            if readable and word not in head and word not in _PLUMBING and short not in out:
                out.append(short)
        else:
            i += 1
    return tuple(out)


def _settle(tags: list[str], more: list[str]) -> list[str] | None:
    """`tags` where each is said and no other says it, the rest with `more` added (" " between); None where that
    still leaves two alike or one unsaid."""
    seen = [t for t in tags if t]
    out = [t if t and seen.count(t) == 1 else f"{t} {m}".strip() for t, m in zip(tags, more)]
    return out if all(out) and len(set(out)) == len(out) else None


def kernel_tags(names: list[tuple[str, str, int]]) -> list[str]:
    """For kernels given as (full name, short name, grid blocks), in table order: the few characters that tell apart
    two that share a short name (three `native::elementwise_kernel`s): their template arguments shortened (two
    words: one alone can mislead), where those leave two alike or say nothing their grids too, and where those are
    alike too their places in the table; where none of them is mangled, their full names; "" for a kernel whose short
    name is its own."""
    tags = [""] * len(names)
    groups: dict[str, list[int]] = {}
    for k, (_, short, _) in enumerate(names):
        groups.setdefault(short, []).append(k)
    for members in groups.values():
        if len(members) < 2:
            continue
        if not any(names[k][0].startswith("_Z") for k in members):  # names to read, each its own: said whole
            for k in members:
                tags[k] = names[k][0]
            continue
        cand = [",".join(template_words(names[k][0])[:2]) for k in members]
        cand = (_settle(cand, [""] * len(members)) or _settle(cand, [f"grid {names[k][2]}" for k in members])
                or _settle(cand, [f"#{n + 1}" for n in range(len(members))]))
        for k, tag in zip(members, cand):
            tags[k] = tag
    return tags


def tagged(short: str, tag: str, full: str = "") -> str:
    """A kernel's label: its short name, with the tag that tells it from another of that name (the full name
    itself where the tag is that: a name that is not mangled)."""
    return tag if tag and tag == full else f"{short}<{tag}>" if tag else short
