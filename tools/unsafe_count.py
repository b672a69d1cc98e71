#!/usr/bin/env python3
"""Counts `unsafe` in the Rust sources, per file, outside comments.

Usage: tools/unsafe_count.py [--edges]   (--edges: only files outside the edges)

The edges are the files allowed to hold unsafe code (docs/architecture.md):
the libuv, libc, CPython and OpenSSL boundaries, the handle allocator and the
native state cell. Everything else should count zero.
"""
import pathlib
import re
import sys

EDGES = {
    "src/uv.rs",
    "src/os.rs",
    "src/capi.rs",
    "src/cell.rs",
    "src/handles/pool.rs",
    "src/handles/context.rs",
    "src/eventloop/fastcall.rs",
    "src/tls/ossl.rs",
}

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORD = re.compile(r"\bunsafe\b")


def code_of(line: str) -> str:
    """The line without its `//` comment (string literals holding `//` are rare enough here)."""
    return line.split("//", 1)[0]


def counts() -> dict[str, int]:
    out = {}
    for path in sorted((ROOT / "src").rglob("*.rs")):
        rel = path.relative_to(ROOT).as_posix()
        out[rel] = sum(len(WORD.findall(code_of(line))) for line in path.read_text().splitlines())
    return out


def main() -> int:
    only_outside = "--edges" in sys.argv[1:]
    table = counts()
    shown = {f: n for f, n in table.items() if n and not (only_outside and f in EDGES)}
    for f, n in sorted(shown.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{n:5d}  {f}{'  (edge)' if f in EDGES else ''}")
    files = [f for f, n in table.items() if n]
    print(f"total {sum(table.values())} in {len(files)} of {len(table)} files; "
          f"{len([f for f in files if f not in EDGES])} files outside the edges")
    return 0


if __name__ == "__main__":
    sys.exit(main())
