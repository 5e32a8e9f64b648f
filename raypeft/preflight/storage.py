"""Where Ray Tune keeps a search's results and checkpoints (``run.storage_path``): checked
before anything is created, in seconds.

Ray Tune opens the storage path with pyarrow (``pyarrow.fs.FileSystem.from_uri``, Ray 2.60's
``ray.train._internal.storage.get_fs_and_path``), so the check opens it the same way: a
scheme pyarrow has no filesystem for (``ftp://``), or a URI it cannot parse, is refused here,
not by a traceback after the stores were created. The store is then asked about the path
once. An S3 URI is asked with a short connect timeout and no retries, its bucket first: an
endpoint that does not answer (none set, a closed port, no network), credentials it refuses
or a bucket that does not exist are one line within seconds, where Tune's own calls retried
for half a minute. Any other store's answer is awaited :data:`PROBE_TIMEOUT_S` at most
(pyarrow's GCS filesystem retries for minutes). A local folder passes: Tune creates it.
Nothing is written.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from raypeft.config.redact import redact_uri
from raypeft.config.schema import ExperimentConfig
from raypeft.errors import ConfigError
from raypeft.search.trial_runners import STORAGE_PATH_ENV, storage_path

# S3 answers a HEAD request in milliseconds; a store that takes longer to accept a
# connection is not one a search can write its checkpoints to
CONNECT_TIMEOUT_S = 3.0
REQUEST_TIMEOUT_S = 5.0
PROBE_TIMEOUT_S = 15.0  # the longest any one question to the store is awaited
# where the AWS SDKs (and pyarrow's from_uri) find an S3-compatible endpoint; the first set wins
ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


class _Refused(Exception):
    """A question to the store that failed: why, in one line."""


def check_storage_path(cfg: ExperimentConfig) -> None:
    """``run.storage_path`` (else ``$RAYPEFT_STORAGE_PATH``) can be opened, and its store
    answers there; raises a one-line :class:`ConfigError` naming the key."""
    uri = storage_path(cfg)
    if "://" not in uri:
        return  # a local folder (Tune creates it)
    key = "run.storage_path" if cfg.run.storage_path else STORAGE_PATH_ENV
    shown = redact_uri(uri)
    s3 = uri.split("://", 1)[0].lower() == "s3"
    try:
        if s3:
            _check_s3(uri, key, shown)
        else:
            fs, path = _open(uri, key, shown)
            _ask(fs.get_file_info, path)
    except _Refused as exc:
        needs = (
            "with credentials (AWS_ENDPOINT_URL for an S3-compatible store, AWS_ACCESS_KEY_ID "
            "or an instance profile)"
            if s3
            else "with the credentials its filesystem reads"
        )
        raise ConfigError(
            f"{key}: {shown!r}: the store does not answer or cannot be used from here ({exc}); "
            f"it must answer here, {needs}"
        ) from None


def _check_s3(uri: str, key: str, shown: str) -> None:
    """An S3 URI: the endpoint answers, the bucket exists (Tune writes under it but does not
    create buckets), the prefix can be asked about."""
    import pyarrow.fs  # why: pyarrow only for a URI; Ray imports it anyway

    netloc = uri.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0]
    bucket = netloc.rsplit("@", 1)[-1]  # without a user and password
    if not bucket:
        raise ConfigError(f"{key}: {shown!r}: an s3:// URI must name a bucket (s3://bucket/prefix)")
    # asked first with short timeouts: an endpoint that does not answer fails here at once,
    # not after from_uri's lookup of the bucket's region (the SDK's timeouts and retries: ten
    # seconds where no DNS answers). Only a failed connection (the AWS SDK's
    # NETWORK_CONNECTION: refused, no such host, timed out) is judged now: any answer, even a
    # redirect to the bucket's region, means the store is there.
    impatient = _impatient_s3(uri)
    if impatient is not None:
        try:
            _ask(impatient.get_file_info, bucket)
        except _Refused as exc:
            if "NETWORK_CONNECTION" in str(exc):
                raise
    fs, path = _open(uri, key, shown)
    if isinstance(fs, pyarrow.fs.S3FileSystem):
        fs = _impatient_s3(uri, fs.region) or fs
    if _ask(fs.get_file_info, bucket).type == pyarrow.fs.FileType.NotFound:
        raise ConfigError(
            f"{key}: {shown!r}: the bucket {bucket!r} does not exist; create it first (Ray "
            "Tune writes under it but does not create buckets)"
        )
    _ask(fs.get_file_info, path)


def _open(uri: str, key: str, shown: str) -> tuple[Any, str]:
    """``(filesystem, path)`` as Ray Tune opens ``uri``, or the line saying why it cannot."""
    import pyarrow
    import pyarrow.fs  # why: as above

    try:
        return _ask(pyarrow.fs.FileSystem.from_uri, uri, invalid=pyarrow.ArrowInvalid)
    except pyarrow.ArrowInvalid as exc:  # no such filesystem, or not a URI
        first = _first_line(exc)
    scheme = uri.split("://", 1)[0]
    why = (
        f"pyarrow has no filesystem for {scheme!r}"
        if "Unrecognized filesystem type" in first
        else f"pyarrow cannot open it: {first}"
    )
    raise ConfigError(
        f"{key}: {shown!r}: Ray Tune cannot write there, {why}; it must be a local folder or "
        "a URI such as s3://bucket/prefix, gs://, hdfs:// or abfs://"
    )


def _ask(call: Callable[..., Any], *args: Any, invalid: type[Exception] | None = None) -> Any:
    """``call(*args)``, awaited :data:`PROBE_TIMEOUT_S` at most (in a daemon thread: one that
    never returns does not keep the process alive). What it raises becomes
    :class:`_Refused` with its first line, except ``invalid``, raised as it is."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call(*args)
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name="storage-probe", daemon=True)
    thread.start()
    thread.join(PROBE_TIMEOUT_S)
    if thread.is_alive():
        raise _Refused(f"no answer within {PROBE_TIMEOUT_S:g} s")
    error = box.get("error")
    if error is not None:
        if invalid is not None and isinstance(error, invalid):
            raise error
        raise _Refused(_first_line(error))
    return box["value"]


