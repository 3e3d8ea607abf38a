"""bench/lodo_floor.py: the per-group prediction minimising the summed absolute percentage error (the weighted median
under weights 1/measurement) agrees with a brute-force search over a fine grid, for single groups and vectorised."""
import importlib.util
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("lodo_floor", REPO / "bench" / "lodo_floor.py")
lodo_floor = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lodo_floor)


def _sape(p: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Summed APE of each candidate prediction in ``p`` over the measurements ``m``."""
    return (np.abs(p[:, None] - m[None, :]) / m[None, :]).sum(axis=1)


# Hand-made groups (ms): a skewed one where the plain median (2.0) is not the minimiser, a 2-3x disagreement of two
# collections, an even-sized one, and a singleton.
GROUPS = [np.array([1.0, 2.0, 10.0]), np.array([0.17, 0.18, 0.19, 0.52, 0.55]), np.array([3.0, 4.0, 9.0, 30.0]),
          np.array([7.0])]


def test_weighted_median_matches_grid_search():
    for m in GROUPS:
        grid = np.linspace(0.5 * m.min(), 1.5 * m.max(), 200_001)
        obj = _sape(grid, m)
        p = lodo_floor.min_sape(m)
        best = obj.min()
        assert _sape(np.array([p]), m)[0] <= best + 1e-9, (m, p, grid[obj.argmin()])
        # the grid's minimisers lie next to p (every group here has a unique minimiser)
        assert abs(grid[obj.argmin()] - p) <= 2 * (grid[1] - grid[0]), (m, p, grid[obj.argmin()])
    m = GROUPS[0]
    assert lodo_floor.min_sape(m) == 1.0 and _sape(np.array([1.0]), m)[0] < _sape(np.array([np.median(m)]), m)[0]


def test_group_floor_vectorised_matches_per_group():
    rng = np.random.default_rng(0)
    lat = np.concatenate(GROUPS)
    gid = np.concatenate([np.full(len(g), i) for i, g in enumerate(GROUPS)])
    perm = rng.permutation(len(lat))  # rows arrive unsorted
    pred = lodo_floor.group_floor(gid[perm], lat[perm])
    for i, m in enumerate(GROUPS):
        assert np.all(pred[gid[perm] == i] == lodo_floor.min_sape(m))
    # the floor of the singleton is 0; of the two-collection group it is the grid's minimum / rows
    ape = 100 * np.abs(pred - lat[perm]) / lat[perm]
    assert np.all(ape[gid[perm] == 3] == 0)
    m = GROUPS[1]
    grid = np.linspace(0.1, 0.6, 200_001)
    assert abs(ape[gid[perm] == 1].mean() - 100 * _sape(grid, m).min() / len(m)) < 1e-3
