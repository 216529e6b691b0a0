"""``modtrace query``: run a library query, a .sql file or a statement, read-only."""

from __future__ import annotations

import click

from modtrace.cli._options import db_option, format_option, stdout_terminal


def _parse_params(pairs: tuple[str, ...]) -> dict[str, str]:
    from modtrace.core.errors import UsageError

    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().lstrip(":")
        if not sep or not key:
            raise UsageError(f"--param wants KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


@click.command()
@click.argument("query", metavar="NAME|PATH|SQL", required=False)
@db_option
@click.option("--run", "run", metavar="RUN", default=None,
              help="Run for the query's :run_id (a name, id, @ or @~N).")
@click.option("--param", "-p", "params", metavar="KEY=VALUE", multiple=True,
              help="Bind :KEY to VALUE (repeatable). Parameters named run_id or ending in _run take a run reference.")
@click.option("--list", "list_", is_flag=True, help="List the query library with each query's purpose.")
@format_option("table", "json", "csv")
def query(query: str | None, db: str | None, run: str | None, params: tuple[str, ...], list_: bool, fmt: str) -> None:
    """Run a read-only SQL query over the database.

    NAME is a query of the library (see --list), PATH a .sql file, SQL the text
    of one SELECT/WITH statement. Parameters (:name in the SQL) are bound by the
    driver, never pasted into the text: --run RUN gives :run_id, --param KEY=VALUE
    any other; a query file's header may give defaults. Statements that write
    are refused, and the connection itself cannot write.
    """
    import modtrace.api
    from modtrace.core.errors import UsageError
    from modtrace.renderers import Table, get_renderer

    if list_:
        if query is not None:
            raise UsageError("--list takes no query")
        rows = [
            [item.name, item.purpose, " ".join(f":{p}" for p in item.param_names)]
            for item in modtrace.api.query_library()
        ]
        click.echo(get_renderer("rows", fmt, terminal=stdout_terminal()).render(
            Table(["name", "purpose", "parameters"], rows)), nl=False)
        return
    if query is None:
        raise UsageError("give a query: a NAME from `modtrace query --list`, a .sql PATH or an SQL statement")
    chosen = modtrace.api.resolve_query(query)
    given = _parse_params(params)
    if run is not None:
        if "run_id" not in chosen.param_names:
            raise UsageError(f"query {chosen.name} has no :run_id parameter, so --run does not apply")
        if "run_id" in given:
            raise UsageError("give the run once: --run RUN or --param run_id=RUN")
        given["run_id"] = run
    result = modtrace.api.query(db, chosen, given)
    click.echo(get_renderer("rows", fmt, terminal=stdout_terminal()).render(Table(result.columns, result.rows)), nl=False)
    for note in result.notes:
        click.echo(f"modtrace: note: no rows: {note}", err=True)
