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
