"""The hooks that see module calls: global module hooks and per-thread call
stacks (``tracker``, ``calls``), backward through autograd node hooks
(``backward``), checkpoint recompute (``recompute``), module names, devices and
device timing, and the ``ModuleTracker`` drop-in.  They append tuples; nothing
here writes or analyses."""
