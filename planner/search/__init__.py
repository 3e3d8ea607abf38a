"""The search room: which layout to run. The exact pruned search over the layout space (exact), the CP-SAT solvers
(solve), the one planning entry point the CLI calls (job) and the reviewed reference plans (reference). Nothing
imports it but cli and verify."""
