#!/bin/bash
# meshplan export of plan 'llama8b-mixed' -> torchrun (torch 2.13 torch/distributed/run.py)
# model Llama-3.1-8B (llama) on 2x8xH100: 16 ranks = dp_replicate 1 x dp_shard 2 x cp 1 x tp 4 x pp 2
# batch: global 32 = micro 1 x dp 2 x grad-accum 16; seq_len 4096; zero 1; recompute selective; dtype bf16
# entry script: $MESHPLAN_ENTRY, default examples/train_gpt.py; `meshplan example-trainer examples/train_gpt.py` writes the shipped one there
# Run this same script on every node; HEAD_NODE = host name of the first node.
set -euo pipefail
: "${HEAD_NODE:?set HEAD_NODE to the host name of the first node}"
if [ -z "${MESHPLAN_JOB_ID:-}" ]; then MESHPLAN_JOB_ID=llama8b-mixed; fi
export MESHPLAN_JOB_ID
if [ -z "${MESHPLAN_PLAN:-}" ]; then MESHPLAN_PLAN=plans/llama8b-mixed.yaml; fi
export MESHPLAN_PLAN
export MESHPLAN_DP_REPLICATE=1
export MESHPLAN_DP_SHARD=2
export MESHPLAN_TP=4
export MESHPLAN_PP=2
export MESHPLAN_VPP=1
export MESHPLAN_CP=1
export MESHPLAN_EP=1
export MESHPLAN_MICRO_BATCH=1
export MESHPLAN_GLOBAL_BATCH=32
export MESHPLAN_GRAD_ACCUM=16
export MESHPLAN_SEQ_LEN=4096
export MESHPLAN_ZERO_STAGE=1
export MESHPLAN_RECOMPUTE=selective
export MESHPLAN_SCHEDULE=1f1b
export MESHPLAN_DTYPE=bf16
torchrun \
  --nnodes 2 \
  --nproc-per-node 8 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$HEAD_NODE:29500" \
  --rdzv-id "$MESHPLAN_JOB_ID" \
  "${MESHPLAN_ENTRY:-examples/train_gpt.py}" \
  --plan "$MESHPLAN_PLAN" "$@"
