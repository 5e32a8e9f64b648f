"""A study's resumable results: a JSON-lines file, one row per finished measurement, written
to disk as each ends (flushed and synced), so a study killed half-way runs again from where
it stopped: what the file holds is done, the rest is measured and appended.

    results = ResultsFile(RESULTS / "platform_overhead.jsonl", key=cell_key)
    for cell in cells:
        if not results.done(cell_key(cell)):
            results.append(measure(cell))

A line an interruption cut short is skipped on reading (and the next row starts a new line).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

Row = dict[str, Any]


class ResultsFile:
    """``path``'s rows, read once; ``key`` (a row -> what identifies its measurement, None
    for a row that counts as not done) answers :meth:`done`."""

    def __init__(self, path: Path | str, key: Callable[[Row], Hashable | None] | None = None):
        self.path = Path(path)
        self.key = key
        text = self.path.read_text() if self.path.is_file() else ""
        self.cut_short = bool(text) and not text.endswith("\n")  # interrupted mid-line
        self._rows: list[Row] = []
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                self._rows.append(json.loads(line))
            except json.JSONDecodeError:  # the line an interruption cut short
                continue
        self._keys = {key(r) for r in self._rows} - {None} if key else set()

    def _need_key(self) -> None:
        if self.key is None:
            raise TypeError(f"ResultsFile({str(self.path)!r}) was given no key: done() and "
                            "replace() need one")  # fmt: skip

    def _key(self, row: Row) -> Hashable | None:
        self._need_key()
        return self.key(row)

    def rows(self) -> list[Row]:
        """Every row, as stored (the file's order, appended ones last)."""
        return list(self._rows)

    def done(self, key: Hashable) -> bool:
        """Whether a stored row has ``key``."""
        self._need_key()
        return key in self._keys

    def append(self, row: Row) -> Row:
        """Write ``row`` to disk (flushed and synced) before anything else happens; the row as
        stored (JSON's round trip) is returned and kept in :meth:`rows`."""
        line = json.dumps(row)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            if self.cut_short:  # start a new line after the one cut short
                f.write("\n")
                self.cut_short = False
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        return self._keep(json.loads(line))

    def replace(self, row: Row) -> Row:
        """Drop the stored rows with ``row``'s key (the file rewritten whole, then moved into
        place), then :meth:`append` ``row``."""
        key = self._key(row)
        kept = [r for r in self._rows if self.key(r) != key]
        temporary = self.path.with_name(self.path.name + ".partial")
        temporary.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(temporary, self.path)
        self._rows, self.cut_short = kept, False
        self._keys = {self.key(r) for r in kept} - {None}
        return self.append(row)

    def _keep(self, row: Row) -> Row:
        self._rows.append(row)
        if self.key is not None and (key := self.key(row)) is not None:
            self._keys.add(key)
        return row
