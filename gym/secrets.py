"""Keeping credentials out of what gym writes: MLflow params, Prefect parameters, logs and messages.

gym reads keys from the environment only (`api_key_env` names the variable). These helpers say which
setting names hold secrets, find credentials a value carries anyway (`https://user:key@host`,
`?api_key=...`) and strip them before a value is shown or stored.
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from pydantic import AfterValidator

REDACTED = "***"

# Whole words of a setting's last name part: `hf_token`, `api_key`, `db_password`, but not `max_tokens`,
# `budget_tokens` or a tokenizer's `pad_token`.
_SECRET_WORD = re.compile(
    r"(api[_-]?key|secret|password|passwd|credentials?|authorization|bearer)", re.IGNORECASE
)
_TOKEN = re.compile(r"(^|[_-])token$", re.IGNORECASE)
_TEXT_TOKEN = re.compile(r"(^|[_-])(pad|eos|bos|unk|sep|cls|mask|stop|special|start|end)[_-]token$", re.I)
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>]+", re.IGNORECASE)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def secret_name(name: object) -> bool:
    """Whether a setting called `name` (`a.b.c`: its last part counts) holds a secret."""
    last = str(name).rsplit(".", 1)[-1]
    return bool(_SECRET_WORD.search(last)) or (bool(_TOKEN.search(last)) and not _TEXT_TOKEN.search(last))


def url_credentials(url: str) -> bool:
    """Whether `url` carries a credential: a user:password part, or a key-like query parameter."""
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return False
    return parts.password is not None or any(secret_name(k) or k.lower() == "key" for k, _ in query)


def strip_url(url: str) -> str:
    """`url` without its credentials: the password and key-like query values become `***`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username}:{REDACTED}@{netloc.rpartition('@')[2]}"
    query = "&".join(
        f"{k}={REDACTED}" if secret_name(k) or k.lower() == "key" else f"{k}={v}"
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def scrub(text: str) -> str:
    """`text` with the credentials of every URL in it replaced by `***` (for messages and logs)."""
    return _URL.sub(lambda m: strip_url(m.group(0)) if url_credentials(m.group(0)) else m.group(0), text)


def holds_secret(value: object) -> bool:
    """Whether a value shown in a message would show a credential (a URL carrying one)."""
    return isinstance(value, str) and scrub(value) != value


def env_name(value: str | None) -> str | None:
    """A setting naming the environment variable that holds a key (pydantic validator): the key itself,
    typed there by mistake, would be stored in Prefect's parameters and shown in messages."""
    if value is not None and not ENV_NAME.fullmatch(value):
        raise ValueError(
            "the name of the environment variable holding the API key (letters, digits and _, e.g. "
            "OPENAI_API_KEY), never the key itself (the value is not shown)"
        )
    return value


EnvName = Annotated[str | None, AfterValidator(env_name)]
