#!/bin/bash
# meshplan export of plan 'llama8b-hetero' -> Megatron-LM (NVIDIA/Megatron-LM @ d98e8a64ddf3)
# model Llama-3.1-8B (llama) on 1x8xH100+1x8xA100: 16 ranks = dp_replicate 1 x dp_shard 2 x cp 1 x tp 4 x pp 2
# batch: global 32 = micro 1 x dp 2 x grad-accum 16; seq_len 4096; zero 1; recompute selective; dtype bf16
# Extra arguments (data, optimizer, --train-iters, --lr, --rotary-base ...) are passed through: ./this.sh --train-iters 1000 --lr 3e-4
# Heterogeneous pipeline: node ranks are static and follow the stages (rank = node rank x nproc-per-node + local rank; stage = rank // ranks per stage):
#   node rank 0: H100 (cluster group 0), stage 0 (layers 0-19)
#   node rank 1: A100 (cluster group 1), stage 1 (layers 20-31)
# Run this same script on every node with NODE_RANK from the table; HEAD_NODE = node rank 0.
set -euo pipefail
: "${NODE_RANK:?set NODE_RANK (0-1) to the rank of this node in the table above}"
: "${HEAD_NODE:?set HEAD_NODE to the host name of node rank 0}"
if [ -z "${MASTER_PORT:-}" ]; then MASTER_PORT=29500; fi
export MASTER_PORT
case "$NODE_RANK" in *[!0-9]*|"") echo "NODE_RANK=$NODE_RANK: not a number" >&2; exit 2;; esac
if [ "$NODE_RANK" -ge 0 ] && [ "$NODE_RANK" -le 0 ]; then MESHPLAN_NODE_DEVICE=H100
elif [ "$NODE_RANK" -ge 1 ] && [ "$NODE_RANK" -le 1 ]; then MESHPLAN_NODE_DEVICE=A100
else echo "NODE_RANK=$NODE_RANK: this plan has node ranks 0-1" >&2; exit 2; fi
export MESHPLAN_NODE_DEVICE
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
  --node-rank "$NODE_RANK" \
  --master-addr "$HEAD_NODE" \
  --master-port "$MASTER_PORT" \
  "${MEGATRON_ENTRY:-pretrain_gpt.py}" \
  "${PARALLEL_ARGS[@]}" \
  "${MODEL_ARGS[@]}" \
  "${DATA_ARGS[@]}" "$@"
