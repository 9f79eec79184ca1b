"""The cost model (DESIGN.md §4): the machine (``machine``), tile compute times from profiles or the analytic
model (``compute``), transfers between layers (``transfer``), allreduces (``sync``), and a plan's predicted
iteration (``model``). ``calibrate`` measures a machine under MPI."""
