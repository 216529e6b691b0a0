"""No credentials in traces: a password given to modtrace (a --db URL, MODTRACE_DB,
a ``password=`` argument, PGPASSWORD) appears nowhere modtrace stores or prints.

Each test records with real secrets through the real CLI (a subprocess, as a
user runs it), then runs every read command and searches their output, every
file they wrote and the database's own bytes (SQLite) or every row's text
(PostgreSQL) for the secrets.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from modtrace.core.secrets import mask

TARGET = textwrap.dedent(
    """
    import sys, torch
    from torch import nn
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
    """
)


def modtrace(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "modtrace", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=180)


def read_everything(db: str, run: str, env: dict[str, str], tmp: Path) -> str:
    """Every read command's output and every file they write, as one text."""
    tmp.mkdir(exist_ok=True)
    out: list[str] = []
    commands = [
        ("runs",), ("runs", "--format", "json"), ("runs", "--format", "csv"),
        ("show", run), ("show", run, "--format", "json"),
        ("tree", run), ("check", run), ("analyze", run),
        ("export", run, "-o", str(tmp / "trace.json")),
        ("export", run, "--format", "csv", "-o", str(tmp / "csv")),
        ("export", run, "--format", "parquet", "-o", str(tmp / "pq")),
        ("report", run, "-o", str(tmp / "report.html")),
        ("query", "SELECT * FROM runs"),
    ]
    for args in commands:
        result = modtrace(*args, "--db", db, env=env, cwd=tmp)
        assert result.returncode == 0, (args, result.stderr)
        out += [result.stdout, result.stderr]
    files = [p for p in tmp.rglob("*") if p.is_file() and p.suffix in (".json", ".csv", ".parquet", ".html")]
    assert {p.name for p in files} >= {"trace.json", "report.html", "spans.csv", "events.parquet"}
    out += [p.read_bytes().decode("latin-1") for p in files]
    return "\n".join(out)


def test_mask_hides_every_kind_of_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSWORD", "envpw1234")
    text = ("modtrace record --db postgresql+psycopg://postgres:s3cr3t@db:5432/x train.py "
            "'host=h password=dsnpw9 user=u' --api-token=tok42 PGPASSWORD=inline77 --echo envpw1234 "
            "sqlite:///plain.db postgresql://host:5432/nopw")
    masked = mask(text)
    for secret in ("s3cr3t", "dsnpw9", "tok42", "inline77", "envpw1234"):
        assert secret not in masked
    assert "postgresql+psycopg://postgres:***@db:5432/x" in masked
    assert "password=*** user=u" in masked and "PGPASSWORD=***" in masked
    assert masked.endswith("sqlite:///plain.db postgresql://host:5432/nopw")  # nothing to hide, nothing hidden
    assert mask("") == "" and mask("no secrets here") == "no secrets here"


def test_sqlite_recording_keeps_secrets_of_its_command_line_out(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TARGET)
    db = tmp_path / "t.db"
    env = {**os.environ, "PGPASSWORD": "pgenv-S3CRET-1", "MODTRACE_DB": str(db)}
    secrets = ["pgenv-S3CRET-1", "urlS3CRET2", "argS3CRET3", "dsnS3CRET4"]
    result = modtrace("record", "--run", "r", "--tag", "by=me", str(script),
                      "--remote", "postgresql://bob:urlS3CRET2@example.org/db", "--password=argS3CRET3",
                      "host=h password=dsnS3CRET4", "--echo", "pgenv-S3CRET-1", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = result.stdout + result.stderr + read_everything(str(db), "r", env, tmp_path)
    for path in tmp_path.glob("t.db*"):
        text += path.read_bytes().decode("latin-1")
    stored = sa.create_engine(f"sqlite:///{db}").connect().exec_driver_sql("SELECT command FROM runs").scalar()
    assert "postgresql://bob:***@example.org/db" in stored and "--password=***" in stored
    for secret in secrets:
        assert secret not in text, secret


@pytest.mark.postgres
def test_postgres_password_in_db_url_and_modtrace_db_is_never_stored_or_printed(pg_url: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TARGET)
    # The server trusts local connections: the password is carried, never needed.
    secret_url = pg_url.replace("postgres@", "postgres:pgURL-S3CRET@", 1)
    secret_env = pg_url.replace("postgres@", "postgres:pgENV-S3CRET@", 1)
    assert "S3CRET" in secret_url and "S3CRET" in secret_env
    env = {**os.environ, "MODTRACE_DB": secret_env}
    first = modtrace("record", "--db", secret_url, "--run", "a", str(script), env=env, cwd=tmp_path)
    second = modtrace("record", "--run", "b", str(script), env=env, cwd=tmp_path)  # MODTRACE_DB
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    text = first.stdout + first.stderr + second.stdout + second.stderr
    text += read_everything(secret_url, "a", env, tmp_path / "a")
    text += read_everything(secret_env, "b", env, tmp_path / "b")
    bad = modtrace("runs", "--db", secret_url.replace("127.0.0.1:5432", "127.0.0.1:1"), env=env, cwd=tmp_path)
    assert bad.returncode == 1 and bad.stderr.startswith("modtrace: error: ") and "***" in bad.stderr
    text += bad.stderr
    engine = sa.create_engine(pg_url)
    with engine.connect() as conn:
        for table in ("runs", "run_ranks", "modules", "threads"):
            text += "\n".join(r[0] for r in conn.exec_driver_sql(f"SELECT t::text FROM {table} t"))
        commands = [r[0] for r in conn.exec_driver_sql("SELECT command FROM runs ORDER BY id")]
    engine.dispose()
    assert "postgres:***@" in commands[0]
    for secret in ("pgURL-S3CRET", "pgENV-S3CRET"):
        assert secret not in text, secret
