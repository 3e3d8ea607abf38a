#!/bin/bash
# meshplan export of plan 'llama8b-fsdp8' -> Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge v0.3.1)
# model Llama-3.1-8B (llama) on 1x8xH100: 8 ranks = dp_replicate 1 x dp_shard 8 x cp 1 x tp 1 x pp 1
# batch: global 64 = micro 2 x dp 8 x grad-accum 4; seq_len 8192; zero 3; recompute full; dtype bf16
# recipe llama31_8b_pretrain_config: the model from meta-llama/Meta-Llama-3.1-8B's HF config; run_recipe.py is scripts/training/run_recipe.py of the bridge's repository ($BRIDGE_ENTRY)
# Extra overrides (data, optimizer, train.train_iters ...) are passed through: ./this.sh train.train_iters=1000 optimizer.lr=3e-4
set -euo pipefail
RECIPE=llama31_8b_pretrain_config
OVERRIDES=(
  model.tensor_model_parallel_size=1
  model.pipeline_model_parallel_size=1
  model.virtual_pipeline_model_parallel_size=null
  model.pipeline_model_parallel_layout=null
  model.context_parallel_size=1
  model.sequence_parallel=false
  model.seq_length=8192
  dataset.sequence_length=8192
  train.micro_batch_size=2
  train.global_batch_size=64
  model.recompute_granularity=full
  model.recompute_method=uniform
  model.recompute_num_layers=1
  ddp.use_distributed_optimizer=false
  optimizer.use_distributed_optimizer=false
  ddp.use_megatron_fsdp=true
  dist.use_torch_fsdp2=false
  ddp.data_parallel_sharding_strategy=optim_grads_params
  checkpoint.ckpt_format=fsdp_dtensor
  ddp.overlap_grad_reduce=true
  ddp.overlap_param_gather=true
  ddp.num_distributed_optimizer_instances=1
  optimizer.use_precision_aware_optimizer=false
  mixed_precision=bf16_mixed
  model.tp_comm_overlap=false
)
torchrun \
  --standalone \
  --nnodes 1 \
  --nproc-per-node 8 \
  "${BRIDGE_ENTRY:-run_recipe.py}" \
  --recipe "$RECIPE" \
  "${OVERRIDES[@]}" "$@"
