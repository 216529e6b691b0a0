"""Secrets out of everything modtrace stores or prints.

A database URL carries a password (``postgresql://user:PW@host/db``), a
libpq connection string or a URL query ``password=PW``, a command line
``PGPASSWORD=PW`` or ``--api-token=T``; and a program's environment holds
secrets (``PGPASSWORD``) that may show up in any text.  ``mask`` is the one
function every writer of stored metadata, every message and every renderer
runs text through: the secret becomes ``***`` and the rest stays readable.

Over-masking is the safe failure: a value after ``password=`` that was not
a secret is hidden too.  Nothing here imports beyond the standard library,
so every layer (store, recorder, CLI, renderers) can use it.
"""

from __future__ import annotations

import os
import re

MASK = "***"

# scheme://user:PASSWORD@host -- the user part has no ':' '/' '@' (as in
# SQLAlchemy's URL grammar); the password runs to the last '@' before a
# space or quote.
_URL_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s'\"]*:)(?P<secret>[^\s'\"]*)(?=@)")
# key=VALUE where the key names a secret: password=, PGPASSWORD=, --db-password=, api_token=, ...
_KEY_VALUE = re.compile(
    r"(?P<head>(?<![A-Za-z0-9])[A-Za-z0-9_.\-]*(?:password|passwd|pwd|secret|token|apikey|api_key)"
    r"[A-Za-z0-9_\-]*\s*=\s*)(?P<secret>'[^']*'|\"[^\"]*\"|[^\s&;,'\"]+)",
    re.IGNORECASE,
)
# Environment variables whose values are secrets wherever they appear.
_SECRET_ENV = re.compile(r"password|passwd|secret|token|api_?key", re.IGNORECASE)
_MIN_ENV_SECRET = 4  # shorter values would mask ordinary words


def _env_secrets() -> list[str]:
    out = [v for k, v in os.environ.items() if _SECRET_ENV.search(k) and len(v) >= _MIN_ENV_SECRET]
    for name in ("MODTRACE_DB", "MODTRACE_TEST_PG_URL", "DATABASE_URL"):
        m = _URL_USERINFO.search(os.environ.get(name, ""))
        if m and len(m.group("secret")) >= _MIN_ENV_SECRET:
            out.append(m.group("secret"))
    return sorted(set(out), key=len, reverse=True)


def mask(text: str) -> str:
    """``text`` with every password, ``password=``-style value and
    environment secret replaced by ``***``."""
    if not text:
        return text
    text = _URL_USERINFO.sub(lambda m: m.group("head") + MASK, text)
    text = _KEY_VALUE.sub(lambda m: m.group("head") + MASK, text)
    for secret in _env_secrets():
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def mask_value(value: object) -> object:
    """``value`` with ``mask`` applied to every string in it (dicts and lists too)."""
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, dict):
        return {k: mask_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(mask_value(v) for v in value)
    return value
