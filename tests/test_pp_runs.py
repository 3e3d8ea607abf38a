"""Pipeline schedule runs per step (``pp_runs``) and FSDP under torch.distributed.pipelining.

Truths the estimator does not compute itself: a schedule run is a whole 1F1B / interleaved schedule, so each run
pays the fill-and-drain bubble of Narayanan et al. 2021, (p - 1) / v micro-batch times (the formula
tests/test_schedules.py checks); torch's ``PipelineStage.backward_maybe_with_nosync`` (torch/distributed/pipelining/
stage.py) keeps an FSDP stage gathered with its gradients unreduced until a chunk's last backward of the run, so
the data-parallel traffic of a pipelined FSDP stage is one all-gather and one reduce-scatter per run, whatever the
number of micro-batches, where an unpipelined FSDP2 model gathers twice and reduce-scatters on every micro-batch.
"""
from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.space import parse_fix
from meshplan.planner.model.config import load_model

MODEL, CLUSTER, SEQ = "llama-3.1-70b", "8x8xH100", 4096


def _estimate(layout: Layout, global_batch: int):
    work = Workload(load_model(MODEL), load_cluster(CLUSTER), global_batch, SEQ, "bf16")
    m = work.model
    layout.validate(world_size=work.cluster.world_size, num_layers=m.num_layers, num_heads=m.num_heads,
                    num_kv_heads=m.num_kv_heads, seq_len=SEQ, global_batch=global_batch)
    return estimator_for(work.cluster).estimate(work, layout)


def _fsdp_pp(**kw) -> Layout:
    return Layout(dp_shard=16, pp=4, micro_batch=1, zero_stage=3, recompute="full", **kw)


def test_each_schedule_run_pays_its_own_bubble():
    one, four = _estimate(_fsdp_pp(), 128), _estimate(_fsdp_pp(pp_runs=4), 128)
    assert four.bubble_s == pytest.approx(4 * one.bubble_s)
    assert four.compute_s == pytest.approx(one.compute_s)  # the same micro-batches on the same stages


def test_pipelined_fsdp_syncs_once_per_run_not_per_micro_batch():
    """Step time less the micro-batches' own time and the bubble = the data-parallel cost: the same at 8 or 32
    micro-batches for a pipelined FSDP2 stage (one gather + reduce-scatter per run); it grows with the micro-batches
    without pipelining (gathered in forward and backward, reduce-scattered, each micro-batch), unless hidden."""
    def sync(est):
        return est.step_time_s - est.pipeline_s - est.bubble_s - est.other_s

    few, many = _estimate(_fsdp_pp(fsdp="torch"), 128), _estimate(_fsdp_pp(fsdp="torch"), 512)  # 8 and 32 per step
    assert sync(many) == pytest.approx(sync(few), rel=1e-6)
    runs = _estimate(_fsdp_pp(pp_runs=4, fsdp="torch"), 512)  # four runs: four reduce-scatters ending a run
    assert sync(runs) == pytest.approx(4 * sync(few), rel=1e-6)
    flat = [Layout(dp_shard=64, micro_batch=1, zero_stage=3, recompute="full") for _ in range(2)]
    assert sync(_estimate(flat[1], 512)) > 3 * sync(_estimate(flat[0], 128))  # per micro-batch: 4x of them


