"""The distribution: what the wheel holds, that an installed modtrace works
without the source tree, that ``modtrace --help`` stays light, that every
command is documented, and that the code passes the linter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "alembic", "sqlalchemy.orm", "polars")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: the build backend comes from the dev extra, so this
    # works offline.
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    (built,) = out.glob("modtrace-*.whl")
    return built


@pytest.fixture(scope="session")
def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def _dist_info(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        (path,) = [n for n in zf.namelist() if n.endswith(f".dist-info/{name}")]
        return zf.read(path).decode()


def test_wheel_ships_every_migration(wheel_names: set[str]) -> None:
    assert {"modtrace/migrations/env.py", "modtrace/migrations/script.py.mako"} <= wheel_names
    revisions = sorted((REPO / "migrations" / "versions").glob("*.py"))
    assert revisions, "no revision scripts in migrations/versions"
    for script in revisions:
        assert f"modtrace/migrations/versions/{script.name}" in wheel_names


def test_wheel_ships_the_query_library(wheel_names: set[str]) -> None:
    queries = [p for p in (REPO / "queries").rglob("*") if p.is_file()]
    assert any(p.name == "README.md" for p in queries)
    for path in queries:
        assert f"modtrace/queries/{path.relative_to(REPO / 'queries').as_posix()}" in wheel_names


def test_wheel_holds_the_package_and_nothing_from_the_repo_around_it(wheel_names: set[str]) -> None:
    assert "modtrace/cli/__init__.py" in wheel_names and "modtrace/store/engine.py" in wheel_names
    tops = {n.split("/")[0] for n in wheel_names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"modtrace"}
    assert not any("__pycache__" in n or n.endswith(".db") for n in wheel_names)


def test_wheel_metadata_declares_dependencies_and_entry_point(wheel: Path) -> None:
    meta = Parser().parsestr(_dist_info(wheel, "METADATA"))
    requires = " ".join(meta.get_all("Requires-Dist") or []).lower()
    for dep in ("torch>=2.4", "sqlalchemy", "alembic", "polars", "click", "rich"):
        assert dep in requires, dep
    assert "postgres" in (meta.get_all("Provides-Extra") or [])
    assert "psycopg" in requires and "extra == 'postgres'" in requires.replace('"', "'")
    entry_points = _dist_info(wheel, "entry_points.txt")
    assert "modtrace = modtrace.cli:main" in entry_points


def _dependency_dir(tmp: Path) -> Path:
    """This environment's site-packages minus modtrace itself, as symlinks."""
    site = Path(sysconfig.get_paths()["purelib"])
    deps = tmp / "deps"
    deps.mkdir()
    for entry in site.iterdir():
        name = entry.name.lower()
        if name.startswith(("modtrace", "_editable_impl_modtrace", "__editable__")) or name.endswith(".pth"):
            continue
        (deps / entry.name).symlink_to(entry)
    return deps


@pytest.fixture(scope="session")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv holding the built wheel; its dependencies come from this
    environment (torch is too big to install again), the source tree is not
    importable from it."""
    tmp = tmp_path_factory.mktemp("installed")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
         "--no-deps", "--no-index", "--disable-pip-version-check", str(wheel)],
        check=True, timeout=300,
    )
    venv_site = Path(subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    (venv_site / "zz_modtrace_test_deps.pth").write_text(f"{_dependency_dir(tmp)}\n")
    yield venv
    shutil.rmtree(venv, ignore_errors=True)


def _in(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MODTRACE_DB", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    return subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_installed_wheel_upgrades_and_lists_without_the_source_tree(installed: Path, tmp_path: Path) -> None:
    work = tmp_path / "elsewhere"
    work.mkdir()
    db = tmp_path / "x.db"
    where = _in(installed, work, "python", "-c",
                "import sys, modtrace.cli, modtrace.store.migrate as m; "
                "print(m.migrations_dir()); print(modtrace.cli.__file__); print('\\n'.join(sys.path))")
    assert where.returncode == 0, where.stderr
    migrations, cli_file, *path = where.stdout.splitlines()
    assert Path(migrations).is_relative_to(installed) and Path(migrations).name == "migrations"
    assert Path(cli_file).is_relative_to(installed)
    assert not any(Path(p).resolve() == REPO for p in path if p)

    upgrade = _in(installed, work, "modtrace", "db", "upgrade", "--db", str(db))
    assert (upgrade.returncode, upgrade.stderr) == (0, ""), upgrade.stderr
    from modtrace.store.schema import HEAD

    assert upgrade.stdout == f"{db}: created at {HEAD}\n"
    listed = _in(installed, work, "modtrace", "runs", "--db", str(db))
    assert (listed.returncode, listed.stdout) == (0, f"no runs in {db}\n")
    version = _in(installed, work, "python", "-m", "modtrace", "--version")
    assert version.returncode == 0 and version.stdout.startswith("modtrace, version ")
    assert list(work.iterdir()) == []


def _imported_modules(*args: str) -> set[str]:
    # Asserts on what is imported, not on time (timed tests are flaky); the
    # import list is what makes --help fast.
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "modtrace", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def _heavy(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == h or n.startswith(h + ".") for h in HEAVY))


def test_help_imports_no_torch_alembic_orm_or_polars() -> None:
    names = _imported_modules("--help")
    assert "modtrace.cli" in names
    assert _heavy(names) == []


def test_subcommand_help_stays_light() -> None:
    import click

    from modtrace.cli import cli

    ctx = click.Context(cli)
    for name in cli.list_commands(ctx):
        names = _imported_modules(name, "--help")
        assert _heavy(names) == [], name


def test_readme_documents_every_command() -> None:
    import click

    from modtrace.cli import cli

    readme = (REPO / "README.md").read_text()
    missing = [n for n in cli.list_commands(click.Context(cli)) if f"modtrace {n}" not in readme]
    assert missing == []


def test_code_passes_ruff() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip("ruff is not installed (it comes with the dev extra)")
    proc = subprocess.run(
        [str(ruff), "check", "--output-format", "concise", "modtrace", "tests", "scripts", "benchmarks", "migrations/env.py"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_record_synopsis_names_every_option() -> None:
    import click

    from modtrace.cli.record import record

    page = (REPO / "docs" / "recording.md").read_text()
    section = page.split("## `modtrace record`", 1)[1]
    synopsis = section.split("```sh", 1)[1].split("```", 1)[0]
    words = set(synopsis.replace("[", " ").replace("]", " ").split())
    options = [p for p in record.get_params(click.Context(record)) if isinstance(p, click.Option) and "--help" not in p.opts]
    missing = [p.opts[0] for p in options if not words & set(p.opts)]
    assert missing == []


def test_sql_page_names_every_library_query() -> None:
    page = (REPO / "docs" / "sql.md").read_text()
    section = page.split("## The query library", 1)[1].split("\n## ", 1)[0]
    names = sorted(p.stem for p in (REPO / "queries").glob("*.sql"))
    assert [n for n in names if f"`{n}`" not in section] == []
