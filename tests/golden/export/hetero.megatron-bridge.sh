#!/bin/bash
# meshplan export of plan 'llama8b-hetero' -> Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge v0.3.1)
# model Llama-3.1-8B (llama) on 1x8xH100+1x8xA100: 16 ranks = dp_replicate 1 x dp_shard 2 x cp 1 x tp 4 x pp 2
# batch: global 32 = micro 1 x dp 2 x grad-accum 16; seq_len 4096; zero 1; recompute selective; dtype bf16
# recipe llama31_8b_pretrain_config: the model from meta-llama/Meta-Llama-3.1-8B's HF config; run_recipe.py is scripts/training/run_recipe.py of the bridge's repository ($BRIDGE_ENTRY)
# Extra overrides (data, optimizer, train.train_iters ...) are passed through: ./this.sh train.train_iters=1000 optimizer.lr=3e-4
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
RECIPE=llama31_8b_pretrain_config
OVERRIDES=(
  model.tensor_model_parallel_size=4
  model.pipeline_model_parallel_size=2
  model.virtual_pipeline_model_parallel_size=null
  'model.pipeline_model_parallel_layout="Et*20|t*12L"'
  model.context_parallel_size=1
  model.sequence_parallel=true
  model.seq_length=4096
  dataset.sequence_length=4096
  train.micro_batch_size=1
  train.global_batch_size=32
  model.recompute_granularity=selective
  model.recompute_method=null
  model.recompute_num_layers=null
  ddp.use_distributed_optimizer=true
  optimizer.use_distributed_optimizer=true
  ddp.use_megatron_fsdp=false
  dist.use_torch_fsdp2=false
  ddp.data_parallel_sharding_strategy=no_shard
  checkpoint.ckpt_format=torch_dist
  ddp.overlap_grad_reduce=true
  ddp.overlap_param_gather=true
  ddp.num_distributed_optimizer_instances=1
  optimizer.use_precision_aware_optimizer=false
  mixed_precision=bf16_mixed
  model.tp_comm_overlap=false
)
torchrun \
  --nnodes 2 \
  --nproc-per-node 8 \
  --node-rank "$NODE_RANK" \
  --master-addr "$HEAD_NODE" \
  --master-port "$MASTER_PORT" \
  "${BRIDGE_ENTRY:-run_recipe.py}" \
  --recipe "$RECIPE" \
  "${OVERRIDES[@]}" "$@"
