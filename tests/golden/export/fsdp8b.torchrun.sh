#!/bin/bash
# meshplan export of plan 'llama8b-fsdp8' -> torchrun (torch 2.13 torch/distributed/run.py)
# model Llama-3.1-8B (llama) on 1x8xH100: 8 ranks = dp_replicate 1 x dp_shard 8 x cp 1 x tp 1 x pp 1
# batch: global 64 = micro 2 x dp 8 x grad-accum 4; seq_len 8192; zero 3; recompute full; dtype bf16
# entry script: $MESHPLAN_ENTRY, default examples/train_gpt.py; `meshplan example-trainer examples/train_gpt.py` writes the shipped one there
set -euo pipefail
if [ -z "${MESHPLAN_PLAN:-}" ]; then MESHPLAN_PLAN=plans/llama8b-fsdp8.yaml; fi
export MESHPLAN_PLAN
export MESHPLAN_DP_REPLICATE=1
export MESHPLAN_DP_SHARD=8
export MESHPLAN_TP=1
export MESHPLAN_PP=1
export MESHPLAN_VPP=1
export MESHPLAN_CP=1
export MESHPLAN_EP=1
export MESHPLAN_MICRO_BATCH=2
export MESHPLAN_GLOBAL_BATCH=64
export MESHPLAN_GRAD_ACCUM=4
export MESHPLAN_SEQ_LEN=8192
export MESHPLAN_ZERO_STAGE=3
export MESHPLAN_RECOMPUTE=full
export MESHPLAN_SCHEDULE=1f1b
export MESHPLAN_DTYPE=bf16
torchrun \
  --standalone \
  --nnodes 1 \
  --nproc-per-node 8 \
  "${MESHPLAN_ENTRY:-examples/train_gpt.py}" \
  --plan "$MESHPLAN_PLAN" "$@"
