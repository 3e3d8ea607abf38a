"""Exact combinatorial planning with OR-Tools CP-SAT.

Entry points (each returns the plan values plus solver status, objective, best bound and whether a time limit
was hit; bad input and infeasible budgets raise ``MeshplanError`` naming the binding constraint):

- ``planner.solve.precision.solve_hetero_train(model, cluster, global_batch, seq_len, quality_budget=None,
  precisions=None, strategy="auto"|"pipeline"|"qsync")`` -> ``SolveResult`` (``stages``: ``Plan.stages``,
  ``layer_precision``: ``Plan.layer_precision``);
- ``planner.solve.precision.solve_serve(model, cluster, batch, prompt_len, gen_len, quality_budget=None, ...)``
  -> ``SolveResult`` (LLM-PQ: stages, per-layer bit-width, prefill/decode micro-batching);
- ``planner.solve.compression.solve_compression(model, cluster, global_batch, seq_len, error_budget=None,
  net_bytes_per_s=None)`` -> ``CompressionResult`` (``solution.buckets``: ``Plan.compression``);
- ``planner.solve.sensitivity.measure_layer_sensitivity(...)`` / ``measure_compression_error(...)``: measured
  indicators on a tiny torch model (for ``meshplan profile --sensitivity``).

Modules: :mod:`partition` (pipeline partition + precision, one CP-SAT model), :mod:`precision` (QSync model and
the entry points), :mod:`compression` (ByteComp model), :mod:`sensitivity` (indicators), :mod:`problems`
(``ModelSpec`` + ``ClusterSpec`` + cost model -> plain-number problems). Every solver works on a plain dataclass
of numbers so it can be tested alone against brute force (``tests/test_solve_*.py``).
"""
