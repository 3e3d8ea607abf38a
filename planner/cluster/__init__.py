"""The cluster room: where it runs. ``ClusterSpec`` (spec) from shorthands, presets and YAML files (file), with the
link families of each node type (links). A ``local:N`` cluster takes the host's calibration as a value (host room)."""