def test_every_chunks_reduce_scatter_stands_in_the_compute_streams_way():
    """The installed torch's own code: a pipelined FSDP2 stage's post-backward ends in
    ``_root_post_backward_final_callback`` with ``is_last_backward`` set, whose branch makes the compute stream wait
    on the reduce-scatter's event, once per chunk; so interleaving (v chunks per rank) hides none of a run's
    reduce-scatter behind the other chunks' backward, and the step's data-parallel cost does not fall with v.
    Megatron-FSDP under Megatron-Core's schedules exchanges per micro-batch, pipelined or not (the installed
    megatron-core's ``MegatronFSDP``: its post-forward hook releases a module's parameters, its post-backward
    reduce-scatters on every backward for ``optim_grads_params``): its cost does not move with v either, and a
    pipelined stage pays more than FSDP2's once-per-run exchange."""
    import inspect

    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    from torch.distributed.pipelining import stage

    post = inspect.getsource(stage._PipelineStageBase)
    assert "set_is_last_backward(True)" in post and "_root_post_backward_final_callback()" in post
    final = inspect.getsource(FSDPState._root_post_backward_final_callback)
    branch = final[final.rindex("if self._state_ctx.is_last_backward:"):]  # the last: the step's, after the loop
    assert "post_forward_order.clear()" in branch and "current_stream().wait_event(" in branch

    def sync(est):
        return est.step_time_s - est.pipeline_s - est.bubble_s - est.other_s

    def by_chunks(fsdp):
        return [sync(_estimate(_fsdp_pp(vpp=v, pipeline_schedule="interleaved" if v > 1 else "", fsdp=fsdp), 128))
                for v in (1, 4)]

    one, four = by_chunks("torch")
    assert four >= one * (1 - 1e-6)
    fsdp = pytest.importorskip("megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp")
    src = inspect.getsource(fsdp.MegatronFSDP)
    post_forward = src[src.index("def _post_forward"):src.index("def _release_module_fp8_transpose_cache")]
    assert "release_module_parameters(module, bwd=False" in post_forward
    every = src[src.index("grad_reduce_every_bprop = "):]
    assert '"optim_grads_params"' in every[:every.index("]")]
    m_one, m_four = by_chunks("megatron")
    assert m_four == pytest.approx(m_one, rel=1e-6) and m_one > one


def test_pp_runs_is_a_fix_decision_that_must_split_the_micro_batches():
    assert parse_fix("pp_runs=4").pp_runs == 4
    with pytest.raises(MeshplanError, match="must divide the 8 micro-batches"):
        _estimate(_fsdp_pp(pp_runs=3), 128)
    with pytest.raises(MeshplanError, match="needs pipeline parallelism"):
        _estimate(Layout(dp_shard=64, micro_batch=1, zero_stage=3, recompute="full", pp_runs=2), 128)


def test_a_plan_keeps_pp_runs_and_the_exports_say_they_run_one_schedule(runner, tmp_path):
    from meshplan.cli.main import app
    from meshplan.planner.plan.schema import load_plan

    out = tmp_path / "p.yaml"
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", CLUSTER, "--global-batch", "128",
                            "--seq-len", str(SEQ), "--fix", "dp=16,tp=1,pp=4,mbs=1,zero=3,recompute=full,pp_runs=2",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert load_plan(out).pp_runs == 2
    r = runner.invoke(app, ["export", str(out), "--to", "torchtitan", "--json"])
    assert r.exit_code == 0, r.output
    assert any("pp_runs=2" in w for w in __import__("json").loads(r.stdout)["warnings"])


def test_a_pipelined_fsdp_stage_holds_its_whole_weights_and_gradients_over_a_run():
    """PipelineStage.backward_maybe_with_nosync: no reshard after backward and no gradient sync until the run's
    last backward, so an FSDP2 stage's gathered weights and unreduced gradients sit beside their 1/16 shards; the
    optimizer states stay sharded. Without pipelining FSDP2 holds the shards only (ZeRO-3), and so does
    Megatron-FSDP under Megatron-Core's schedules, which reduce-scatters on every backward when it shards gradients
    (the installed megatron-core's ``MegatronFSDP``: ``grad_reduce_every_bprop`` for ``optim_grads_params``)."""
    import inspect

    from meshplan.planner.estimate.memory import PARAM_BYTES, grad_bytes_per_param, model_state_bytes

    n, d = 1e9, 16
    flat = Layout(dp_shard=d, micro_batch=1, zero_stage=3, fsdp="torch")
    piped = Layout(dp_shard=d, pp=4, micro_batch=1, zero_stage=3, fsdp="torch")
    g = grad_bytes_per_param(piped, "bf16")
    w0, g0, o0 = model_state_bytes(n, 0, flat)
    w1, g1, o1 = model_state_bytes(n, 0, piped)
    assert (w0, g0) == pytest.approx((n * PARAM_BYTES / d, n * g / d))
    assert (w1, g1) == pytest.approx((n * PARAM_BYTES * (1 + 1 / d), n * g * (1 + 1 / d)))
    assert o1 == pytest.approx(o0)
    fsdp = pytest.importorskip("megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp")
    src = inspect.getsource(fsdp.MegatronFSDP)
    every = src[src.index("grad_reduce_every_bprop = "):]
    assert '"optim_grads_params"' in every[:every.index("]")]
    megatron = Layout(dp_shard=d, pp=4, micro_batch=1, zero_stage=3, fsdp="megatron")
    assert model_state_bytes(n, 0, megatron) == pytest.approx((w0, g0, o0))
