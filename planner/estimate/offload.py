"""Activation offloading to host memory (Megatron-Core ``cpu_offloading``, run by Transformer Engine): what stays on
the GPU and what the copies cost a micro-batch.

Transformer Engine's default schedule for N offloaded layers of a stage of L (``cpu_offload.py``,
``OffloadSynchronizer._default_offload_sync_init``: "offload layers 0, ..., num_offloaded_layers - 1"):

- forward: after layer i < N has run, its saved tensors are copied to host memory on one side stream; the copy
  must be done before layer L - N + i runs (the compute stream waits for it there), which frees its GPU copy;
- backward: the reload of layer i starts when the backward reaches layer L - 1 - N + i and must be done before
  layer i's backward (the compute stream waits for it there).

So at any moment a stage holds L - N layers' activations ("peak memory usage of saving activations is
(num_layers - num_offloaded_layers) * T"), and a copy is free as long as the side stream keeps ahead of its
deadline. Copies run one after another on that stream at the host link's rate.
"""
from __future__ import annotations

from typing import Sequence


def offload_exposed_s(fwd_s: Sequence[float], bwd_s: Sequence[float], copy_s: Sequence[float],
                      offloaded: int) -> tuple[float, float]:
    """(forward, backward) seconds a micro-batch waits for offload copies beyond its compute.

    ``fwd_s`` / ``bwd_s``: each layer's forward and backward compute, seconds, in model order; ``copy_s``: the time
    one layer's saved tensors take over the host link, one direction; ``offloaded``: N, layers 0..N-1 offloaded.
    """
    n_layers = len(fwd_s)
    if not offloaded:
        return 0.0, 0.0
    keep = n_layers - offloaded  # layers between a copy's start and its deadline
    t = stream = 0.0
    done = {}
    for j in range(n_layers):
        i = j - keep
        if 0 <= i < offloaded:  # the compute stream waits for layer i's copy before layer j = L - N + i
            t = max(t, done[i])
        t += fwd_s[j]
        if j < offloaded:  # layer j's tensors are ready: its copy queues on the side stream
            stream = done[j] = max(t, stream) + copy_s[j]
    fwd_exposed = t - sum(fwd_s)
    t = stream = 0.0
    back = {}
    for k in range(n_layers - 1, -1, -1):
        i = k - (keep - 1)
        if 0 <= i < offloaded:  # the reload of layer i starts at layer L - 1 - N + i's backward
            stream = back[i] = max(t, stream) + copy_s[i]
        if k < offloaded:
            t = max(t, back[k])
        t += bwd_s[k]
    return fwd_exposed, t - sum(bwd_s)
