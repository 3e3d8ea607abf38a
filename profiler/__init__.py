"""meshplan profiler: capture, trace parsing, clock alignment, dataflow graph, replay, what-if, timelines."""
