"""Secrets out of what raypeft logs: passwords and tokens in URLs, values of secret keys.

Everything raypeft writes to MLflow (params, tags, the ``experiment.yaml`` artefact, a
checkpoint's ``config.yaml``) and prints about where its records are goes through these
functions first:

- :func:`redact_uri` hides the secret parts of every URL in a text: the password of a
  ``user:password@`` userinfo (``postgresql://user:***@host/db``), a userinfo without a
  password (``https://***@host``: a token used as the user name), and the values of
  query-string or fragment parameters whose name looks secret (``password``, ``token``,
  ``sig``, ``X-Amz-Signature``, ``X-Amz-Credential``, ``key``, ...). Anything else is left
  exactly as it was: ``sqlite:///x.db``, ``s3://bucket/path``, file paths, Hub ids.
- :func:`redact_params` (flat params) and :func:`redact_config` (nested config) replace the
  value of every key whose name looks secret (``password``, ``secret``, ``token``,
  ``api_key``, ``credentials``, ...) with ``***`` and run :func:`redact_uri` over every other
  string value.

raypeft never reads environment variables into params: the environment's secrets
(``AWS_SECRET_ACCESS_KEY``, ``HF_TOKEN``, ``MLFLOW_TRACKING_PASSWORD``, ...) are used by the
libraries that need them and never logged. Redaction is for display and records only: the
search itself always uses the real URLs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***"

# Words that make a key secret wherever they appear in it (``db_password``, ``hf_token``,
# ``X-Amz-Signature``); ``tokens``/``max_tokens`` are not ``token``.
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "pass",
        "passphrase",
        "secret",
        "secrets",
        "token",
        "credential",
        "credentials",
        "apikey",
        "auth",
        "authorization",
        "bearer",
        "jwt",
        "cookie",
        "signature",
        "sig",
    }
)
# Word pairs that do (``api_key``, ``AWSAccessKeyId``, ``secret_key``, ``private_key``).
_SECRET_PAIRS = frozenset(
    {
        ("api", "key"),
        ("access", "key"),
        ("secret", "key"),
        ("private", "key"),
        ("session", "key"),
        ("account", "key"),
        ("client", "secret"),
    }
)
_CAMEL = re.compile(r"([a-z0-9])([A-Z])|([A-Z])([A-Z][a-z])")
_WORD_SPLIT = re.compile(r"[^a-z0-9]+")

# ``scheme://`` then a userinfo ended by ``@``: a user name (no ``:``, ``/``, ``?``, ``#``),
# then optionally ``:password``. The password may hold anything but ``@`` (SQLAlchemy
# accepts unencoded ``/``, ``?`` and ``#`` in it): better to hide too much than too little.
_USERINFO = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)"
    r"(?P<user>[^:/?#@\s'\"<>]*)"
    r"(?::(?P<password>[^@\s'\"<>]*))?"
    r"@"
)
# ``?name=value``, ``&name=value``, ``;name=value`` and ``#name=value`` (OAuth fragments).
_PARAM = re.compile(r"(?P<lead>[?&;#])(?P<name>[^=&;#?\s'\"<>]+)=(?P<value>[^&;#\s'\"<>]*)")


def _words(name: str) -> list[str]:
    spaced = _CAMEL.sub(lambda m: f"{m[1] or m[3]}_{m[2] or m[4]}", name)
    return [w for w in _WORD_SPLIT.split(spaced.lower()) if w]


def is_secret_key(name: str) -> bool:
    """Whether a key (``search.db_password``, ``X-Amz-Signature``, ``apiKey``) names a secret.

    A dotted key is secret when any of its parts is. A part is secret when one of its words
    is a secret word (``password``, ``token``, ``secret``, ``sig``, ...) or two adjacent words
    are a secret pair (``api key``, ``access key``, ...), or when it is just ``key`` (``?key=``
    is an API key in many URLs).
    """
    for part in str(name).split("."):
        words = _words(part)
        if words == ["key"]:
            return True
        if any(w in _SECRET_WORDS for w in words):
            return True
        if any(pair in _SECRET_PAIRS for pair in zip(words, words[1:], strict=False)):
            return True
    return False


# What the lenient password pattern takes for a password is a port when it is one, followed
# by the path, query or fragment of a URL whose ``@`` is further on (``http://h:80/p?a=b@c``).
_PORT_THEN_PATH = re.compile(r"\d{1,5}[/?#].*")


def _hide_userinfo(match: re.Match) -> str:
    if match["password"] is None:  # ``https://token@host``: the user name is the secret
        return f"{match['scheme']}{REDACTED}@"
    if _PORT_THEN_PATH.fullmatch(match["password"]):
        return match[0]  # ``host:port/...``: no userinfo here
    return f"{match['scheme']}{match['user']}:{REDACTED}@"


def _hide_param(match: re.Match) -> str:
    if match["value"] and is_secret_key(match["name"]):
        return f"{match['lead']}{match['name']}={REDACTED}"
    return match[0]


def redact_uri(uri: str) -> str:
    """``uri`` (or any text holding URLs) with its credentials replaced by ``***``.

    >>> redact_uri("postgresql://user:pass@host:5432/db")
    'postgresql://user:***@host:5432/db'
    >>> redact_uri("https://ghp_abc@github.com/org/repo")
    'https://***@github.com/org/repo'
    >>> redact_uri("https://b.s3.amazonaws.com/k?X-Amz-Credential=AK%2F1&X-Amz-Signature=f0")
    'https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***'
    >>> redact_uri("sqlite:////tmp/mlflow.db")
    'sqlite:////tmp/mlflow.db'
    """
    if not isinstance(uri, str) or not uri:
        return uri
    text = uri
    if "://" in text and "@" in text:
        text = _USERINFO.sub(_hide_userinfo, text)
    if "=" in text:
        text = _PARAM.sub(_hide_param, text)
    return text


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact_uri(value)
    if isinstance(value, Mapping):
        return redact_config(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_redact_value(v) for v in value)
    return value


def _hidden(value: Any) -> Any:
    """A secret key's value: ``***``, unless there is nothing to hide (None, empty)."""
    if value is None or value == "" or value == {} or value == []:
        return value
    return REDACTED


def redact_config(config: Any) -> Any:
    """A copy of a nested config (dicts, lists, scalars) with every secret hidden.

    Values of secret-looking keys become ``***``; every string elsewhere goes through
    :func:`redact_uri`. The input is not modified.
    """
    if not isinstance(config, Mapping):
        return _redact_value(config)
    return {
        key: _hidden(value) if is_secret_key(str(key)) else _redact_value(value)
        for key, value in config.items()
    }


def redact_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of flat (dotted-key) params with every secret hidden, as :func:`redact_config`.

    >>> redact_params({"search.storage": "mysql://u:pw@db/optuna", "hf_token": "hf_x", "lr": 0.1})
    {'search.storage': 'mysql://u:***@db/optuna', 'hf_token': '***', 'lr': 0.1}
    """
    return redact_config(dict(params))
