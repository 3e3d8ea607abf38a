"""The verify room: plans judged against measured runs (``meshplan check``) and what runs teach (host terms, op models).
It may import planner and profiler (and what they build on); nothing imports it but the CLI."""
