"""The estimator a cluster calls for: ``estimator_for(cluster, pricer, terms)``.

Accelerators get the analytic GPU estimator priced by ``pricer``; ``local:N`` CPU ranks (a cluster built with this
host's calibration, ``planner.cluster.spec.load_cluster(..., calibration=...)``) get the measured CPU estimator with the
learned host ``terms``. Both implement ``planner.estimate.base.Estimator``.
"""
from __future__ import annotations

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.api import Pricer
from meshplan.planner.estimate.base import Estimator
from meshplan.planner.estimate.cpu import CpuEstimator
from meshplan.planner.estimate.gpu import GpuEstimator
from meshplan.planner.host.terms import NEUTRAL_TERMS, HostTerms


def estimator_for(cluster, pricer: Pricer | None = None, terms: HostTerms = NEUTRAL_TERMS) -> Estimator:
    """The estimator of ``cluster`` (a ``planner.cluster.spec.ClusterSpec``).

    Args:
        cluster: The cluster; CPU ranks need the host calibration it was built with.
        pricer: What prices operators on accelerators (``None``: ``Pricer.shipped()``); its name is recorded in
            plans of either kind.
        terms: The learned host terms of the CPU estimator (``NEUTRAL_TERMS``: unfitted).

    Raises:
        MeshplanError: CPU ranks without a host calibration.
    """
    pricer = pricer if pricer is not None else Pricer.shipped()
    if all(g.device.vendor == "cpu" for g in cluster.groups):
        if cluster.calibration is None:
            raise MeshplanError(f"cluster {cluster.spec}: CPU ranks are priced from this host's calibration; build "
                                "the cluster with it (load_cluster(spec, calibration=calibration_for(spec)))")
        return CpuEstimator(cluster.calibration, terms, pricer)
    return GpuEstimator(pricer)
