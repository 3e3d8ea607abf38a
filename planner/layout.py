"""``Layout``: one candidate placement of a model on a cluster, and all of its mesh arithmetic and validation.

In the spirit of torchtitan's ``parallel_dims.py``: every divisibility rule lives here, and every error prints
the numbers involved. Rank order (fastest-varying first) follows Megatron-LM: tp, cp, dp, pp — so a TP group is
contiguous ranks, a CP group has stride tp, a DP group stride tp*cp and PP neighbours are tp*cp*dp apart.
Expert parallelism borrows its ranks from dp_shard * cp (torchtitan) with stride tp.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.core.errors import MeshplanError

RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("flash", "unfused")


@dataclass(frozen=True)
class Layout:
    """Every decision of a homogeneous plan.

    Attributes:
        dp_replicate, dp_shard, tp, pp, vpp, cp, ep: parallel degrees (vpp = virtual chunks per pipeline rank).
        micro_batch: sequences per micro-batch per data-parallel rank.
        zero_stage: 0-3 over the dp_shard group (3 = FSDP full shard). 0 requires dp_shard == 1.
        recompute: "none", "selective" (core attention, Korthikanti et al. 2022) or "full".
        sequence_parallel: Megatron SP (norms/dropout sharded over TP); needs tp > 1.
        attention: "flash" (FlashAttention, no s x s scores stored) or "unfused" (materialised scores, as in
            Megatron-LM 2021: fused scale-mask-softmax, separate dropout).
    """

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    micro_batch: int = 1
    zero_stage: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    attention: str = "flash"

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def schedule(self) -> str:
        return "interleaved" if self.vpp > 1 else "1f1b"

    def num_microbatches(self, global_batch: int) -> int:
        return global_batch // (self.micro_batch * self.dp)

    def with_(self, **kw) -> "Layout":
        return replace(self, **kw)

    # ---- rank strides (Megatron order tp -> cp -> dp -> pp) ----
    @property
    def cp_stride(self) -> int:
        return self.tp

    @property
    def dp_stride(self) -> int:
        return self.tp * self.cp

    @property
    def pp_stride(self) -> int:
        return self.tp * self.cp * self.dp

    def validate(self, *, world_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                 seq_len: int, global_batch: int, num_experts: int = 0) -> None:
        """Raise ``MeshplanError`` naming the first rule this layout breaks, with the numbers."""
        for name in ("dp_replicate", "dp_shard", "tp", "pp", "vpp", "cp", "ep", "micro_batch"):
            if getattr(self, name) < 1:
                raise MeshplanError(f"{name}={getattr(self, name)} must be >= 1")
        if self.world_size != world_size:
            raise MeshplanError(
                f"dp_replicate({self.dp_replicate}) * dp_shard({self.dp_shard}) * cp({self.cp}) * tp({self.tp}) "
                f"* pp({self.pp}) = {self.world_size} != cluster world size {world_size}")
        if num_heads % self.tp:
            raise MeshplanError(f"tp={self.tp} does not divide the {num_heads} attention heads")
        if num_kv_heads % self.tp and self.tp % num_kv_heads:
            raise MeshplanError(f"tp={self.tp} and the {num_kv_heads} KV heads: neither divides the other")
        if num_layers % self.pp:
            raise MeshplanError(f"pp={self.pp} does not divide the {num_layers} layers")
        if self.vpp > 1:
            if self.pp == 1:
                raise MeshplanError(f"vpp={self.vpp} needs pipeline parallelism (pp=1)")
            if num_layers % (self.pp * self.vpp):
                raise MeshplanError(
                    f"pp({self.pp}) * vpp({self.vpp}) = {self.pp * self.vpp} does not divide the {num_layers} layers")
        if seq_len % (2 * self.cp) and self.cp > 1:
            raise MeshplanError(f"cp={self.cp}: seq_len {seq_len} must be divisible by 2*cp={2 * self.cp} "
                                "(load-balanced causal context parallelism)")
        if self.ep > 1:
            if num_experts == 0:
                raise MeshplanError(f"ep={self.ep} but the model has no experts")
            if num_experts % self.ep:
                raise MeshplanError(f"ep={self.ep} does not divide the {num_experts} experts")
            if (self.dp_shard * self.cp) % self.ep:
                raise MeshplanError(f"ep={self.ep} must divide dp_shard*cp = {self.dp_shard}*{self.cp} "
                                    f"= {self.dp_shard * self.cp} (experts borrow data-parallel ranks)")
        if self.zero_stage not in (0, 1, 2, 3):
            raise MeshplanError(f"zero stage {self.zero_stage} is not one of 0, 1, 2, 3")
        if self.zero_stage == 0 and self.dp_shard > 1:
            raise MeshplanError(f"dp_shard={self.dp_shard} shards states, which needs zero stage 1-3 (got 0)")
        if self.recompute not in RECOMPUTE:
            raise MeshplanError(f"recompute '{self.recompute}' is not one of {', '.join(RECOMPUTE)}")
        if self.attention not in ATTENTION:
            raise MeshplanError(f"attention '{self.attention}' is not one of {', '.join(ATTENTION)}")
        if self.sequence_parallel and self.tp == 1:
            raise MeshplanError("sequence parallel needs tp > 1")
        per_step = self.micro_batch * self.dp
        if global_batch % per_step:
            raise MeshplanError(
                f"global batch {global_batch} is not divisible by micro_batch({self.micro_batch}) * dp({self.dp}) "
                f"= {per_step}")
        m = global_batch // per_step
        if self.vpp > 1 and m % self.pp:
            raise MeshplanError(f"interleaved schedule: {m} micro-batches must be a multiple of pp={self.pp}")
