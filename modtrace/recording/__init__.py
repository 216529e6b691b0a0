"""The recording session, in parts: ``Recorder`` (``recording.recorder``,
the public entry, also ``modtrace.Recorder``) over its configuration and
helpers (``config``), the disk reserve (``reserve``), the batches' way to the
store (``flusher``), the process-level safety nets (``safety``) and the
recording schedule (``schedule``).

Nothing here is imported by ``import modtrace``: this package's modules import
torch (through the tracker) only where they need it.
"""
