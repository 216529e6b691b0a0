"""Runs: create, join, finish, list and resolve references.

A run reference (``RUN`` on the command line) is a run name, a numeric id,
``@`` (the newest run) or ``@~N`` (the Nth run before the newest).
``name:X`` and ``id:N`` say which one is meant; they are needed only when
digits are both a run's name and another run's id (a name of digits can be
given from Python), which a bare reference refuses as ambiguous.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Connection, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from modtrace.core.errors import RunNameTaken, RunNotFound, StoreError, UsageError
from modtrace.core.secrets import mask, mask_value
from modtrace.store.engine import Store
from modtrace.store.schema import run_ranks, runs


def utcnow_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)


_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_AGE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_age(text: str) -> timedelta:
    """``30d``, ``12h``, ``2w``, ``90m``, ``45s`` -> a timedelta; anything else is a UsageError."""
    m = _AGE.match(text)
    if m is None:
        raise UsageError(f"age {text!r}: write a number and a unit, s, m, h, d or w (e.g. 30d, 12h)")
    return timedelta(**{_AGE_UNITS[m.group(2)]: float(m.group(1))})


def parse_tags(pairs: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` texts -> a dict (each a condition a run's tags must meet)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"tag {pair!r}: write KEY=VALUE, e.g. branch=main")
        out[key.strip()] = value
    return out


@dataclass(frozen=True)
class RunFilter:
    """Which runs a listing (or a deletion) takes: each given condition must hold.

    ``tags``: every key with this value (tags are text); ``status``: the status as shown
    (``incomplete`` for a run whose process is gone); ``older_than``: started longer ago."""

    tags: Mapping[str, str] | None = None
    status: str | None = None
    older_than: timedelta | None = None

    @property
    def empty(self) -> bool:
        return not self.tags and self.status is None and self.older_than is None

    def describe(self) -> str:
        parts = [f"tag {k}={v}" for k, v in (self.tags or {}).items()]
        if self.status is not None:
            parts.append(f"status {self.status}")
        if self.older_than is not None:
            parts.append(f"older than {_age_text(self.older_than)}")
        return ", ".join(parts) or "every run"


def _age_text(age: timedelta) -> str:
    seconds = age.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class RunRef:
    id: int
    name: str


def create_run(store: Store, name: str, meta: Mapping[str, Any], *, join: bool = False) -> tuple[int, bool]:
    """Insert a run row; returns (run id, whether this call created it).

    With ``join`` an existing run of that name is reused (ranks of one
    distributed launch share a run); otherwise a taken name is an error.
    """
    # Stored metadata never holds a secret (a --db URL's password in the command line, ...).
    values: dict[str, Any] = {k: mask_value(v) for k, v in meta.items()}
    values["name"] = name
    values.setdefault("status", "running")
    values.setdefault("started_at", utcnow_iso())
    tags = values.get("tags") or {}
    values["tags"] = json.dumps(dict(tags), sort_keys=True)
    for _ in range(3):
        try:
            with store.engine.begin() as conn:
                run_id = conn.execute(insert(runs).values(**values).returning(runs.c.id)).scalar_one()
            return int(run_id), True
        except IntegrityError:
            with store.engine.connect() as conn:
                existing = conn.execute(
                    select(runs.c.id, runs.c.status, runs.c.world_size).where(runs.c.name == name)
                ).first()
            if existing is None:
                continue  # lost a race with a delete; try again
            # Ranks of one launch join the run its first rank created; a
            # finished run, or one of another world size, is someone else's.
            if not join or existing[1] != "running" or existing[2] != values.get("world_size", 1):
                raise RunNameTaken(f"a run named {name!r} already exists in {store.label}; choose another --run name") from None
            return int(existing[0]), False
    raise StoreError(f"could not create run {name!r}")


def add_rank(store: Store, run_id: int, rank: int, wall_anchor_ns: int) -> None:
    with store.engine.begin() as conn:
        try:
            conn.execute(
                insert(run_ranks).values(
                    run_id=run_id,
                    rank=rank,
                    hostname=socket.gethostname(),
                    pid=os.getpid(),
                    status="running",
                    started_at=utcnow_iso(),
                    wall_anchor_ns=wall_anchor_ns,
                )
            )
        except IntegrityError:
            raise UsageError(f"rank {rank} of run {run_id} is already recorded; use a new --run name") from None


def finish_rank(store: Store, run_id: int, rank: int, status: str, error: str | None = None,
                faults: Mapping[str, Any] | None = None) -> None:
    """Mark this rank ended; the run takes the worst status of its ranks once
    all have ended.  ``faults``: run_ranks columns the recorder counted
    (dropped_events, dropped_steps, fork_calls)."""
    now = utcnow_iso()
    with store.engine.begin() as conn:
        # Ranks ending at the same moment must not each miss the other's end
        # (then no one would close the run): on PostgreSQL lock the run row
        # first.  SQLite serialises writers already (and a read before the
        # first write would turn a busy wait into a stale-snapshot error).
        if not store.is_sqlite:
            conn.execute(select(runs.c.id).where(runs.c.id == run_id).with_for_update())
        conn.execute(
            update(run_ranks)
            .where(run_ranks.c.run_id == run_id, run_ranks.c.rank == rank)
            .values(status=status, ended_at=now, **dict(faults or {}))
        )
        statuses = [r[0] for r in conn.execute(select(run_ranks.c.status).where(run_ranks.c.run_id == run_id))]
        world = conn.execute(select(runs.c.world_size).where(runs.c.id == run_id)).scalar() or 1
        values: dict[str, Any] = {}
        if error:
            values["error"] = mask(error)
        if "running" not in statuses and len(statuses) >= world:
            for worst in ("failed", "interrupted", "completed"):
                if worst in statuses:
                    values["status"] = worst
                    break
            values["ended_at"] = now
        elif status in ("failed", "interrupted"):
            values["status"] = status
        # An analysis of this rank stored while it was recording (`modtrace analyze` of a
        # live run) misses what came after and took its open calls for a crash's.
        stale = conn.execute(
            update(run_ranks)
            .where(run_ranks.c.run_id == run_id, run_ranks.c.rank == rank, run_ranks.c.analysis == "stored")
            .values(analysis="stale")
        ).rowcount
        if stale:
            values["analysis"] = _run_analysis(conn, run_id)
        if values:
            conn.execute(update(runs).where(runs.c.id == run_id).values(**values))


# runs.analysis: whether the run's spans and nesting issues are stored (see docs/schema.md).
ANALYSIS_STATES: tuple[str, ...] = ("none", "partial", "stale", "stored")


def _run_analysis(conn: Connection, run_id: int) -> str:
    """The run's analysis state from its ranks': stale when one is, stored when every rank of
    the launch is (world_size of them), partial when some are, else none."""
    states = [r[0] for r in conn.execute(select(run_ranks.c.analysis).where(run_ranks.c.run_id == run_id))]
    world = conn.execute(select(runs.c.world_size).where(runs.c.id == run_id)).scalar() or 1
    if "stale" in states:
        return "stale"
    stored = states.count("stored")
    if stored and stored == len(states) >= world:
        return "stored"
    return "partial" if stored else "none"


def mark_analysis_stored(conn: Connection, run_id: int, rank: int | None) -> None:
    """In the transaction that stores the analysis of run ``run_id`` (``rank``'s only when
    given): that rank's (every rank's) analysis is stored, and the run's state follows.
    PostgreSQL: the run row is locked first, so that ranks analysed at the same time each
    read the others' committed state (finish_rank locks it too)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SELECT 1 FROM runs WHERE id = {int(run_id)} FOR NO KEY UPDATE")
    which = update(run_ranks).where(run_ranks.c.run_id == run_id)
    if rank is not None:
        which = which.where(run_ranks.c.rank == rank)
    conn.execute(which.values(analysis="stored"))
    conn.execute(update(runs).where(runs.c.id == run_id).values(analysis=_run_analysis(conn, run_id)))