def _first_line(exc: BaseException) -> str:
    text = redact_uri(str(exc).strip().splitlines()[0])[:300] if str(exc).strip() else ""
    # the AWS SDK says how long it waited ("... after 2 ms: Couldn't connect"): the same
    # refusal reads the same every time
    return re.sub(r" after \d+ ms", "", text) or type(exc).__name__


def _impatient_s3(uri: str, region: str | None = None):
    """The S3 filesystem ``from_uri`` opens for ``uri`` (its user and password, its query
    options, the endpoint of :data:`ENDPOINT_ENV`; ``region``: the one from_uri settled on,
    else the URI's or the SDK's own), asking once with short timeouts; None when pyarrow
    does not take these options (the check then asks through from_uri's filesystem)."""
    import pyarrow.fs  # why: as above

    try:
        parts = urlsplit(uri)
        username, password = parts.username, parts.password
    except ValueError:  # not a URL urllib parses: from_uri will say what is wrong
        return None
    options: dict[str, Any] = dict(parse_qsl(parts.query))
    region = region or options.get("region")
    options.pop("region", None)
    endpoint = options.pop("endpoint_override", None) or next(
        (os.environ[name] for name in ENDPOINT_ENV if os.environ.get(name)), None
    )
    for flag in ("allow_bucket_creation", "allow_bucket_deletion"):
        if flag in options:
            options[flag] = options[flag].lower() in ("1", "true")
    if username:
        options["access_key"] = unquote(username)
        options["secret_key"] = unquote(password or "")
    try:
        return pyarrow.fs.S3FileSystem(
            region=region,
            endpoint_override=endpoint,
            connect_timeout=CONNECT_TIMEOUT_S,
            request_timeout=REQUEST_TIMEOUT_S,
            retry_strategy=pyarrow.fs.AwsStandardS3RetryStrategy(max_attempts=1),
            **options,
        )
    except (TypeError, ValueError):  # an option only from_uri knows
        return None
