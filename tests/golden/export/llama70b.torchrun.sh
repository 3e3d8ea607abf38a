#!/bin/bash
# meshplan export of plan 'llama70b-tp8pp4' -> torchrun (torch 2.13 torch/distributed/run.py)
# model Llama-3.1-70B (llama) on 16x8xH100: 128 ranks = dp_replicate 1 x dp_shard 4 x cp 1 x tp 8 x pp 4, vpp 2
# batch: global 512 = micro 1 x dp 4 x grad-accum 128; seq_len 8192; zero 1; recompute full; dtype bf16
# entry script: $MESHPLAN_ENTRY, default examples/train_gpt.py; `meshplan example-trainer examples/train_gpt.py` writes the shipped one there
# Run this same script on every node; HEAD_NODE = host name of the first node.
set -euo pipefail
: "${HEAD_NODE:?set HEAD_NODE to the host name of the first node}"
if [ -z "${MESHPLAN_JOB_ID:-}" ]; then MESHPLAN_JOB_ID=llama70b-tp8pp4; fi
export MESHPLAN_JOB_ID
if [ -z "${MESHPLAN_PLAN:-}" ]; then MESHPLAN_PLAN=plans/llama70b-tp8pp4.yaml; fi
export MESHPLAN_PLAN
export MESHPLAN_DP_REPLICATE=1
export MESHPLAN_DP_SHARD=4
export MESHPLAN_TP=8
export MESHPLAN_PP=4
export MESHPLAN_VPP=2
export MESHPLAN_CP=1
export MESHPLAN_EP=1
export MESHPLAN_MICRO_BATCH=1
export MESHPLAN_GLOBAL_BATCH=512
export MESHPLAN_GRAD_ACCUM=128
export MESHPLAN_SEQ_LEN=8192
export MESHPLAN_ZERO_STAGE=1
export MESHPLAN_RECOMPUTE=full
export MESHPLAN_SCHEDULE=interleaved
export MESHPLAN_DTYPE=bf16
torchrun \
  --nnodes 16 \
  --nproc-per-node 8 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$HEAD_NODE:29500" \
  --rdzv-id "$MESHPLAN_JOB_ID" \
  "${MESHPLAN_ENTRY:-examples/train_gpt.py}" \
  --plan "$MESHPLAN_PLAN" "$@"
