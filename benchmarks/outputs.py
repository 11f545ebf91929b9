"""Where a benchmark's results go: its JSON and, beside it, the markdown table the README quotes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_and_table(json_out: Path | None, doc: dict[str, Any], table: str, table_out: Path | None = None) -> None:
    """Write ``doc`` to ``json_out`` and ``table`` to ``table_out`` (default: the same name with
    ``.md``), each whole (:func:`write_whole`); nothing when ``json_out`` is None. Makes the
    folder if need be."""
    if json_out is None:
        return
    json_out.parent.mkdir(parents=True, exist_ok=True)
    write_whole(json_out, json.dumps(doc, indent=2) + "\n")
    write_whole(table_out or json_out.with_suffix(".md"), table)


def publish(json_out: Path | None, doc: dict[str, Any], table: str) -> None:
    """Print a benchmark's markdown ``table`` and write it with ``doc`` (:func:`write_json_and_table`):
    how a benchmark ends, the table on the terminal and both files beside each other."""
    print(table)
    write_json_and_table(json_out, doc, table)


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it: a run killed mid-write
    (a device lent by the minute, a Ctrl-C) leaves the last whole file, never half of one."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
