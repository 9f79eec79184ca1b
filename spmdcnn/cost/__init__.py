"""The cost model (docs/architecture.md#the-cost-model-and-the-planner): the machine (``machine``), tile compute
times from profiles or the analytic model (``compute``), transfers between layers (``transfer``), allreduces
(``sync``), and a plan's predicted iteration (``model``). ``calibrate`` measures a machine under MPI."""
