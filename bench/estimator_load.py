"""Fixed cost of the cost model in a fresh process: import, ``load_cluster`` and ``estimator_for`` (which loads the
shipped learned model), each timed, median of ``--repeat`` processes (BENCHMARKS.md, "The cost model without xgboost
at prediction").

    python bench/estimator_load.py [--repeat 5] [--numpy-first] [--cluster 16x8xH100]

``--numpy-first`` imports numpy before the clock starts (the planner imports none; the cost model brings it), so
the estimator column is the model's own load. Prints whether xgboost ended up imported. Run it from another checkout
to compare (it puts its own checkout first on ``sys.path``).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(cluster: str, numpy_first: bool) -> dict:
    """Time the three steps in this process."""
    sys.path.insert(0, str(ROOT))
    if numpy_first:
        import numpy  # noqa: F401
    t0 = time.perf_counter()
    from meshplan.planner.cluster.spec import load_cluster
    from meshplan.planner.estimate.select import estimator_for

    t1 = time.perf_counter()
    c = load_cluster(cluster)
    t2 = time.perf_counter()
    estimator_for(c)
    t3 = time.perf_counter()
    return {"import_s": t1 - t0, "cluster_s": t2 - t1, "estimator_s": t3 - t2, "xgboost": "xgboost" in sys.modules}


def main(argv: list[str]) -> None:
    cluster = argv[argv.index("--cluster") + 1] if "--cluster" in argv else "16x8xH100"
    if "--one" in argv:
        print(json.dumps(one(cluster, "--numpy-first" in argv)))
        return
    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 5
    cmd = [sys.executable, __file__, "--one", "--cluster", cluster] + (["--numpy-first"] if "--numpy-first" in argv
                                                                       else [])
    runs = [json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout) for _ in range(repeat)]
    for key in ("import_s", "cluster_s", "estimator_s"):
        vals = [r[key] for r in runs]
        print(f"{key:12s} median {statistics.median(vals):.3f}  ({', '.join(f'{v:.3f}' for v in vals)})")
    print(f"xgboost imported: {sorted({r['xgboost'] for r in runs})}")


if __name__ == "__main__":
    main(sys.argv[1:])
