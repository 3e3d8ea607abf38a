#!/bin/bash
# meshplan export of plan 'llama8b-hetero' -> torchrun (torch 2.13 torch/distributed/run.py)
# model Llama-3.1-8B (llama) on 1x8xH100+1x8xA100: 16 ranks = dp_replicate 1 x dp_shard 2 x cp 1 x tp 4 x pp 2
# batch: global 32 = micro 1 x dp 2 x grad-accum 16; seq_len 4096; zero 1; recompute selective; dtype bf16
# entry script: $MESHPLAN_ENTRY, default examples/train_gpt.py; `meshplan example-trainer examples/train_gpt.py` writes the shipped one there
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
if [ -z "${MESHPLAN_PLAN:-}" ]; then MESHPLAN_PLAN=plans/llama8b-hetero.yaml; fi
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
  --node-rank "$NODE_RANK" \
  --master-addr "$HEAD_NODE" \
  --master-port "$MASTER_PORT" \
  "${MESHPLAN_ENTRY:-examples/train_gpt.py}" \
  --plan "$MESHPLAN_PLAN" "$@"
