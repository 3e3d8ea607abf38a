"""Exact combinatorial planning with OR-Tools CP-SAT.

Entry points (each returns the plan values plus solver status, objective, best bound and whether a time limit
was hit; bad input and infeasible budgets raise ``MeshplanError`` naming the binding constraint):

- ``planner.search.solve.precision.solve_hetero_train(model, cluster, global_batch, seq_len, quality_budget=None,
  precisions=None, strategy="auto"|"pipeline"|"qsync")`` -> ``SolveResult`` (``stages``: ``Plan.stages``,
  ``layer_precision``: ``Plan.layer_precision``);
- ``planner.search.solve.precision.solve_serve(model, cluster, batch, prompt_len, gen_len, quality_budget=None, ...)``
  -> ``SolveResult`` (LLM-PQ: stages, per-layer bit-width, prefill/decode micro-batching);
- ``planner.search.solve.compression.solve_compression(model, cluster, global_batch, seq_len, error_budget=None,
  net_bytes_per_s=None)`` -> ``CompressionResult`` (``solution.buckets``: ``Plan.compression``);
- ``planner.search.solve.sensitivity.measure_layer_sensitivity(...)`` / ``measure_compression_error(...)``: measured
  indicators on a tiny torch model (for ``meshplan profile --sensitivity``).

Every entry point takes the ``estimator`` that prices operators (``planner.estimate.base.Estimator``; default: the GPU
estimator with the shipped cost model), the same one the layout search uses.

Modules: :mod:`partition` (pipeline partition + precision: the solve), :mod:`partition_data` (its plain numbers
and ``evaluate``), :mod:`partition_model` (its CP-SAT model), :mod:`precision` (the entry points), :mod:`qsync`
(QSync model), :mod:`compression` (ByteComp model) with :mod:`compression_types` and :mod:`compression_problem`,
:mod:`sensitivity` (indicators), :mod:`columns` (precisions, bytes, indicators per layer), :mod:`pricing`
(operator prices of one problem build), :mod:`problems` (``ModelSpec`` + ``ClusterSpec`` + estimator ->
plain-number partition problems). Every solver works on a plain dataclass of numbers so it can be tested alone
against brute force (``tests/test_solve_*.py``).
"""
