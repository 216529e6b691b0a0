"""The recording session, in parts: ``Recorder`` (``recording.recorder``,
the public entry, also ``modtrace.Recorder``) over its settings and helpers
(``config``), the batches' way to the store (``flusher``), the schedule of
recorded steps (``schedule``, pure, and ``step_boundary``, the recorder acting
on it at each step boundary), the end-of-recording analysis (``analysing``), the process-level
safety nets (``safety``), the disk reserve (``reserve``), and the writer
process: the program's side (``writer_process``), the child
(``writer_child``) and the messages between them (``writer_messages``);
the script runner of ``modtrace record`` (``script_runner``), its live
status line (``status_line``), run names (``run_names``) and forked
children (``forking``).

Nothing here is imported by ``import modtrace``; ``schedule`` and
``writer_messages`` import nothing heavy.
"""
