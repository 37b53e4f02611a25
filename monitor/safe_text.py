"""Text that a target or a recording supplies (a failure note, a Bye reason, argv, a GPU or kernel name), made
safe to show: on a terminal every control character and escape sequence appears as a visible escape (`\\x1b`,
`\\n`, `\\u202e`), never as a command to the terminal; in Markdown the characters that would make a link, an
image, HTML, emphasis or a new table cell are escaped too. JSON needs neither: `cli._common.print_json` escapes
what its encoder leaves raw. The app escapes each snapshot whole before any panel draws it (`visible_all`), and
the exporter each label value (`exporter.collector._add`).
"""

from __future__ import annotations

import copy
import dataclasses
import re

# C0 and C1 controls (ESC, CSI 0x9b, BEL, CR, BS ...), DEL, the line and paragraph separators, the marks that
# reorder text on screen (bidi overrides and isolates), and lone surrogates (undecodable bytes read leniently)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_MARKDOWN = re.compile(r"([\\`*_\[\]<>|~&#!])")


def _escape(m: re.Match) -> str:
    ch = m.group(0)
    return _NAMED.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")


def visible(text) -> str:
    """`text` as one line whose control characters and escape sequences are shown as escapes."""
    return _UNSAFE.sub(_escape, str(text))


def visible_lines(text) -> str:
    """`text` with each line made visible() and its line breaks (and tabs) kept: a document of our own."""
    return "\n".join(_UNSAFE.sub(lambda m: "\t" if m.group(0) == "\t" else _escape(m), line)
                     for line in str(text).split("\n"))


def markdown(text) -> str:
    """`text` for a Markdown line or table cell: visible(), then every character Markdown would act on escaped."""
    return _MARKDOWN.sub(r"\\\1", visible(text))


def markdown_code(text, cell: bool = False) -> str:
    """`text` as inline code: visible(), fenced by more backticks than it holds; in a table `cell`, its pipes
    escaped (GitHub's tables read `\\|` in code as a pipe)."""
    body = visible(text)
    if cell:
        body = body.replace("|", "\\|")
    fence = "`" * (max((len(r) for r in re.findall("`+", body)), default=0) + 1)
    pad = " " if body.startswith("`") or body.endswith("`") else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def visible_all(obj, _depth: int = 0):
    """`obj` with every string in it made visible(): in dataclasses, msgspec structs, tuples, lists, dicts (keys
    too) and numpy arrays of text, at any depth, so a screen drawn from a snapshot shows what a target supplied (a
    model's, a kernel's or a GPU's name, a reason) as text. The same object where nothing in it needed an escape:
    a panel that redraws only for a new window (by its identity) is not made to redraw by this."""
    if isinstance(obj, str):
        return _UNSAFE.sub(_escape, obj) if _UNSAFE.search(obj) else obj
    if obj is None or isinstance(obj, (bool, int, float, complex, bytes, type)) or _depth > 64:
        return obj
    deeper = _depth + 1
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [visible_all(x, deeper) for x in obj]
        if all(a is b for a, b in zip(items, obj)):
            return obj
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)  # a named tuple: one by one
    if isinstance(obj, dict):
        pairs = [(visible_all(k, deeper), visible_all(v, deeper)) for k, v in obj.items()]
        if all(a is k and b is v for (a, b), (k, v) in zip(pairs, obj.items())):
            return obj
        return dict(pairs)
    if getattr(getattr(obj, "dtype", None), "kind", "") in ("U", "O"):  # numpy text, or objects
        flat = obj.ravel().tolist()
        items = [visible_all(x, deeper) for x in flat]
        if all(a is b for a, b in zip(items, flat)):
            return obj
        import numpy as np

        return np.array(items, dtype=object if obj.dtype.kind == "O" else None).reshape(obj.shape)
    struct = hasattr(type(obj), "__struct_fields__")  # a msgspec struct: the wire's frames and their parts
    if not struct and not dataclasses.is_dataclass(obj):
        return obj
    names = type(obj).__struct_fields__ if struct else [f.name for f in dataclasses.fields(obj)]
    changed = {}
    for name in names:
        value = getattr(obj, name)
        shown = visible_all(value, deeper)
        if shown is not value:
            changed[name] = shown
    if not changed:
        return obj
    if struct:
        import msgspec

        return msgspec.structs.replace(obj, **changed)
    out = copy.copy(obj)
    for name, value in changed.items():
        object.__setattr__(out, name, value)  # a frozen dataclass: set on the copy, before anyone sees it
    return out
