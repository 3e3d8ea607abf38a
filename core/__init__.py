"""The core room: what every other room may use and which imports nothing of meshplan.

Errors (:class:`MeshplanError`), atomic writes, the version, units users write (bandwidths, sizes) and the host
cache folder.
"""
