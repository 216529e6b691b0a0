"""The pieces of the compiled-module detail that need no inductor compile:
dynamo's module paths, the torch version pin and its one-line note, and
placing a graph call's kernels with only what ``DetailTracker`` names."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modtrace.core.codes import KIND_ENTER, KIND_EXIT, PHASE_FORWARD
from modtrace.tracking.compiled import (
    Attributed,
    CompiledDetail,
    GraphSites,
    relative_path,
    torch_supported,
)
from modtrace.tracking.tracker import Tracker


@pytest.mark.parametrize(("source", "path"), [
    ("L['self']", ""),
    ("L['self'].blocks.0.mlp", "blocks.0.mlp"),
    ("L['s'].blocks[0]._modules['mlp']", "blocks.0.mlp"),
    ("L['self']._orig_mod.head", "head"),
    ("L[\"model\"].layers['3'].attn", "layers.3.attn"),
    ("G['global_model'].head", None),
    ("L['self'].blocks(0)", None),
])
def test_module_paths_below_the_compiled_frame(source: str, path: str | None) -> None:
    assert relative_path(source) == path


def test_other_torch_versions_record_compiled_modules_whole(capsys: pytest.CaptureFixture[str]) -> None:
    from torch._inductor.output_code import CompiledFxGraph

    call = CompiledFxGraph.__call__
    assert torch_supported() and not torch_supported("2.14.0") and not torch_supported("2.12.1")
    message = CompiledDetail(Tracker(lambda row: None), lambda: 0).install(version="2.14.0")
    assert message == ("compiled detail needs torch 2.13 (this is torch 2.14.0); "
                       "recording the compiled modules as a whole")
    assert CompiledFxGraph.__call__ is call  # nothing patched

    # The tracker shows the line once a compiled module runs, once, and records on.
    rows: list[tuple[object, ...]] = []
    tracker = Tracker(rows.append)
    tracker.compiled_note = message
    model = torch.compile(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), backend="eager")
    tracker.start()
    try:
        for _ in range(2):
            model(torch.randn(2, 4))
    finally:
        tracker.stop()
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "modtrace:" in line] == [f"modtrace: {message}"]
    assert len(rows) >= 4


def test_uninstall_restores_inductor() -> None:
    import torch._inductor.compile_fx  # noqa: F401  (imported: the detail installs at start, not on import)
    import torch._inductor.config as inductor_config
    from torch._inductor.codecache import FxGraphCache
    from torch._inductor.output_code import CompiledFxGraph

    before = (CompiledFxGraph.__init__, CompiledFxGraph.post_compile, CompiledFxGraph.__call__,
              FxGraphCache.__dict__["_lookup_graph"], inductor_config.trace.provenance_tracking_level)
    tracker = Tracker(lambda row: None, compiled_detail=True)
    tracker.start()
    assert CompiledFxGraph.__call__ is not before[2]
    tracker.stop()
    after = (CompiledFxGraph.__init__, CompiledFxGraph.post_compile, CompiledFxGraph.__call__,
             FxGraphCache.__dict__["_lookup_graph"], inductor_config.trace.provenance_tracking_level)
    assert after == before


class _Host:
    """A ``DetailTracker`` that is no ``Tracker``: modules ``m`` (id 1) and ``m.a``, ``m.a.b``."""

    compiled_note: str | None = None
    emitting = True
    timed_device_type = "cuda"
    device_timer = None

    def __init__(self) -> None:
        self.written: list[tuple[object, ...]] = []

    def device_of(self, dev: torch.device) -> tuple[int, bool]:
        return 0, False

    def fqn(self, module_id: int) -> str:
        return "m"

    def module_id_of(self, fqn: str) -> int | None:
        return {"m.a": 2, "m.a.b": 3}.get(fqn)

    def compiled_root(self, backward: bool, roots: list[tuple[int, bool]] | None
                      ) -> tuple[int, bool, int | None] | None:
        assert not backward and roots is None  # an inference graph: nothing to pair
        return 1, False, None

    def append_attributed(self, root_id: int, rows: list[tuple[int, int, int, int]], t0: int, t1: int,
                          synthetic: bool, task: int | None, device_id: int | None = None,
                          stream: int | None = None) -> Attributed:
        self.written.append((root_id, rows, t0, t1, synthetic, task))
        return Attributed([10, 11], None, [0, 1, 2, 3], None)


def test_a_graph_calls_kernels_become_nested_calls_of_the_modules_they_came_from() -> None:
    host = _Host()
    sites = GraphSites(False, {"k1": [(("a",), PHASE_FORWARD)], "k2": [(("a", "a.b"), PHASE_FORWARD)]}, inference=True)
    CompiledDetail(host, lambda: 0)._emit(sites, [("k1", 10, 20), ("k2", 30, 40)], 5, 50, (None, None))
    assert host.written == [(1, [(10, KIND_ENTER, 2, PHASE_FORWARD), (30, KIND_ENTER, 3, PHASE_FORWARD),
                                 (40, KIND_EXIT, 3, PHASE_FORWARD), (40, KIND_EXIT, 2, PHASE_FORWARD)],
                             5, 50, False, None)]