_REL = re.compile(r"^@(?:~(\d+))?$")


def resolve_run(store: Store, ref: str) -> RunRef:
    """Turn a RUN reference into a run; unknown names suggest close ones.

    ``@`` / ``@~N`` count back from the newest run; ``id:N`` is the run with
    id N, ``name:X`` the run named X; otherwise a name, or when ``ref`` is all
    digits an id -- and when those digits are both a run's name and another
    run's id, the reference is refused as ambiguous rather than guessed.
    """
    ref = ref.strip()
    with store.engine.connect() as conn:
        m = _REL.match(ref)
        if m:
            back = int(m.group(1) or 0)
            row = conn.execute(select(runs.c.id, runs.c.name).order_by(runs.c.id.desc()).offset(back).limit(1)).first()
            if row is None:
                total = conn.execute(select(func.count()).select_from(runs)).scalar() or 0
                raise RunNotFound(f"{ref} refers to no run: {store.label} has {total} run(s)")
            return RunRef(int(row[0]), row[1])
        if ref.startswith("id:"):
            digits = ref[3:].strip()
            if not digits.isdigit():
                raise RunNotFound(f"run reference {ref!r}: id: takes a number, e.g. id:3")
            row = conn.execute(select(runs.c.id, runs.c.name).where(runs.c.id == int(digits))).first()
            if row is None:
                raise RunNotFound(f"no run with id {int(digits)} in {store.label}")
            return RunRef(int(row[0]), row[1])
        explicit_name = ref.startswith("name:")
        name = ref[5:] if explicit_name else ref
        by_name = conn.execute(select(runs.c.id, runs.c.name).where(runs.c.name == name)).first()
        by_id = None
        if not explicit_name and ref.isdigit():
            by_id = conn.execute(select(runs.c.id, runs.c.name).where(runs.c.id == int(ref))).first()
        if by_name is not None and by_id is not None and by_name[0] != by_id[0]:
            raise UsageError(
                f"run reference {ref!r} is ambiguous: run named {ref!r} (id {by_name[0]}) and run id {by_id[0]} "
                f"(named {by_id[1]!r}); write name:{ref} or id:{ref}"
            )
        row = by_name if by_name is not None else by_id
        if row is not None:
            return RunRef(int(row[0]), row[1])
        names = [r[0] for r in conn.execute(select(runs.c.name))]
    # Only a near miss (a typo) is worth suggesting: at 0.5 any short name shares enough
    # letters with another (nosuch -> sched) to send the reader after a run they never meant.
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.75)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise RunNotFound(f"no run {name!r} in {store.label}{hint}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def display_status(status: str, ranks: list[tuple[str | None, int | None, str]]) -> str:
    """``incomplete`` for a run still marked running whose processes on this host are all gone."""
    if status != "running":
        return status
    host = socket.gethostname()
    live = [st for st in ranks if st[2] == "running"]
    if not live:
        return status
    for hostname, pid, _ in live:
        if hostname != host or pid is None or _pid_alive(pid):
            return status
    return "incomplete"


def list_runs(store: Store, limit: int | None = None, which: RunFilter | None = None) -> list[dict[str, Any]]:
    """Runs newest first with counts aggregated over their ranks; only those ``which`` takes."""
    which = which or RunFilter()
    with store.engine.connect() as conn:
        q = select(runs).order_by(runs.c.id.desc())
        if which.older_than is not None:
            # started_at is ISO 8601 UTC of fixed width: text order is time order.
            cutoff = (datetime.now(timezone.utc) - which.older_than).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            q = q.where(runs.c.started_at < cutoff)
        if limit and which.empty:
            q = q.limit(limit)
        rows = [dict(r._mapping) for r in conn.execute(q)]
        rank_rows = conn.execute(
            select(
                run_ranks.c.run_id, run_ranks.c.rank, run_ranks.c.hostname, run_ranks.c.pid,
                run_ranks.c.status, run_ranks.c.event_count, run_ranks.c.step_count, run_ranks.c.recorded_steps,
            )
        ).all()
    by_run: dict[int, list[Any]] = {}
    for rr in rank_rows:
        by_run.setdefault(int(rr[0]), []).append(rr)
    for row in rows:
        of_run = by_run.get(row["id"], [])
        row["events"] = sum(int(r[5]) for r in of_run)
        row["steps"] = max((int(r[6]) for r in of_run), default=0)
        row["ranks"] = len(of_run)
        recorded = sorted({r[7] for r in of_run if r[7] is not None})
        row["recorded_steps"] = None if not recorded else "; ".join(x or "none" for x in recorded)
        row["status"] = display_status(row["status"], [(r[2], r[3], r[4]) for r in of_run])
        start, end = parse_iso(row["started_at"]), parse_iso(row["ended_at"])
        row["duration_s"] = (end - start).total_seconds() if start and end else None
        row["tags"] = json.loads(row["tags"] or "{}")
    if not which.empty:
        rows = [r for r in rows if _takes(which, r)][:limit]
    return [_masked(row) for row in rows]


def _takes(which: RunFilter, row: Mapping[str, Any]) -> bool:
    tags = row["tags"] if isinstance(row["tags"], dict) else {}
    if which.tags and any(str(tags.get(k)) != v or k not in tags for k, v in which.tags.items()):
        return False
    return which.status is None or row["status"] == which.status


def run_details(store: Store, run_id: int) -> dict[str, Any]:
    """One run's metadata with status and counts (events, steps, ranks, modules, duration)."""
    from modtrace.core.codes import Status
    from modtrace.store.schema import events, modules, step_speeds

    with store.engine.connect() as conn:
        row = conn.execute(select(runs).where(runs.c.id == run_id)).first()
        if row is None:
            raise RunNotFound(f"no run with id {run_id}")
        info = dict(row._mapping)
        rank_rows = conn.execute(
            select(run_ranks.c.rank, run_ranks.c.hostname, run_ranks.c.pid, run_ranks.c.status,
                   run_ranks.c.event_count, run_ranks.c.step_count, run_ranks.c.reconnects,
                   run_ranks.c.dropped_events, run_ranks.c.dropped_steps, run_ranks.c.fork_calls,
                   run_ranks.c.recorded_steps, run_ranks.c.analysis)
            .where(run_ranks.c.run_id == run_id)
            .order_by(run_ranks.c.rank)
        ).all()
        n_modules = conn.execute(
            select(func.count(func.distinct(modules.c.fqn))).where(modules.c.run_id == run_id)
        ).scalar() or 0
        child = modules.alias("child")
        compiled = conn.execute(
            select(modules.c.fqn).distinct()
            .where(modules.c.run_id == run_id, modules.c.compiled == 1)
            .where(select(child.c.module_id).where(
                child.c.run_id == modules.c.run_id, child.c.rank == modules.c.rank,
                child.c.parent_module_id == modules.c.module_id).exists())
            .order_by(modules.c.fqn)
        ).scalars().all()
        # The recorder writes attributed calls in every compiled step, so the first is found early.
        attributed = bool(compiled) and conn.execute(
            select(events.c.seq).where(events.c.run_id == run_id, events.c.status == int(Status.ATTRIBUTED)).limit(1)
        ).first() is not None
        probes = conn.execute(select(step_speeds.c.probe_ns).where(step_speeds.c.run_id == run_id)).scalars().all()
    info["status"] = display_status(info["status"], [(r[1], r[2], r[3]) for r in rank_rows])
    info["tags"] = json.loads(info["tags"] or "{}")
    start, end = parse_iso(info["started_at"]), parse_iso(info["ended_at"])
    info["duration_s"] = (end - start).total_seconds() if start and end else None
    info["events"] = sum(int(r[4]) for r in rank_rows)
    info["steps"] = max((int(r[5]) for r in rank_rows), default=0)
    info["ranks"] = len(rank_rows)
    info["modules"] = int(n_modules)
    # Modules that ran compiled (torch.compile) and have submodules: the calls inside them are not recorded.
    info["compiled_modules"] = list(compiled)
    # Whether the calls inside them were attributed from the compiled kernels (events of status attributed).
    info["compiled_attributed"] = attributed
    # The speed probe (modtrace record --speed-probe): how many were taken, their median.
    info["speed_probes"] = len(probes)
    info["speed_probe_us"] = round(sorted(probes)[len(probes) // 2] / 1000, 3) if probes else None
    # Faults the recording got past, and what it could not record.
    info["reconnects"] = sum(int(r[6]) for r in rank_rows)
    info["dropped_events"] = sum(int(r[7]) for r in rank_rows)
    info["dropped_steps"] = "; ".join(f"rank {r[0]}: {r[8]}" for r in rank_rows if r[8]) or None
    info["fork_calls"] = sum(int(r[9]) for r in rank_rows)
    # Under a schedule (runs.schedule), the steps recorded: one rank's ranges, or each rank's.
    recorded = {r[10] for r in rank_rows if r[10] is not None}
    info["recorded_steps"] = (None if not recorded else (next(iter(recorded)) or "none") if len(recorded) == 1
                              else "; ".join(f"rank {r[0]}: {r[10] or 'none'}" for r in rank_rows))
    # info["analysis"] is runs.analysis: whether the run's spans and issues are stored (by the
    # recorder's writer process when the recording ended, or `modtrace analyze`); until they
    # are, tree, check and report compute them and query refuses to read them.
    info["rank_details"] = [
        {"rank": r[0], "hostname": r[1], "pid": r[2], "status": r[3], "events": r[4], "steps": r[5],
         "reconnects": r[6], "dropped_events": r[7], "dropped_steps": r[8], "fork_calls": r[9],
         "recorded_steps": r[10], "analysis": r[11]}
        for r in rank_rows
    ]
    return _masked(info)


def _masked(row: dict[str, Any]) -> dict[str, Any]:
    """A run row as shown: no secret, even from a database recorded before masking."""
    return {k: mask_value(v) if k in _TEXT_FIELDS else v for k, v in row.items()}


_TEXT_FIELDS = frozenset({"command", "cwd", "error", "tags", "name", "hostname", "git_commit"})


def read_anchors(store: Store, run_id: int) -> dict[int, int]:
    """rank -> wall-clock ns at its ts_ns = 0 (run_ranks.wall_anchor_ns)."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(run_ranks.c.rank, run_ranks.c.wall_anchor_ns).where(run_ranks.c.run_id == run_id)
        ).all()
    return {int(r): int(a) for r, a in rows}


def read_thread_names(store: Store, run_id: int) -> dict[tuple[int, int], str | None]:
    """(rank, thread_id) -> thread name."""
    from modtrace.store.schema import threads

    with store.engine.connect() as conn:
        rows = conn.execute(
            select(threads.c.rank, threads.c.thread_id, threads.c.name).where(threads.c.run_id == run_id)
        ).all()
    return {(int(r), int(t)): n for r, t, n in rows}


def recorded_steps(store: Store, run_id: int, rank: int | None = None) -> str | None:
    """The steps the run (or its ``rank``) recorded under its schedule, as ranges ('' when none);
    None when it has no schedule (every step recorded)."""
    q = select(run_ranks.c.recorded_steps).where(run_ranks.c.run_id == run_id,
                                                 run_ranks.c.recorded_steps.is_not(None))
    if rank is not None:
        q = q.where(run_ranks.c.rank == rank)
    with store.engine.connect() as conn:
        found = [r[0] for r in conn.execute(q)]
    if not found:
        return None
    from modtrace.core.step_ranges import parse_ranges, ranges

    return ranges(set().union(*(parse_ranges(t) for t in found))) or ""


def runs_tagged(store: Store, tags: Mapping[str, str], *, status: str | None = "completed") -> list[RunRef]:
    """Runs whose tags hold every ``tags`` KEY=VALUE (and of ``status``; None: any), newest first.

    Tags are a JSON object in a text column: matched here, not in SQL, so
    SQLite and PostgreSQL agree on what matches.
    """
    q = select(runs.c.id, runs.c.name, runs.c.tags).order_by(runs.c.id.desc())
    if status is not None:
        q = q.where(runs.c.status == status)
    with store.engine.connect() as conn:
        rows = conn.execute(q).all()
    found = []
    for run_id, name, text in rows:
        have = json.loads(text or "{}")
        if all(k in have and str(have[k]) == v for k, v in tags.items()):
            found.append(RunRef(int(run_id), name))
    return found
