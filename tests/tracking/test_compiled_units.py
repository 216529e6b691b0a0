"""The pieces of the compiled-module detail that need no inductor compile:
dynamo's module paths, the torch version pin and its one-line note."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modtrace.tracking.compiled import CompiledDetail, relative_path, torch_supported
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
