#!/bin/bash
# meshplan export of plan 'llama70b-tp8pp4' -> Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge v0.3.1)
# model Llama-3.1-70B (llama) on 16x8xH100: 128 ranks = dp_replicate 1 x dp_shard 4 x cp 1 x tp 8 x pp 4, vpp 2
# batch: global 512 = micro 1 x dp 4 x grad-accum 128; seq_len 8192; zero 1; recompute full; dtype bf16
# recipe llama31_70b_pretrain_config: the model from meta-llama/Meta-Llama-3.1-70B's HF config; run_recipe.py is scripts/training/run_recipe.py of the bridge's repository ($BRIDGE_ENTRY)
# Extra overrides (data, optimizer, train.train_iters ...) are passed through: ./this.sh train.train_iters=1000 optimizer.lr=3e-4
# Run this same script on every node; HEAD_NODE = host name of the first node.
set -euo pipefail
: "${HEAD_NODE:?set HEAD_NODE to the host name of the first node}"
if [ -z "${MESHPLAN_JOB_ID:-}" ]; then MESHPLAN_JOB_ID=llama70b-tp8pp4; fi
export MESHPLAN_JOB_ID
export CUDA_DEVICE_MAX_CONNECTIONS=1
RECIPE=llama31_70b_pretrain_config
OVERRIDES=(
  model.tensor_model_parallel_size=8
  model.pipeline_model_parallel_size=4
  model.virtual_pipeline_model_parallel_size=2
  model.pipeline_model_parallel_layout=null
  model.context_parallel_size=1
  model.sequence_parallel=true
  model.seq_length=8192
  dataset.sequence_length=8192
  train.micro_batch_size=1
  train.global_batch_size=512
  model.recompute_granularity=full
  model.recompute_method=uniform
  model.recompute_num_layers=1
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
  comm_overlap.tp_comm_overlap=false
  comm_overlap.overlap_p2p_comm=true
)
torchrun \
  --nnodes 16 \
  --nproc-per-node 8 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$HEAD_NODE:29500" \
  --rdzv-id "$MESHPLAN_JOB_ID" \
  "${BRIDGE_ENTRY:-run_recipe.py}" \
  --recipe "$RECIPE" \
  "${OVERRIDES[@]}" "$@"
