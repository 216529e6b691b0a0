"""Where the store and the analysis meet: a run's analysis read when stored,
else computed (``materialize``), and the module call tree kept with it
(``tree``)."""
