"""The core room: what every room may use — errors, atomic writes, the version, units users write, the host cache.
It imports nothing of meshplan."""
