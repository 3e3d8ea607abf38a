#!/bin/bash
# meshplan export of plan 'llama8b-mixed' -> Megatron-LM (NVIDIA/Megatron-LM @ d98e8a64ddf3)
# model Llama-3.1-8B (llama) on 2x8xH100: 16 ranks = dp_replicate 1 x dp_shard 2 x cp 1 x tp 4 x pp 2
# batch: global 32 = micro 1 x dp 2 x grad-accum 16; seq_len 4096; zero 1; recompute selective; dtype bf16
# Extra arguments (data, optimizer, --train-iters, --lr, --rotary-base ...) are passed through: ./this.sh --train-iters 1000 --lr 3e-4
# Run this same script on every node; HEAD_NODE = host name of the first node.
set -euo pipefail
: "${HEAD_NODE:?set HEAD_NODE to the host name of the first node}"
if [ -z "${MESHPLAN_JOB_ID:-}" ]; then MESHPLAN_JOB_ID=llama8b-mixed; fi
export MESHPLAN_JOB_ID
export CUDA_DEVICE_MAX_CONNECTIONS=1
PARALLEL_ARGS=(
  --tensor-model-parallel-size 4
  --pipeline-model-parallel-size 2
  --context-parallel-size 1
  --pipeline-model-parallel-layout 'Et*20|t*12L'
  --sequence-parallel
  --micro-batch-size 1
  --global-batch-size 32
  --recompute-granularity selective
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  --bf16
)
MODEL_ARGS=(
  --num-layers 32
  --hidden-size 4096
  --ffn-hidden-size 14336
  --num-attention-heads 32
  --group-query-attention
  --num-query-groups 8
  --kv-channels 128
  --seq-length 4096
  --max-position-embeddings 4096
  --position-embedding-type rope
  --swiglu
  --normalization RMSNorm
  --disable-bias-linear
  --untie-embeddings-and-output-weights
)
DATA_ARGS=(
  --tokenizer-type NullTokenizer
  --vocab-size 128256
  --mock-data
)
torchrun \
  --nnodes 2 \
  --nproc-per-node 8 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$HEAD_NODE:29500" \
  --rdzv-id "$MESHPLAN_JOB_ID" \
  "${MEGATRON_ENTRY:-pretrain_gpt.py}" \
  "${PARALLEL_ARGS[@]}" \
  "${MODEL_ARGS[@]}" \
  "${DATA_ARGS[@]}" "$@"
