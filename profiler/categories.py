"""What each Kineto event category means to the replay, for every vendor and every trace vintage.

A category is one of five *roles* (or not used, with the reason the report prints):

* ``host``: CPU ops on a thread (``cpu_op``; ``Operator`` in 2021 traces of PyTorch 1.8/1.9);
* ``annotation``: ``user_annotation`` ranges (``ProfilerStep#N`` markers, ``nccl:*`` / ``gloo:*`` / ``hccl:*``
  collective annotations);
* ``runtime``: host calls into a device runtime that may launch device work, joined to it by ``correlation``
  (``cuda_runtime``, ``cuda_driver``, ``Runtime`` of 2021, ``mtia_runtime``, ``xpu_runtime``, ``xpu_driver``,
  ``privateuse1_*``, ``hpu_op``, ``glow_runtime``; any unknown ``*_runtime`` / ``*_driver`` too);
* ``device``: ops on a device queue (CUDA/ROCm ``kernel``, ``Kernel`` of 2021, MTIA ``mtia_ccp_events``);
* ``copy``: device memory copies and fills (``gpu_memcpy``, ``gpu_memset``, ``Memcpy``, ``Memset``);
* ``sync``: ``cuda_sync`` (which stream waited for which event), read for cross-stream edges.

Names are libkineto's ``ActivityType`` table (``libkineto/include/ActivityType.h``) and, for 2021 traces, the
names the TensorBoard plugin read then (``tb_plugin/torch_tb_profiler/profiler/trace.py``: ``Operator``,
``Runtime``, ``Kernel``, ``Memcpy``, ``Memset``, ``Python``, ``Memory``). ROCm/HIP traces use the CUDA names
(HIP calls under ``cuda_runtime``), as the MI250/MI300X sets show.

Communication is recognised by name, because only NCCL kernels carry collective metadata: kernels of NCCL, RCCL
(``ncclDevKernel_Generic``), HCCL, oneCCL/XCCL, MSCCL(++), NVSHMEM, DeepEP (``dpsk::ep::*``, ``deep_ep::*``:
expert-parallel dispatch/combine are all-to-alls) and custom all-to-all / all-reduce kernels; host annotations
``nccl:``, ``rccl:``, ``hccl:``, ``gloo:``, ``mpi:``, ``ucc:``, ``xccl:`` and ``c10d::`` ops.
"""
from __future__ import annotations

import re

# role per category (exact names; compared case-sensitively as Kineto writes them)
ROLES: dict[str, str] = {
    "cpu_op": "host", "Operator": "host",
    "user_annotation": "annotation",
    "cuda_runtime": "runtime", "cuda_driver": "runtime", "Runtime": "runtime", "mtia_runtime": "runtime",
    "xpu_runtime": "runtime", "xpu_driver": "runtime", "privateuse1_runtime": "runtime",
    "privateuse1_driver": "runtime", "hpu_op": "runtime", "glow_runtime": "runtime",
    "kernel": "device", "Kernel": "device", "mtia_ccp_events": "device",
    "gpu_memcpy": "copy", "Memcpy": "copy", "gpu_memset": "copy", "Memset": "copy",
    "cuda_sync": "sync",
}

# Why a category is not used (shown in the report's "not used" list).
NOT_USED: dict[str, str] = {
    "ac2g": "launch->kernel flow arrows (the replay joins launches to kernels by correlation id instead)",
    "async_cpu_to_gpu": "launch->kernel flow arrows (old name; joined by correlation id instead)",
    "async": "launch->kernel flow arrows (2021 name; joined by correlation id instead)",
    "async_gpu": "flow arrows (old name; joined by correlation id instead)",
    "fwdbwd": "forward->backward flow arrows (viewer links, no timing)",
    "python_function": "Python stack frames (the ops inside them carry the timing)",
    "Python": "Python stack frames (2021 name; the ops inside them carry the timing)",
    "cpu_instant_event": "instant events (memory allocations, markers: no duration)",
    "Memory": "memory events (2021 name: no duration)",
    "gpu_user_annotation": "device-side copies of annotation ranges (the kernels inside carry the timing)",
    "gpu_user_Annotation": "device-side copies of annotation ranges (the kernels inside carry the timing)",
    "User": "device-side user ranges (2021 name; the kernels inside carry the timing)",
    "Trace": "the profiler's own span",
    "overhead": "profiler overhead samples",
    "cuda_profiler_range": "CUPTI range-profiler records (counters, not a timeline)",
    "mtia_insight": "MTIA insight counters (not a timeline)",
    "mtia_counters": "MTIA hardware counters (not a timeline)",
    "hardware_counters": "hardware counter samples (not a timeline)",
    "xpu_scope_profiler": "XPU scope metrics (not a timeline)",
    "cuda_event": "CUDA event records (stream waits come from cuda_sync)",
    "xpu_sync": "XPU synchronisation records (not read yet)",
    "external_correlation": "correlation records (no timing)",
    "collective_comm": "collective records without a device lane (the kernels carry the timing)",
    "critical_path": "an analysis tool's overlay (HTA critical path), not a recording",
}

