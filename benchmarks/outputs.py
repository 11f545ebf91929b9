"""Where a benchmark's results go: its JSON and, beside it, the markdown table the README quotes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json_and_table(json_out: Path | None, doc: dict[str, Any], table: str) -> None:
    """Write ``doc`` to ``json_out`` and ``table`` to the same name with ``.md`` (nothing when
    ``json_out`` is None), making the folder if need be."""
    if json_out is None:
        return
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(doc, indent=2) + "\n")
    json_out.with_suffix(".md").write_text(table)
