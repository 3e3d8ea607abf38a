"""meshplan planner: model and cluster specs, memory and step-time models, search, solvers, plans, exporters."""
