"""What a store's URL says: a database server or a local sqlite file (and which file), and
PostgreSQL's driver (:func:`database_url`: ``postgresql://`` is read as
``postgresql+psycopg://``, psycopg 3 being a dependency of raypeft)."""

from __future__ import annotations

from pathlib import Path

# Database schemes SQLAlchemy (MLflow's and Optuna's database stores) can open.
SQL_SCHEMES = {"sqlite", "postgresql", "mysql", "mssql", "oracle"}


def database_url(url: str) -> str:
    """``url`` with PostgreSQL's driver named: ``postgresql://`` is read as
    ``postgresql+psycopg://``. raypeft installs psycopg 3 (SQLAlchemy 2.1's default driver
    too), while SQLAlchemy 2.0 would look for psycopg2; ``postgresql+psycopg2://`` still
    picks psycopg2 where it is installed. Any other URL is returned as it is."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() == "postgresql":
        return f"postgresql+psycopg://{rest}"
    return url


def database_scheme(url: str) -> str:
    """A URL's scheme without its driver: ``postgresql+psycopg://...`` -> ``postgresql``."""
    return url.split(":", 1)[0].split("+", 1)[0].lower()


def database_server(url: str) -> bool:
    """A URL of a database server (PostgreSQL, MySQL, ...), not a local sqlite file."""
    return "://" in url and database_scheme(url) in SQL_SCHEMES - {"sqlite"}


def sqlite_file(url: str, absolute: bool = True) -> Path | None:
    """The path of a local sqlite database URL's file (absolute, or as the URL writes it);
    None for anything else."""
    scheme, sep, rest = url.partition(":///")
    if not sep or scheme.split("+", 1)[0].lower() != "sqlite":
        return None
    db = rest.split("?", 1)[0]
    if not db or db == ":memory:":
        return None
    return Path(db).expanduser().resolve() if absolute else Path(db)
