"""Keeping credentials out of what gym writes: MLflow params, Prefect parameters, logs and messages.

gym reads keys from the environment only (`api_key_env` names the variable). These helpers say which
setting names hold secrets, find credentials a value carries anyway (`https://user:key@host`,
`?api_key=...`) and strip them before a value is shown or stored.
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import unquote, urlsplit

from pydantic import AfterValidator
from pydantic.json_schema import JsonDict

REDACTED = "***"

# Whole words of a setting's last name part: `hf_token`, `api_key`, `db_password`, but not `max_tokens`,
# `budget_tokens` or a tokenizer's `pad_token`.
_SECRET_WORD = re.compile(
    r"(api[_-]?key|secret|password|passwd|credentials?|authorization|bearer)", re.IGNORECASE
)
_TOKEN = re.compile(r"(^|[_-])token$", re.IGNORECASE)
_TEXT_TOKEN = re.compile(r"(^|[_-])(pad|eos|bos|unk|sep|cls|mask|stop|special|start|end)[_-]token$", re.I)
# A URL in text: not its closing punctuation (`(http://h/?token=x)`: the `)` is the sentence's).
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>.,;:!?)\]}]", re.IGNORECASE)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def secret_name(name: object) -> bool:
    """Whether a setting called `name` (`a.b.c`: its last part counts) holds a secret."""
    last = str(name).rsplit(".", 1)[-1]
    return bool(_SECRET_WORD.search(last)) or (bool(_TOKEN.search(last)) and not _TEXT_TOKEN.search(last))


# A query or fragment parameter that may carry a credential: api_key, access_key, subscription-key, token,
# auth, sig... (an OpenAI-compatible base URL needs none).
_SECRET_PARAM = re.compile(r"(key|token|auth|secret|password|passwd|credential|sig)", re.IGNORECASE)


def _params(text: str) -> list[tuple[str, str]]:
    return [(unquote(k), v) for k, _, v in (p.partition("=") for p in re.split(r"[&;]", text) if p)]


def url_credentials(url: str) -> bool:
    """Whether `url` may carry a credential: any user part (`key@host` or `user:key@host`), a key-like
    query or fragment parameter, or a URL too malformed to tell (never shown, then)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a malformed port, as a client would
    except ValueError:
        return True
    if parts.username is not None or "@" in parts.netloc:
        return True
    params = _params(parts.query) + _params(parts.fragment) + _params(parts.path.partition(";")[2])
    return any(_SECRET_PARAM.search(k) for k, _ in params)


def _any_case(word: str) -> str:
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else re.escape(c) for c in word)


# JSON Schema (ECMA regex, no flags: each letter in either case) for a URI setting without a login: no
# user part (`scheme://user:password@host`) and no key-like query, fragment or `;` parameter
# (`?password=`, `#token=`: _SECRET_PARAM's words). In a deployment's parameter schema, Prefect's server
# refuses a run given one before it stores its parameters. Only the schema carries it (pydantic's regex
# has no look-ahead); gym's own check is tracking.check_store (url_credentials).
_SECRET_PARAM_WORDS = ("key", "token", "auth", "secret", "password", "passwd", "credential", "sig")
# urlsplit drops leading spaces and controls, and tabs and newlines anywhere (`\thttp://u:p@h`,
# `ht\ttp://...`): a value holding a tab or newline is refused outright (no name, path or URL has one), and
# a user part is looked for after any `://`, not only after a scheme at the start (also `mmlu=URL`).
NO_LOGIN_SCHEMA: JsonDict = {
    "pattern": r"^(?![^\t\r\n]*[\t\r\n])(?![\s\S]*://[^/?#]*@)"
    + r"(?![^?#;]*[?#;](?:[^#]*[&;#])?[^=&;#]*(?:"
    + "|".join([*map(_any_case, _SECRET_PARAM_WORDS), "%"])  # `%74oken=`: a name the schema can't decode
    + r")[^=&;#]*=)"
}
# The same for each item of a list setting (benchmarks: `mmlu=https://...`).
NO_LOGIN_ITEMS: JsonDict = {"items": {"type": "string", **NO_LOGIN_SCHEMA}}


