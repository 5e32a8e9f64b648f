"""Where Ray Tune keeps a search's results and checkpoints (``run.storage_path``): checked
before anything is created, in seconds.

Ray Tune opens the storage path with pyarrow (``pyarrow.fs.FileSystem.from_uri``, Ray 2.60's
``ray.train._internal.storage.get_fs_and_path``), so the check opens it the same way: a
scheme pyarrow has no filesystem for (``ftp://``) is refused here, not by a traceback after
the stores were created. An S3 URI is then asked about its bucket and prefix once, with a
short connect timeout and no retries: a store that does not answer (no endpoint, a closed
port, no credentials) is one line within seconds, where Tune's own calls would retry for
half a minute. A local folder passes: Tune creates it. Nothing is written.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, unquote, urlsplit

from raypeft.config.redact import redact_uri
from raypeft.config.schema import ExperimentConfig
from raypeft.errors import ConfigError
from raypeft.search.trial_runners import STORAGE_PATH_ENV, storage_path

# S3 answers a HEAD request in milliseconds; a store that takes longer to accept a
# connection is not one a search can write its checkpoints to
CONNECT_TIMEOUT_S = 3.0
REQUEST_TIMEOUT_S = 5.0
# where the AWS SDKs (and pyarrow's from_uri) find an S3-compatible endpoint; the first set wins
ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


def check_storage_path(cfg: ExperimentConfig) -> None:
    """``run.storage_path`` (else ``$RAYPEFT_STORAGE_PATH``) can be opened, and an object
    store answers there; raises a one-line :class:`ConfigError` naming the key."""
    uri = storage_path(cfg)
    if "://" not in uri:
        return  # a local folder (Tune creates it)
    key = "run.storage_path" if cfg.run.storage_path else STORAGE_PATH_ENV
    shown = redact_uri(uri)
    import pyarrow.fs  # why: pyarrow only for a URI; Ray imports it anyway

    if urlsplit(uri).scheme.lower() == "s3":
        # asked first with short timeouts: an endpoint that does not answer fails here at
        # once, not after from_uri's lookup of the bucket's region (the SDK's timeouts and
        # retries: ten seconds where no DNS answers)
        _check_connects(_impatient_s3(uri), _bucket(urlsplit(uri).netloc), key, shown)
    fs, path = _open(uri, key, shown)
    if isinstance(fs, pyarrow.fs.S3FileSystem):
        fs = _impatient_s3(uri, fs.region) or fs
        _check_bucket(fs, path, key, shown)
    try:
        fs.get_file_info(path)
    except Exception as exc:  # refused, unknown host, access denied, timed out
        raise _unusable(key, shown, exc) from None


def _open(uri: str, key: str, shown: str):
    """``(filesystem, path)`` as Ray Tune opens ``uri``, or the line saying why it cannot."""
    import pyarrow.fs  # why: as above

    try:
        return pyarrow.fs.FileSystem.from_uri(uri)
    except Exception as exc:  # ArrowInvalid: no such filesystem; OSError: S3's region lookup
        if "Unrecognized filesystem type" not in str(exc):
            raise _unusable(key, shown, exc) from None
    scheme = uri.split("://", 1)[0]
    raise ConfigError(
        f"{key}: {shown!r}: Ray Tune cannot write there, pyarrow has no filesystem for "
        f"{scheme!r}; it must be a local folder or a URI such as s3://bucket/prefix, gs://, "
        "hdfs:// or abfs://"
    )


def _bucket(netloc: str) -> str:
    return netloc.rsplit("@", 1)[-1]  # without a user and password


def _check_connects(fs, bucket: str, key: str, shown: str) -> None:
    """The S3 endpoint accepts a connection. Only a failed connection (the AWS SDK's
    ``NETWORK_CONNECTION``: refused, no such host, timed out) is judged here: any answer,
    even a redirect to the bucket's region, means the store is there."""
    if fs is None:
        return
    try:
        fs.get_file_info(bucket)
    except OSError as exc:
        if "NETWORK_CONNECTION" in str(exc):
            raise _unusable(key, shown, exc) from None


def _check_bucket(fs, path: str, key: str, shown: str) -> None:
    """The bucket exists: Tune creates folders under it, never the bucket itself."""
    import pyarrow.fs  # why: as above

    bucket = path.split("/", 1)[0]
    try:
        info = fs.get_file_info(bucket)
    except Exception as exc:  # the store does not answer, or refuses these credentials
        raise _unusable(key, shown, exc) from None
    if info.type == pyarrow.fs.FileType.NotFound:
        raise ConfigError(
            f"{key}: {shown!r}: the bucket {bucket!r} does not exist; create it first (Ray "
            "Tune writes under it but does not create buckets)"
        )


def _unusable(key: str, shown: str, exc: Exception) -> ConfigError:
    text = redact_uri(str(exc).strip().splitlines()[0])[:300] if str(exc).strip() else ""
    reason = text or type(exc).__name__
    return ConfigError(
        f"{key}: {shown!r}: the object store does not answer or refuses access ({reason}); it "
        "must be reachable from here, with credentials (AWS_ENDPOINT_URL for an S3-compatible "
        "store, AWS_ACCESS_KEY_ID or an instance profile)"
    )


def _impatient_s3(uri: str, region: str | None = None):
    """The S3 filesystem ``from_uri`` opens for ``uri`` (its user and password, its query
    options, the endpoint of :data:`ENDPOINT_ENV`; ``region``: the one from_uri settled on,
    else the URI's or the SDK's own), asking once with short timeouts; None when pyarrow
    does not take these options (the check then asks through from_uri's filesystem)."""
    import pyarrow.fs  # why: as above

    parts = urlsplit(uri)
    options = dict(parse_qsl(parts.query))
    region = region or options.get("region")
    options.pop("region", None)
    endpoint = options.pop("endpoint_override", None) or next(
        (os.environ[name] for name in ENDPOINT_ENV if os.environ.get(name)), None
    )
    for flag in ("allow_bucket_creation", "allow_bucket_deletion"):
        if flag in options:
            options[flag] = options[flag].lower() in ("1", "true")
    if parts.username:
        options["access_key"] = unquote(parts.username)
        options["secret_key"] = unquote(parts.password or "")
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
