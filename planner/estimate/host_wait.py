"""The GPU's wait at an MoE layer's token-count sync: the counts' exchange (``count_exchange_s``) and the host.

A dropless MoE layer copies its token counts to the host once per forward and waits for them before the dispatch:
Megatron-Core's alltoall dispatcher at ``cuda_sync_point`` ``before_ep_alltoall`` (the splits NCCL's all-to-all
takes as Python integers), DeepEP's ``buffer.dispatch`` busy-waiting on its received counts, Hybrid-EP's
``current_stream().synchronize()`` unless a rank capacity pre-sizes its buffers (``token_dispatcher.py`` in every
core release to 0.19). Only dropping and padding to capacity skips it (``drop_and_pad``: no sync). At the wait the
GPU's queue drains; from then on the GPU runs each eager op up to the next wait no earlier than the host launches it,
so over that stretch a layer's forward takes the host's time, or, where its GPU work is longer, the GPU's time after
the host's lead before the experts' first grouped GEMM (``routed_gpu_end_s``), rather than the GPU's time alone. The
host launches ahead of the GPU everywhere else, and the backward has no such wait (the splits are reused).

The host's time for that stretch is read off NVIDIA's own Nsight timelines of DeepSeek-V3 on GB200 NVL72 (MXFP8, EP32:
8 local experts and one shared expert, DeepEP dispatch, Transformer Engine 2.9, Megatron-Core dev 2025-10; "Optimizing
DeepSeek-V3 Training Performance on NVIDIA GB200 NVL72", Megatron-LM
``docs/discussions/deepseek-v3-gb200-optimization``, commit 402bc50b1c, images 4 and 5), as the stretches in which the
GPU stands mostly idle between kernels. From the dispatch kernel's end to the combine kernel's start the host prepares
and runs the routed experts: 3.45 ms once the guide graphed each layer (image 5, bottom, DeepEP: +686.9 to +690.35
ms). Per-layer graphs (``--cuda-graph-scope attn moe_router moe_preprocess``, the guide's and Megatron-Bridge's)
capture the shared expert with the router "unless the shared experts overlap is enabled" (the guide, section "CUDA
Graphs"). Uncaptured, the attention's output projection to the dispatch take 4.0 ms of host (image 4, +18.2 to +22.2
ms), beside which the GPU runs the layer's other forward work (attention, router, preprocessing: the part a per-layer
graph captures), so the wait they add is that host time less this GPU time. The guide's own runs check it: its
optimization-history table lists each step's TFLOPS on one layout (TP1 PP8 VP4 EP32, micro-batch 1, global batch 2048,
256 GPUs, 249.8 GFLOP a token: 64 micro-batches of 8 layers on the busiest ranks), and per-layer graphs of the
attention, router and preprocessing took it from 610.71 to 663.27 TFLOPS (13.40 -> 12.34 s: 2.07 ms a layer and
micro-batch), which is the 4.0 ms less the 1.95 ms the timeline's captured part ran. The eager shared expert is taken
from the runs alone: capturing it went from 797.67 to 829.93 TFLOPS (10.26 -> 9.86 s: 0.78 ms), priced as that plus
the 0.18 ms meshplan prices its forward at there; the timeline reads 1.45 ms (image 5, top, +664.85 to +666.3 ms),
which nothing on it explains. Both timelines and the first pair of runs predate the guide's NUMA binding, its 'CPU-side
optimization' (691.49 -> 762.12 TFLOPS, ``bindpcie``); the second pair follows it. Together the pairs price the none ->
layers step on that layout within 15% of the runs (``tests/test_host_wait.py``). Megatron-Bridge's performance
launcher binds every run it publishes the same way (``numactl --cpunodebind`` per GPU, scripts/performance/utils/
executors.py from v0.2.0), so for its runs the routed stretch is read off an unbound host: an upper estimate. The
binding's gain is not priced: the guide measured it as a whole step, not as host time per stretch.
The GPU time the wait is measured against holds: meshplan prices the part of that layer the graph captured at 1.9 ms,
the timeline's 1.95 (``tests/test_host_wait.py``). Figures read to about 0.1 ms at the timelines' scale. The routed
stretch grows with the experts a rank holds: its two grouped linears' NVTX host ranges in image 5 (bottom) take 0.377
ms (``TEColumnParallelGroupedLinear``, +687.74 to +688.11 ms) and 0.34 ms (``TERowParallelGroupedLinear``, +689.24 to
+689.58 ms) for the guide's 8 local experts, each longer than its grouped GEMM kernels (0.19 and 0.09 ms): the host's
time per expert, taken whole as per-expert cost (Transformer Engine issue 1499: the grouped linear's host time is
``torch.split`` and 2 x ``num_gemms`` ``torch.empty`` calls; the guide itself: "a large EP can reduce the number of
local experts, thereby reducing quantization and other overheads"), 90 us per expert forward on Grace, read at 8 and
extrapolated linearly (the dev set's runs hold 2 to 64 a rank). The routed stretch holds against the same runs: the
guide estimated that removing the sync (one graph for the whole iteration) would gain "at least 10%" more on its final
layout, and meshplan prices that at +15% (``tests/test_host_wait.py``). An x86 host runs that stretch at 181.7 / 197.4
of Grace's time: the stretch is Python, Megatron-Core's dispatcher and Transformer Engine's module code calling
PyTorch ops, and PyTorch's op call measured on a GB200's Grace and on an H100 node's x86 host in 2026 ran 197.4
against 181.7 ns, a bare Python call 71.6 against 67.5 (pytorch issue 187862, ``OpOverload.__call__`` and ``f(*10)``,
medians). The other published pair, a ``torch.nn.Linear`` forward at 13.48 us of host on a DGX H100's Xeon Platinum
8480C against 37.08 us on a GB200 (TransformerEngine issue 2053, 2025-08), was filed as a Grace defect that
Transformer Engine's developers then worked on (PR 2146, "CPU overhead micro-optimizations", motivated by it; issue
2126, 2026-01: "CPU overhead should have been greatly reduced"); it is kept as the open figure (``HOST_SPEED_LINEAR``,
``planner.estimate.host_band``). The dev set's x86 runs check the choice apart from the GPU's prices: those with no
wait (dense, or one whole-iteration graph) against those waiting in eager code (BENCHMARKS.md, "An x86 host runs the
MoE layer's eager stretch at Grace's pace"). The figures were read on Megatron-Core's MoE layer; NeMo AutoModel's
(``Layout.moe_impl``) is other code, one ``grouped_gemm`` call for all its experts, which no timeline shows: its wait
is not priced (``waits_for_host``). Not priced apart: the eager attention's host time before its output projection
(image 4 shows it host-bound too), the backward's (no sync: the host runs ahead; a rank holding many experts may be
host-bound there too), and what Transformer Engine releases after 2.9 cut (its 2026 CPU-overhead changes publish no
figures): for newer stacks the wait is an upper estimate.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from meshplan.costmodel.collectives import Link, nccl_ll_latency_s

# Host seconds of one MoE layer's eager stretches after the token-count wait, on a Grace CPU (module docstring): the
# routed stretch in image 5 (bottom), 3.45 ms from the dispatch kernel's end (+686.9 ms) to the combine kernel's
# start (+690.35), in the five parts its two grouped linears' NVTX ranges (0.377 ms from +687.74, 0.34 ms to
# +689.58) cut it into: the host before fc1 (the dispatch's outputs, the permute), fc1's range, the host between them
# (the activation, the probabilities' scale: what the others leave of the 3.45), fc2's range, and the host after fc2
# (the unpermute, the combine's inputs)
ROUTED_EXPERTS_HOST_S = 690.35e-3 - 686.9e-3
BEFORE_FC1_HOST_S = 687.74e-3 - 686.9e-3
FC1_HOST_S, FC2_HOST_S = 0.377e-3, 0.34e-3
AFTER_FC2_HOST_S = 690.35e-3 - 689.58e-3
BETWEEN_HOST_S = ROUTED_EXPERTS_HOST_S - BEFORE_FC1_HOST_S - FC1_HOST_S - FC2_HOST_S - AFTER_FC2_HOST_S
# Uncaptured, the attention, router and preprocessing: the timeline's 4.0 ms of host (image 4), which the layer's
# GPU work outside the experts runs beside; the shared expert: what capturing it saved in the guide's runs
# (797.67 -> 829.93 TFLOPS: 0.78 ms a layer and micro-batch) plus the 0.18 ms meshplan prices its forward at on
# that layout (the wait is host less GPU; module docstring)
ROUTER_PREPROCESS_HOST_S = 4.0e-3
SHARED_EXPERTS_HOST_S = 0.78e-3 + 0.18e-3
# The timeline's local experts, over which its grouped linears' ranges (fc1 0.377 ms + fc2 0.34 ms) grow per expert
TIMELINE_LOCAL_EXPERTS = 8
# Host time of the eager stretch on an x86 host over a Grace one: PyTorch's op call, OpOverload.__call__ median 181.7
# ns on an H100 node's host against 197.4 ns on a GB200 (pytorch issue 187862, 2026; module docstring)
HOST_SPEED = {"grace": 1.0, "x86": 181.7 / 197.4}
# The other published ratio, a torch.nn.Linear forward's host time, 13.48 us on a DGX H100's Xeon Platinum 8480C
# against 37.08 us on a GB200 (TransformerEngine issue 2053, 2025): ``planner.estimate.explain`` prices the plan at it
# too (``host_band``)
HOST_SPEED_LINEAR = {"grace": 1.0, "x86": 13.48 / 37.08}


def waits_for_host(layout, device) -> bool:
    """Whether an MoE layer of ``layout`` on ``device`` syncs on its token counts with these host figures: dropless
    (dropping and padding to capacity skips the sync) on NVIDIA GPUs in Megatron-Core's MoE layer with Transformer
    Engine's kernels, where the figures were read (not NeMo AutoModel's layer: ``Layout.moe_impl``)."""
    return (not layout.moe_capacity and device.vendor == "nvidia" and layout.stack == "megatron"
            and layout.moe_impl == "megatron")


def routed_launches_s(local_experts: int) -> tuple[float, float]:
    """Grace seconds from the wait's end until the host has launched fc1's and fc2's grouped GEMMs (the ends of
    their NVTX ranges), each range grown or shrunk in proportion to the local experts a rank holds."""
    scale = local_experts / TIMELINE_LOCAL_EXPERTS
    fc1_s = BEFORE_FC1_HOST_S + FC1_HOST_S * scale
    return fc1_s, fc1_s + BETWEEN_HOST_S + FC2_HOST_S * scale


def routed_experts_host_s(local_experts: int) -> float:
    """Grace seconds of host time for the routed stretch of a rank holding ``local_experts`` experts: the
    timeline's 3.45 ms at its 8, less or more the grouped linears' host time per expert (to fc2's launch, then the
    host after it)."""
    return routed_launches_s(local_experts)[1] + AFTER_FC2_HOST_S


def routed_gpu_end_s(host_s: float, fc1_at_s: float, fc2_at_s: float, experts_gpu_s: float,
                     fc2_gpu_s: float) -> float:
    """Seconds from the wait's end until the GPU has run the routed experts, when their work can start no earlier
    than the host launches it: fc1's grouped GEMM (and what follows it up to fc2) at ``fc1_at_s``, fc2's GEMM and
    what follows it (``fc2_gpu_s`` of the ``experts_gpu_s``) at ``fc2_at_s``, the combine not before the host is
    through (``host_s``). A stream runs its kernels in order, each once launched, so the GPU stands idle until the
    host has reached the kernel it would run next."""
    return max(host_s, fc1_at_s + experts_gpu_s, fc2_at_s + fc2_gpu_s)


def fc2_onward(experts: Sequence) -> Sequence:
    """The routed experts' ops (``LayerOps.experts``, in launch order) from fc2's grouped GEMM on: its last
    ``matmul`` and what follows it."""
    last = max((i for i, op in enumerate(experts) if op.kind == "matmul"), default=len(experts))
    return experts[last:]


def moe_sync_wait_s(cuda_graphs: str, host_cpu: str, experts_gpu_s: float, shared_gpu_s: float,
                    shared_overlap: bool, local_experts: int = TIMELINE_LOCAL_EXPERTS,
                    captured_gpu_s: float = 0.0, host_speed: Mapping[str, float] = HOST_SPEED,
                    fc2_gpu_s: float = 0.0) -> float:
    """Seconds one MoE layer's forward waits for the host after its token-count sync (0 when no sync is left).

    ``experts_gpu_s``: the GPU's time for the routed experts that follow the wait, of which ``fc2_gpu_s`` from
    fc2's grouped GEMM on (``routed_gpu_end_s``); ``shared_gpu_s``: the shared experts', which run before the sync
    (Megatron-Core) or beside the dispatch (``shared_overlap``);
    ``captured_gpu_s``: the forward's other GPU time (attention, router, preprocessing), what per-layer graphs
    capture, which runs beside their host time when they are not captured;
    ``local_experts``: the routed experts one rank holds (their grouped linears' host time grows with them);
    ``shared_overlap``: the shared experts overlap the dispatch, so per-layer graphs leave them out and their GPU
    time runs beside the dispatch rather than in the stretch.
    ``cuda_graphs`` as the layout's decision: per-layer graphs capture the attention, router, preprocessing and
    shared experts, not the routed experts; nothing captured leaves all of them eager, their wait a stretch before
    the sync's, so capturing them never adds to the wait; graphs of the mixers alone (``mixers``) leave the router,
    the preprocessing and the shared experts eager: priced as none, the timeline's stretch from the attention's output
    projection to the dispatch (an upper estimate where the projection runs inside the attention's graph).
    ``host_speed``: each host's time over Grace's (``HOST_SPEED``, or the alternative ``HOST_SPEED_LINEAR``)."""
    if cuda_graphs == "iteration":
        return 0.0
    speed = host_speed[host_cpu]
    host_s = routed_experts_host_s(local_experts)
    if shared_gpu_s and shared_overlap:  # on a side stream beside the dispatch, eager under either scope
        host_s += SHARED_EXPERTS_HOST_S
    fc1_at_s, fc2_at_s = (t * speed for t in routed_launches_s(local_experts))
    gpu_end_s = routed_gpu_end_s(host_s * speed, fc1_at_s, fc2_at_s, experts_gpu_s, fc2_gpu_s)
    wait_s = gpu_end_s - experts_gpu_s
    if cuda_graphs in ("none", "mixers"):
        # before the sync, a stretch of its own (the GPU's queue drains at the sync, so work after it hides nothing
        # before it): Megatron-Core's MoE forward runs the shared experts, then the router and preprocessing
        # (``MoELayer.forward``: shared_experts_compute, route, preprocess, then dispatch). Their host time runs
        # beside that GPU work and beside what the routed experts left queued when the host had launched them (the
        # layers repeat, so the routed experts' GPU time past their host time comes before the next layer's)
        in_line = bool(shared_gpu_s) and not shared_overlap
        pre_host_s = ROUTER_PREPROCESS_HOST_S + (SHARED_EXPERTS_HOST_S if in_line else 0.0)
        queued_s = max(0.0, gpu_end_s - host_s * speed)
        wait_s += max(0.0, pre_host_s * speed - captured_gpu_s - (shared_gpu_s if in_line else 0.0) - queued_s)
    return wait_s


# Bytes of one rank's token count per expert in the exchange (``num_local_tokens_per_expert``, int64)
COUNT_BYTES = 8


def count_exchange_s(layout, experts: int, link: Link, device) -> float:
    """Seconds of the token-count exchange before a dropless MoE layer's sync under Megatron-Core's alltoall
    dispatcher: ``MoEAlltoAllTokenDispatcher.preprocess`` all-gathers each rank's tokens per expert over the
    expert-TP x EP group (``gather_from_sequence_parallel_region(num_local_tokens_per_expert, group=tp_ep_group)``,
    core_v0.16.1 token_dispatcher.py lines 525-541) on the compute stream, before the splits go to the host; dropping
    and padding to capacity skips it (the splits are fixed), and the flex dispatcher (DeepEP, Hybrid-EP) exchanges
    its counts inside its own kernels. A few kilobytes: NCCL's LL latency over the group's ranks and the nodes its
    ``link`` spans (``nccl_ll_latency_s``), plus its bytes at that link's bandwidth. Forward only (the backward reuses
    the splits); 0 where it does not run."""
    group = layout.ep * layout.expert_tp
    if (group <= 1 or layout.moe_dispatcher != "alltoall" or layout.moe_capacity or layout.stack != "megatron"
            or device.vendor != "nvidia"):
        return 0.0
    gathered = COUNT_BYTES * experts * group
    return nccl_ll_latency_s("allgather", group, link.nodes) + (group - 1) / group * gathered / (
        link.bandwidth_bytes_per_s)
