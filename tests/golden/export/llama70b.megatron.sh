#!/bin/bash
# meshplan export of plan 'llama70b-tp8pp4' -> Megatron-LM (NVIDIA/Megatron-LM @ d98e8a64ddf3)
# model Llama-3.1-70B (llama) on 16x8xH100: 128 ranks = dp_replicate 1 x dp_shard 4 x cp 1 x tp 8 x pp 4, vpp 2
# batch: global 512 = micro 1 x dp 4 x grad-accum 128; seq_len 8192; zero 1; recompute full; dtype bf16
# Extra arguments (data, optimizer, --train-iters, --lr, --rotary-base ...) are passed through: ./this.sh --train-iters 1000 --lr 3e-4
# Run this same script on every node; HEAD_NODE = host name of the first node.
set -euo pipefail
: "${HEAD_NODE:?set HEAD_NODE to the host name of the first node}"
if [ -z "${MESHPLAN_JOB_ID:-}" ]; then MESHPLAN_JOB_ID=llama70b-tp8pp4; fi
export MESHPLAN_JOB_ID
export CUDA_DEVICE_MAX_CONNECTIONS=1
PARALLEL_ARGS=(
  --tensor-model-parallel-size 8
  --pipeline-model-parallel-size 4
  --context-parallel-size 1
  --num-layers-per-virtual-pipeline-stage 10
  --sequence-parallel
  --micro-batch-size 1
  --global-batch-size 512
  --recompute-granularity full
  --recompute-method uniform
  --recompute-num-layers 1
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  --bf16
)
MODEL_ARGS=(
  --num-layers 80
  --hidden-size 8192
  --ffn-hidden-size 28672
  --num-attention-heads 64
  --group-query-attention
  --num-query-groups 8
  --kv-channels 128
  --seq-length 8192
  --max-position-embeddings 8192
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
  --nnodes 16 \
  --nproc-per-node 8 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$HEAD_NODE:29500" \
  --rdzv-id "$MESHPLAN_JOB_ID" \
  "${MEGATRON_ENTRY:-pretrain_gpt.py}" \
  "${PARALLEL_ARGS[@]}" \
  "${MODEL_ARGS[@]}" \
  "${DATA_ARGS[@]}" "$@"
