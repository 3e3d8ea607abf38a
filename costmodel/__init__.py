"""meshplan cost model: device catalogue, operator specs, learned and roofline latency prediction."""
from meshplan.costmodel.api import predict  # noqa: F401
