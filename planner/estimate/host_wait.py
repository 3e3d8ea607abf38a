"""The GPU's wait for the host after an MoE layer's token-count sync.

A dropless MoE layer copies its token counts to the host once per forward and waits for them before the dispatch:
Megatron-Core's alltoall dispatcher at ``cuda_sync_point`` ``before_ep_alltoall`` (the splits NCCL's all-to-all
takes as Python integers), DeepEP's ``buffer.dispatch`` busy-waiting on its received counts, Hybrid-EP's
``current_stream().synchronize()`` unless a rank capacity pre-sizes its buffers (``token_dispatcher.py`` in every
core release to 0.19). Only dropping and padding to capacity skips it (``drop_and_pad``: no sync). At the wait the
GPU's queue drains; from then on the GPU runs only as fast as the host launches the eager ops up to the next wait,
so a layer's forward takes ``max(host, GPU)`` over that stretch rather than the GPU's time. The host launches
ahead of the GPU everywhere else, and the backward has no such wait (the splits are reused).

The host's time for that stretch is read off NVIDIA's own Nsight timelines of DeepSeek-V3 on GB200 NVL72 (MXFP8,
EP32: 8 local experts, Transformer Engine 2.9, Megatron-Core dev 2025-10; "Optimizing DeepSeek-V3 Training
Performance on NVIDIA GB200 NVL72", Megatron-LM ``docs/discussions/deepseek-v3-gb200-optimization``, commit
402bc50b1c, images 4 and 5): the routed experts' stretch after per-layer graphs, 2.6 ms with a sparse GPU (the
final state, shared expert graphed, processes bound to their NUMA node); the router and dispatch preprocessing, 2.8
ms eager (DeepEP, fused router). An x86 host launches faster: a ``torch.nn.Linear`` forward costs the host 13.48
us on an H100 DGX's Xeon Platinum 8480C against 37.08 us on a GB200's Grace (TransformerEngine issue 2053), the only
measured pair, taken for every x86 host. Not priced: the eager attention's host time (no measurement) and how the
experts' host time grows with their number per rank (the timeline's layer held 8).
"""
from __future__ import annotations

# Host seconds of one MoE layer's eager stretch after the token-count wait, on a Grace CPU: the routed experts'
# dispatch, grouped GEMMs and combine (image5, bottom: +687.9 -> +690.5 ms), and the router and dispatch
# preprocessing when they are not captured (image4: +19.3 -> +22.1 ms)
ROUTED_EXPERTS_HOST_S = 2.6e-3
ROUTER_PREPROCESS_HOST_S = 2.8e-3
# Host time of one framework op on an x86 host over a Grace one: torch.nn.Linear forward, 13.48 / 37.08 us
# (TransformerEngine issue 2053: H100 DGX with Xeon Platinum 8480C against GB200)
HOST_SPEED = {"grace": 1.0, "x86": 13.48 / 37.08}


def moe_sync_wait_s(cuda_graphs: str, host_cpu: str, experts_gpu_s: float, rest_gpu_s: float) -> float:
    """Seconds one MoE layer's forward waits for the host after its token-count sync (0 when no sync).

    ``experts_gpu_s``: the GPU's time for what follows the wait in the layer (dispatch, routed and shared experts,
    combine); ``rest_gpu_s``: the rest of its forward (attention, router), which the host launches eagerly in the same
    stretch when nothing is captured. ``cuda_graphs`` as the layout's decision."""
    if cuda_graphs == "iteration":
        return 0.0
    host_s = ROUTED_EXPERTS_HOST_S
    gpu_s = experts_gpu_s
    if cuda_graphs == "none":
        host_s += ROUTER_PREPROCESS_HOST_S
        gpu_s += rest_gpu_s
    return max(0.0, host_s * HOST_SPEED[host_cpu] - gpu_s)
