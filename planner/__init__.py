"""The planner room: models, clusters, layouts and their estimates, the search and the solvers, plans and exporters.
It prices with costmodel and builds on core; it never reads a measured run (verify does) nor imports cli."""
