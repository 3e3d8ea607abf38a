"""The verify room: plans judged against measured runs (``meshplan check``) and what runs teach the planner.

It may import planner and profiler; nothing imports it but the CLI.
"""
