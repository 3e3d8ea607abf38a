"""meshplan: plan, predict and verify distributed training jobs.

The rooms (each a top-level folder of the repository, mapped by pyproject.toml): ``meshplan.core`` (errors,
atomic writes, units, version, host cache), ``meshplan.costmodel`` (pricing one operator or collective),
``meshplan.planner`` (layouts, estimates, plans, exports), ``meshplan.profiler`` (measured runs: capture, traces,
replay), ``meshplan.verify`` (plans judged against runs, learning from runs), ``meshplan.cli`` (the commands).
"""
