"""The estimate room: the price of one layout. The operators of a layer (ops_graph), the memory model (memory), the
workload / estimate values and the estimator protocol (base), the GPU and ``local:N`` estimators (gpu, cpu), which
one a cluster gets (select) and the per-stage breakdown (explain). Imports model, cluster, layout, host, costmodel."""
