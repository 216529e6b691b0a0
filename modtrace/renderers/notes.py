"""Notes shown beside a run's tables: the one wording of each, for the terminal and the report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def compiled_note(info: Mapping[str, Any]) -> str | None:
    """What a run's compiled modules (``run_details``' ``compiled_modules``) mean for its spans:
    their inner calls were attributed from the compiled kernels (``compiled_attributed``), or
    they were not recorded at all; None for a run with no compiled module hiding calls."""
    names = info.get("compiled_modules")
    if not names:
        return None
    which = ", ".join(names)
    if info.get("compiled_attributed"):
        return (f"{which} ran compiled (torch.compile): the time of the module calls inside is attributed from"
                " the kernels compiled for them (status attributed); `modtrace record --eager` measures them with hooks")
    return (f"{which} ran compiled (torch.compile): the module calls inside are not recorded;"
            " `modtrace record --eager` records them")


# How a run that did not complete ended, by its status as shown (``store.runs.display_status``).
_ENDINGS = {
    "failed": "the run failed",
    "interrupted": "the run was interrupted",
    "running": "the run is still recording",
    "incomplete": "the run is incomplete: its process is gone without finishing it (killed?)",
}


def ended_note(info: Mapping[str, Any]) -> str | None:
    """How a run ended when it did not complete, with its stored error (``run_details``'
    ``status`` and ``error``): what an empty table of it must say; None for a completed run."""
    ending = _ENDINGS.get(str(info.get("status")))
    if ending is None:
        return None
    error = str(info.get("error") or "").strip().splitlines()
    return f"{ending}: {error[0]}" if error else ending
