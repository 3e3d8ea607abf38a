"""The model room: what is trained. ``ModelSpec`` (spec), read from HF ``config.json`` files (config, hf_config),
with exact parameter and FLOP counts (flops). Imports costmodel and core only."""
