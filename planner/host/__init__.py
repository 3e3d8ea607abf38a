"""The host-measurement room: this machine measured for ``local:N`` plans. Calibration (calibrate: CPU FLOP/s, memory
bandwidth, gloo links; measure: the timing runs; gloo_in_step: collectives inside a step), per-op timings
(cpu_bench) and the host terms learned from runs (terms). Sits below estimate; imports costmodel and core only."""