_RUNTIME_SUFFIX = re.compile(r"_(runtime|driver)$")

# Device kernels that move data between ranks. Names checked in the first 160 characters (templated kernel names
# run to kilobytes; the library prefix is near the start). Sources: NCCL/RCCL kernel names (ncclKernel_*,
# ncclDevKernel_*; RCCL 2.18+ launches ncclDevKernel_Generic), DeepEP (deepseek-ai/DeepEP: deep_ep::intranode /
# internode dispatch/combine; the DeepSeek-V3 profile names them dpsk::ep::*), NVSHMEM (nvshmem*/nvshmemi*),
# MSCCL/MSCCL++ and oneCCL (ccl_kernel*, xccl*). DeepEP's local kernels (``dpsk::ep::cuda::get_dispatch_layout``,
# ``deep_ep::layout::*``) compute routing tables on the device: compute, not comm.
_COMM_KERNEL = re.compile(r"nccl|rccl|hccl|xccl|oneccl|\bccl_|msccl|nvshmem|"
                          r"(?:deep_ep|dpsk::ep)::(?:internode|intranode|internode_ll)::|"
                          r"all_?to_?all|alltoallv|all_?reduce|all_?gather|reduce_?scatter|"
                          r"(?:moe|ep)_?(?:dispatch|combine)", re.IGNORECASE)
# Custom collective names that a compute kernel could contain by accident ("gather", "scatter" alone) are not
# listed; a kernel needs one of the names above.
_COMM_ANNOTATION_PREFIXES = ("nccl:", "rccl:", "hccl:", "xccl:", "gloo:", "mpi:", "ucc:", "c10d::")
# CPU backends run the collective itself on a worker thread: their annotation *is* the transfer.
_CPU_COMM_PREFIXES = ("gloo:", "mpi:", "ucc:")


def role_of(cat: object) -> str | None:
    """Role of a category (``host``, ``annotation``, ``runtime``, ``device``, ``copy``, ``sync``), None when not
    used."""
    if not isinstance(cat, str):
        return None
    r = ROLES.get(cat)
    if r is None and _RUNTIME_SUFFIX.search(cat) and cat not in NOT_USED:
        return "runtime"  # an unknown vendor's runtime/driver calls: host time that may launch device work
    return r


def why_not_used(cat: object) -> str:
    """Reason a category is not used, for the report."""
    if cat is None:
        return "metadata, instants and flow events without a category (names of processes and threads)"
    return NOT_USED.get(str(cat), "category unknown to this version of meshplan")


# Substrings one of which every name _COMM_KERNEL matches contains: a cheap filter before the regex (most device
# ops are compute kernels; the alternation regex costs ~50 µs on a long templated name, the filter ~3 µs).
_COMM_TOKENS = ("ccl", "nvshmem", "deep_ep::", "dpsk::ep::", "all_to_all", "alltoall", "all_reduce", "allreduce",
                "all_gather", "allgather", "reduce_scatter", "reducescatter", "dispatch", "combine")


def is_comm_kernel(name: str) -> bool:
    """True when a device op's name says it moves data between ranks."""
    head = name[:160].lower()
    if not any(tok in head for tok in _COMM_TOKENS):
        return False
    return _COMM_KERNEL.search(head) is not None


def is_comm_annotation(lname: str) -> bool:
    """True for a collective annotation / c10d op (``lname`` lower-cased)."""
    return lname.startswith(_COMM_ANNOTATION_PREFIXES) or lname == "record_param_comms"


def is_cpu_collective(lname: str) -> bool:
    """True for a CPU backend's collective (its annotation spans the transfer itself)."""
    return lname.startswith(_CPU_COMM_PREFIXES)


def comm_type_hint(name: str) -> str | None:
    """Collective type that a kernel name implies beyond the generic matcher (DeepEP dispatch/combine)."""
    n = name.lower()
    if "dispatch" in n or "combine" in n:
        return "alltoall"
    if "notify" in n:
        return "barrier"  # DeepEP's cached_notify: ranks exchange counters and wait for each other
    return None


def collective_type(name: str) -> str | None:
    """Normalised collective type from a kernel, annotation or ``Collective name`` string.

    Returns one of ``allreduce, allgather, reducescatter, alltoall, broadcast, reduce, sendrecv, barrier`` or None.
    """
    n = name.lower().replace("_", "").replace(":", "").replace(" ", "")
    for key, typ in (("allreduce", "allreduce"), ("reducescatter", "reducescatter"), ("allgather", "allgather"),
                     ("alltoall", "alltoall"), ("broadcast", "broadcast"), ("barrier", "barrier"),
                     ("sendrecv", "sendrecv"), ("send", "sendrecv"), ("recv", "sendrecv"), ("reduce", "reduce"),
                     ("gather", "allgather"), ("scatter", "reducescatter")):
        if key in n:
            return typ
    return None
