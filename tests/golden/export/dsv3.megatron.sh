#!/bin/bash
# meshplan export of plan 'dsv3-ep64' -> Megatron-LM (NVIDIA/Megatron-LM @ d98e8a64ddf3)
# model DeepSeek-V3 (deepseek_v3) on 32x8xH100: 256 ranks = dp_replicate 1 x dp_shard 128 x cp 1 x tp 2 x pp 1, ep 64
# batch: global 2048 = micro 1 x dp 128 x grad-accum 16; seq_len 4096; zero 1; recompute selective; dtype bf16
# Extra arguments (data, optimizer, --train-iters, --lr, --rotary-base ...) are passed through: ./this.sh --train-iters 1000 --lr 3e-4
# Run this same script on every node; HEAD_NODE = host name of the first node.
set -euo pipefail
: "${HEAD_NODE:?set HEAD_NODE to the host name of the first node}"
if [ -z "${MESHPLAN_JOB_ID:-}" ]; then MESHPLAN_JOB_ID=dsv3-ep64; fi
export MESHPLAN_JOB_ID
export CUDA_DEVICE_MAX_CONNECTIONS=1
PARALLEL_ARGS=(
  --tensor-model-parallel-size 2
  --pipeline-model-parallel-size 1
  --context-parallel-size 1
  --expert-model-parallel-size 64
  --expert-tensor-parallel-size 2
  --sequence-parallel
  --micro-batch-size 1
  --global-batch-size 2048
  --recompute-granularity selective
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  --bf16
)
MODEL_ARGS=(
  --num-layers 61
  --hidden-size 7168
  --ffn-hidden-size 18432
  --num-attention-heads 128
  --multi-latent-attention
  --kv-lora-rank 512
  --q-lora-rank 1536
  --qk-head-dim 128
  --qk-pos-emb-head-dim 64
  --v-head-dim 128
  --seq-length 4096
  --max-position-embeddings 4096
  --position-embedding-type rope
  --swiglu
  --normalization RMSNorm
  --disable-bias-linear
  --untie-embeddings-and-output-weights
  --num-experts 256
  --moe-router-topk 8
  --moe-ffn-hidden-size 2048
  --moe-shared-expert-intermediate-size 2048
  --moe-layer-freq '[0]*3+[1]*58'
  --moe-grouped-gemm
  --moe-token-dispatcher-type alltoall
)
DATA_ARGS=(
  --tokenizer-type NullTokenizer
  --vocab-size 129280
  --mock-data
)
torchrun \
  --nnodes 32 \
  --nproc-per-node 8 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$HEAD_NODE:29500" \
  --rdzv-id "$MESHPLAN_JOB_ID" \
  "${MEGATRON_ENTRY:-pretrain_gpt.py}" \
  "${PARALLEL_ARGS[@]}" \
  "${MODEL_ARGS[@]}" \
  "${DATA_ARGS[@]}" "$@"
