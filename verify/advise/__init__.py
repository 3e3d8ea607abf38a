"""``meshplan advise``: a faster layout for a job that already ran, from its own traces.

One analysis per module: ``evidence`` (what a rank's trace shows: phases, collectives and their groups, GEMM and
attention shapes, kernel dtypes), ``infer`` (the layout the job ran, each part with its confidence), ``shape``
(the model's shape from its GEMMs), ``readable`` (what a trace lacks for advice), ``calibrate`` (op prices fitted
on the run's own kernels), ``attribute`` (each changed decision's share of the gain) and ``job`` (the command as
one library call).
"""