# A URL's scheme and `//netloc` (the part a user and password go in), as urlsplit finds them.
_AUTHORITY = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*:)?(?://(?P<netloc>[^/?#]*))?")
# Characters urlsplit drops before it reads a URL: leading C0 controls and spaces; tabs and newlines anywhere.
_IGNORED_LEADING = "".join(map(chr, range(33)))
_IGNORED_ANYWHERE = "\t\r\n"
# One `key=value` parameter of a query, a fragment or a path's `;params`: its value's span is masked.
_PARAM = re.compile(r"(?:^|(?<=[&;]))(?P<key>[^&;=]*)=(?P<value>[^&;]*)")


def strip_url(url: str) -> str:
    """`url` without its credentials: the user part and key-like parameter values become `***` (a URL
    too malformed to split, all of it). Everything else is left as it was written: a URL without
    credentials comes back unchanged (`sqlite:////abs/path.db` keeps its four slashes)."""
    try:
        urlsplit(url)
    except ValueError:
        return REDACTED
    url = url.lstrip(_IGNORED_LEADING)  # what urlsplit (and so a client) ignores, or a user part could hide
    for char in _IGNORED_ANYWHERE:
        url = url.replace(char, "")
    head = _AUTHORITY.match(url)
    assert head is not None  # every group is optional: it matches, if only the empty string
    netloc = head["netloc"]
    if netloc is not None and "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    authority = (head["scheme"] or "") + (f"//{netloc}" if netloc is not None else "")

    def masked(text: str) -> str:
        return _PARAM.sub(
            lambda m: f"{m['key']}={REDACTED}" if _SECRET_PARAM.search(unquote(m["key"])) else m[0], text
        )

    rest, hash_, fragment = url[head.end() :].partition("#")
    rest, question, query = rest.partition("?")
    path, semi, path_params = rest.partition(";")
    return authority + path + semi + masked(path_params) + question + masked(query) + hash_ + masked(fragment)


def link_url(url: str) -> str:
    """`url` for a link someone follows (a Prefect artifact, a run's tag): `strip_url`'s, with no user
    part at all (a browser asks for the login the server wants), so `http://user:key@host/` is
    `http://host/`."""
    stripped = strip_url(url)
    head = _AUTHORITY.match(stripped)
    if head is None or head["netloc"] is None or "@" not in head["netloc"]:
        return stripped
    start, end = head.span("netloc")
    return stripped[:start] + head["netloc"].rpartition("@")[2] + stripped[end:]


def without_credentials(url: str) -> str:
    """`url` as it should be given instead: `link_url`'s, without its key-like query and fragment
    parameters at all (`http://host/?token=***` is `http://host/`)."""
    linked = link_url(url)
    rest, hash_, fragment = linked.partition("#")
    rest, question, query = rest.partition("?")

    def kept(text: str) -> str:
        return "&".join(
            p for p in text.split("&") if p and not _SECRET_PARAM.search(unquote(p.partition("=")[0]))
        )

    query, fragment = kept(query), kept(fragment)
    return rest + (question if query else "") + query + (hash_ if fragment else "") + fragment


def scrub(text: str) -> str:
    """`text` with the credentials of every URL in it replaced by `***` (for messages and logs)."""
    return _URL.sub(lambda m: strip_url(m.group(0)) if url_credentials(m.group(0)) else m.group(0), text)


# An Authorization header's credential, as a server or proxy may quote the request back in an error.
_BEARER = re.compile(r"\b(Bearer)\s+[^\s'\",;)]{8,}", re.IGNORECASE)
MIN_SECRET_CHARS = 8  # shorter values (a placeholder key, "EMPTY") are not searched for in text


def mask(text: str, *values: str | None) -> str:
    """`text` with each of `values` (keys gym sent: a server may quote them back in its error) and any
    `Bearer ...` credential replaced by `***`, and the credentials of its URLs stripped (`scrub`)."""
    for value in values:
        if value and len(value) >= MIN_SECRET_CHARS:
            text = text.replace(value, REDACTED)
    return scrub(_BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text))


def holds_secret(value: object) -> bool:
    """Whether a value shown in a message could show a credential (a URL that may carry one)."""
    return isinstance(value, str) and any(url_credentials(m.group(0)) for m in _URL.finditer(value))


# What keys look like, typed where a variable's name goes: hub, OpenAI-style and GitHub prefixes, or a long
# mix of lower-case letters and digits (variable names are upper case by convention).
_KEY_LIKE = re.compile(r"(hf_|sk[-_]|gsk_|ghp_|github_pat_|xai-|AIza).*|(?=.*[a-z])(?=.*\d)\w{24,}")


def env_name(value: str | None) -> str | None:
    """A setting naming the environment variable that holds a key (pydantic validator): the key itself,
    typed there by mistake, would be stored in Prefect's parameters and shown in messages."""
    if value is not None and (not ENV_NAME.fullmatch(value) or _KEY_LIKE.fullmatch(value)):
        raise ValueError(
            "the name of the environment variable holding the API key (letters, digits and _, e.g. "
            "OPENAI_API_KEY), never the key itself (the value is not shown)"
        )
    return value


EnvName = Annotated[str | None, AfterValidator(env_name)]
