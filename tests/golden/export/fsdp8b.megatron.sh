#!/bin/bash
# meshplan export of plan 'llama8b-fsdp8' -> Megatron-LM (NVIDIA/Megatron-LM @ d98e8a64ddf3)
# model Llama-3.1-8B (llama) on 1x8xH100: 8 ranks = dp_replicate 1 x dp_shard 8 x cp 1 x tp 1 x pp 1
# batch: global 64 = micro 2 x dp 8 x grad-accum 4; seq_len 8192; zero 3; recompute full; dtype bf16
# Extra arguments (data, optimizer, --train-iters, --lr, --rotary-base ...) are passed through: ./this.sh --train-iters 1000 --lr 3e-4
set -euo pipefail
PARALLEL_ARGS=(
  --tensor-model-parallel-size 1
  --pipeline-model-parallel-size 1
  --context-parallel-size 1
  --micro-batch-size 2
  --global-batch-size 64
  --recompute-granularity full
  --recompute-method uniform
  --recompute-num-layers 1
  --use-megatron-fsdp
  --data-parallel-sharding-strategy optim_grads_params
  --ckpt-format fsdp_dtensor
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
  --standalone \
  --nnodes 1 \
  --nproc-per-node 8 \
  "${MEGATRON_ENTRY:-pretrain_gpt.py}" \
  "${PARALLEL_ARGS[@]}" \
  "${MODEL_ARGS[@]}" \
  "${DATA_ARGS[@]}" "$@"
