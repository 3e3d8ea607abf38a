#!/bin/bash
# meshplan export of plan 'dsv3-ep64' -> Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge v0.3.1)
# model DeepSeek-V3 (deepseek_v3) on 32x8xH100: 256 ranks = dp_replicate 1 x dp_shard 128 x cp 1 x tp 2 x pp 1, ep 64
# batch: global 2048 = micro 1 x dp 128 x grad-accum 16; seq_len 4096; zero 1; recompute selective; dtype bf16
# recipe deepseek_v3_pretrain_config: the model from deepseek-ai/DeepSeek-V3's HF config; run_recipe.py is scripts/training/run_recipe.py of the bridge's repository ($BRIDGE_ENTRY)
# Extra overrides (data, optimizer, train.train_iters ...) are passed through: ./this.sh train.train_iters=1000 optimizer.lr=3e-4
# Run this same script on every node; HEAD_NODE = host name of the first node.
set -euo pipefail
: "${HEAD_NODE:?set HEAD_NODE to the host name of the first node}"
if [ -z "${MESHPLAN_JOB_ID:-}" ]; then MESHPLAN_JOB_ID=dsv3-ep64; fi
export MESHPLAN_JOB_ID
export CUDA_DEVICE_MAX_CONNECTIONS=1
RECIPE=deepseek_v3_pretrain_config
OVERRIDES=(
  model.tensor_model_parallel_size=2
  model.pipeline_model_parallel_size=1
  model.virtual_pipeline_model_parallel_size=null
  model.pipeline_model_parallel_layout=null
  model.context_parallel_size=1
  model.sequence_parallel=true
  model.expert_model_parallel_size=64
  model.expert_tensor_parallel_size=2
  model.seq_length=4096
  dataset.sequence_length=4096
  train.micro_batch_size=1
  train.global_batch_size=2048
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
  model.moe_token_dispatcher_type=alltoall
  model.moe_flex_dispatcher_backend=null
  model.overlap_moe_expert_parallel_comm=false
  model.moe_shared_expert_overlap=false
  model.moe_router_fusion=false
  model.moe_expert_capacity_factor=null
  model.moe_pad_expert_input_to_capacity=false
  comm_overlap.tp_comm_overlap=false
  comm_overlap.overlap_moe_expert_parallel_comm=false
  model.mtp_num_layers=null
)
torchrun \
  --nnodes 32 \
  --nproc-per-node 8 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$HEAD_NODE:29500" \
  --rdzv-id "$MESHPLAN_JOB_ID" \
  "${BRIDGE_ENTRY:-run_recipe.py}" \
  --recipe "$RECIPE" \
  "${OVERRIDES[@]}" "$@"
