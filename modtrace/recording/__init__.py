"""The recording session, in parts: ``Recorder`` (``recording.recorder``,
the public entry, also ``modtrace.Recorder``) over its settings and helpers
(``config``), the batches' way to the store (``flusher``), the schedule of
recorded steps (``schedule``, pure, and ``scheduling``, the recorder acting
on it), the end-of-recording analysis (``analysing``), the process-level
safety nets (``safety``), the disk reserve (``reserve``), and the writer
process: the program's side (``writer_process``), the child
(``writer_child``) and the frames between them (``writer_frames``).

Nothing here is imported by ``import modtrace``; ``schedule`` and
``writer_frames`` import nothing heavy.
"""
