"""Text that a target or a recording supplies (a failure note, a Bye reason, argv, a GPU or kernel name), made
safe to show: on a terminal every control character and escape sequence appears as a visible escape (`\\x1b`,
`\\n`, `\\u202e`), never as a command to the terminal; in Markdown the characters that would make a link, an
image, HTML, emphasis or a new table cell are escaped too. JSON needs neither: `cli._common.print_json` escapes
what its encoder leaves raw.
"""

from __future__ import annotations

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
