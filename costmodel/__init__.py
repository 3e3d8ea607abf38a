"""meshplan cost model: device catalogue, operator specs, learned and roofline latency prediction."""
from costmodel.api import predict  # noqa: F401
