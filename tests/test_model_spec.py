"""ModelSpec / load_model: exact parameter counts against published or independently derived golden values."""
from __future__ import annotations

import json

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.model.config import list_presets, load_model
from meshplan.planner.model.spec import ModelSpec
from tests.helpers import data_path

# Golden totals and active counts: shared/model_configs/PROVENANCE.md ("Sanity numbers"), which cross-checks them
# against the published totals (Llama-3.1-8B "8.03B", Mixtral "46.7B / 12.9B active", DeepSeek-V3 "671B / 37B").
GOLDEN = {
    "gpt2.json": (124_439_808, None),
    "gpt2-large.json": (774_030_080, None),
    "llama-3.1-8b-instruct.json": (8_030_261_248, None),
    "llama-3.1-70b-instruct.json": (70_553_706_496, None),
    "mistral-7b-instruct-v0.3.json": (7_248_023_552, None),
    "qwen2.5-7b.json": (7_615_616_512, None),
    "qwen2.5-7b-instruct.json": (7_615_616_512, None),
    "qwen3-8b.json": (8_190_735_360, None),
    "mixtral-8x7b-v0.1.json": (46_702_792_704, 12_879_925_248),
    "qwen3-30b-a3b.json": (30_532_122_624, 3_353_032_704),
    "deepseek-v3.json": (671_026_419_200, 37_552_282_624),
}


@pytest.mark.parametrize("filename", sorted(GOLDEN))
def test_golden_param_count_from_shared_config(filename):
    total, active = GOLDEN[filename]
    spec = load_model(str(data_path("model_configs", filename)))
    assert spec.num_params == total
    assert spec.active_params == (total if active is None else active)
    # Per-layer pieces add up to the total.
    layers = sum(spec.layer_params(i) for i in range(spec.num_layers))
    assert spec.embedding_params + layers + spec.final_norm_params + spec.lm_head_params == total


def test_deepseek_v3_activated_excluding_embedding_matches_report():
    # DeepSeek-V3 technical report (arXiv:2412.19437) abstract: "671B total parameters with 37B activated";
    # PROVENANCE.md: 36,625,603,584 activated excluding the input embedding (the report's "36.6B").
    spec = load_model(str(data_path("model_configs", "deepseek-v3.json")))
    assert spec.active_params - spec.embedding_params == 36_625_603_584
    assert spec.moe_layers == tuple(range(3, 61))  # first_k_dense_replace = 3
    assert spec.ffn_hidden_size == 18432 and spec.head_dim == 192 and spec.v_head_dim == 128
    assert spec.config_mtp_layers == 1 and spec.num_mtp_layers == 0  # MTP off by default


def test_deepseek_v3_with_mtp_matches_hub_size():
    # deepseek-ai/DeepSeek-V3 README: the Hugging Face checkpoint is "685B": 671B main model + the MTP module,
    # whose checkpoint carries its own copies of the embedding and the output head (2*V*h).
    base = load_model(str(data_path("model_configs", "deepseek-v3.json")))
    spec = load_model(str(data_path("model_configs", "deepseek-v3.json")), mtp=True)
    assert spec.num_mtp_layers == 1
    hub_total = spec.num_params + 2 * spec.vocab_size * spec.hidden_size
    assert abs(hub_total - 685e9) / 685e9 < 0.005
    assert spec.num_params - base.num_params > 11e9  # one MoE layer + eh_proj


def test_gpt2_traps_tied_and_n_inner_default():
    # gpt2-large.json omits n_inner and tie_word_embeddings: class defaults 4h and tied (models.md §2).
    spec = load_model(str(data_path("model_configs", "gpt2-large.json")))
    assert spec.tied_embeddings and spec.lm_head_params == 0
    assert spec.ffn_hidden_size == 4 * 1280
    assert spec.position_embeddings == 1024 and spec.norm == "layernorm" and not spec.gated_mlp


def test_qwen3_head_dim_and_kv_class_defaults(tmp_path):
    # Qwen3 class defaults (transformers configuration_qwen3.py): head_dim 128, num_key_value_heads 32.
    cfg = json.loads(data_path("model_configs", "qwen3-8b.json").read_text())
    del cfg["head_dim"], cfg["num_key_value_heads"]
    path = tmp_path / "qwen3.json"
    path.write_text(json.dumps(cfg))
    spec = load_model(str(path))
    assert spec.head_dim == 128 and spec.num_kv_heads == 32
    # 8 -> 32 KV heads adds 2 * h * (32-8) * 128 per layer to k/v projections, 36 layers.
    assert spec.num_params - 8_190_735_360 == 36 * 2 * 4096 * 24 * 128


def test_llama_missing_kv_heads_means_mha(tmp_path):
    cfg = json.loads(data_path("model_configs", "llama-3.1-8b-instruct.json").read_text())
    del cfg["num_key_value_heads"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert load_model(str(tmp_path)).num_kv_heads == 32  # folder holding config.json works too


def test_transformers_v5_spellings_give_same_spec(tmp_path):
    cfg = json.loads(data_path("model_configs", "llama-3.1-8b-instruct.json").read_text())
    v5 = dict(cfg)
    v5["rope_parameters"] = dict(v5.pop("rope_scaling"), rope_theta=v5.pop("rope_theta"))
    v5["dtype"] = v5.pop("torch_dtype")
    path = tmp_path / "v5.json"
    path.write_text(json.dumps(v5))
    old, new = load_model(str(data_path("model_configs", "llama-3.1-8b-instruct.json"))), load_model(str(path))
    assert new.num_params == old.num_params == 8_030_261_248
    assert new.rope_theta == old.rope_theta == 500000.0
    assert new.dtype == old.dtype == "bfloat16"


def test_family_from_architectures_when_model_type_missing(tmp_path):
    cfg = json.loads(data_path("model_configs", "mistral-7b-instruct-v0.3.json").read_text())
    del cfg["model_type"]
    path = tmp_path / "m.json"
    path.write_text(json.dumps(cfg))
    spec = load_model(str(path))
    assert spec.model_type == "mistral" and spec.num_params == 7_248_023_552
    assert spec.max_position_embeddings == 32768  # max_length: 20 in this to_dict() dump is ignored


def test_gpt_neox_20b_matches_paper():
    # Black et al. 2022, "GPT-NeoX-20B" Table 1 / §2: 20,554,567,680 parameters.
    spec = load_model("gpt-neox-20b")
    assert spec.num_params == 20_554_567_680
    assert not spec.tied_embeddings and spec.num_kv_heads == 64


def test_nemotron_4_reads_a_two_matrix_mlp_with_query_groups(tmp_path):
    # nvidia/Nemotron-4-340B-Base's model card: "This model has 340 billion parameters"; its MLP is squared-ReLU (two
    # matrices of 4 x hidden) and its attention has 8 query groups (NeMo-Framework-Launcher nemotron_340b.yaml @ 24.07)
    spec = load_model("nemotron-4-340b")
    assert not spec.gated_mlp and spec.num_kv_heads == 8 and spec.ffn_hidden_size == 4 * spec.hidden_size
    assert spec.num_params == pytest.approx(340e9, rel=0.01) and not spec.tied_embeddings
    cfg = {"model_type": "nemotron", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 256, "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    small = load_model(str(tmp_path / "config.json"))
    assert small.num_kv_heads == 4 and small.head_dim == 16  # no num_key_value_heads: every head its own
    # two 64 x 256 matrices a layer, attention 4 x 64 x 64, two LayerNorms with bias, final norm, untied embeddings
    assert small.num_params == 2 * (2 * 64 * 256 + 4 * 64 * 64 + 2 * 2 * 64) + 2 * 64 + 2 * 100 * 64


def test_qwen2_moe_counts_shared_expert_and_gate():
    # Qwen/Qwen1.5-MoE-A2.7B (config values below, from its config.json): the model card states "14.3B parameters
    # in total and 2.7B activated parameters during runtime". Both within 1%.
    cfg = {"model_type": "qwen2_moe", "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
           "num_key_value_heads": 16, "intermediate_size": 5632, "moe_intermediate_size": 1408,
           "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
           "decoder_sparse_step": 1, "vocab_size": 151936, "tie_word_embeddings": False,
           "max_position_embeddings": 8192}
    from meshplan.planner.model.config import spec_from_config

    spec = spec_from_config(cfg, where="qwen1.5-moe", name="qwen1.5-moe-a2.7b", source="test")
    assert abs(spec.num_params - 14.3e9) / 14.3e9 < 0.01
    assert abs(spec.active_params - 2.7e9) / 2.7e9 < 0.01
    assert spec.moe_layers == tuple(range(24)) and spec.ffn_hidden_size == 0
    assert spec.shared_expert_gate and spec.num_shared_experts == 1 and spec.qkv_bias


def test_qwen3_moe_dense_layers_from_mlp_only_layers_and_sparse_step(tmp_path):
    # modeling_qwen3_moe.py: layer i is sparse iff i not in mlp_only_layers and (i+1) % decoder_sparse_step == 0;
    # a dense layer uses intermediate_size (6144) instead of 128 experts of 768 plus the router.
    cfg = json.loads(data_path("model_configs", "qwen3-30b-a3b.json").read_text())
    h = 2048
    moe_minus_dense = (128 * 3 * h * 768 + h * 128) - 3 * h * 6144
    for changes, dense_layers in [({"mlp_only_layers": [0, 47]}, [0, 47]),
                                  ({"decoder_sparse_step": 2}, list(range(0, 48, 2)))]:
        path = tmp_path / "q.json"
        path.write_text(json.dumps(dict(cfg, **changes)))
        spec = load_model(str(path))
        assert [i for i in range(48) if not spec.is_moe_layer(i)] == dense_layers
        assert spec.ffn_hidden_size == 6144
        assert 30_532_122_624 - spec.num_params == len(dense_layers) * moe_minus_dense


def test_layer_breakdown_mixtral():
    spec = load_model(str(data_path("model_configs", "mixtral-8x7b-v0.1.json")))
    h, f = 4096, 14336
    assert spec.ffn_hidden_size == 0 and spec.moe_ffn_hidden_size == f
    assert all(spec.is_moe_layer(i) for i in range(32))
    assert spec.layer_routed_expert_params(0) == 8 * 3 * h * f
    assert spec.layer_mlp_params(0) == 8 * 3 * h * f + h * 8  # + router
    assert spec.layer_attention_params(0) == h * h * 2 + 2 * h * 1024
    assert spec.layer_params(0) - spec.layer_active_params(0) == 6 * 3 * h * f
    with pytest.raises(IndexError):
        spec.is_moe_layer(32)


def test_aliases_and_presets():
    assert load_model("llama-3.1-8b").name == "llama-3.1-8b-instruct"
    assert load_model("Meta-Llama/Llama-3.1-70B-Instruct").num_params == 70_553_706_496
    assert load_model("mixtral-8x7b").source == "mixtral-8x7b-v0.1"
    names = {p["name"] for p in list_presets()}
    assert {"qwen2.5-7b", "mistral-7b-instruct-v0.3", "deepseek-v3", "qwen3-30b-a3b", "gpt3-175b",
            "gpt-neox-20b", "megatron-gpt-1t"} <= names
    spec = load_model("deepseek-v3")
    assert load_model(spec.source) == spec  # source round-trips through load_model
    d = spec.to_dict()
    assert d["num_params"] == 671_026_419_200 and d["moe_layers"][0] == 3
    json.dumps(d)


def test_preset_copies_match_shared_files():
    from meshplan.planner.model.config import PRESET_DIR

    for filename in GOLDEN:
        assert (PRESET_DIR / filename).read_bytes() == data_path("model_configs", filename).read_bytes()


def test_gpt3_175b():
    # Brown et al. 2020, Table 2.1: "GPT-3 175B", n_layers 96, d_model 12288, n_heads 96; paper's 175.0B is rounded.
    spec = load_model("gpt3-175b")
    assert abs(spec.num_params - 174.6e9) < 0.05e9


# Narayanan et al. SC'21 ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"),
# Table 1, column "Number of parameters (billion)"; shapes also in NVIDIA/Megatron-LM
# examples/sc21/run_table_1.sh. The table prints one decimal.
TABLE1_BILLION = {"1.7b": 1.7, "3.6b": 3.6, "7.5b": 7.5, "18b": 18.4, "39b": 39.1, "76b": 76.1, "145b": 145.6,
                  "310b": 310.1, "530b": 529.6, "1t": 1008.0}


@pytest.mark.parametrize("size", sorted(TABLE1_BILLION))
def test_megatron_table1_param_counts(size):
    spec = load_model(f"megatron-gpt-{size}")
    paper = TABLE1_BILLION[size] * 1e9
    # Within 1%, or within the table's rounding (0.05B) for the two smallest rows (1.652B prints as 1.7).
    assert abs(spec.num_params - paper) <= max(0.01 * paper, 0.05e9)
    # The paper's own formula P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) omits only the final LayerNorm (2h).
    h, l, V, s = spec.hidden_size, spec.num_layers, spec.vocab_size, 2048
    assert spec.num_params - 2 * h == round(12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h)))


# ---- bad input ---------------------------------------------------------------------------------------------
def test_malformed_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"model_type": "llama", "hidden_size": 4096,,}')
    with pytest.raises(MeshplanError, match=r"bad\.json: malformed JSON at line 1"):
        load_model(str(path))


def test_unknown_model_type_names_file_and_supported(tmp_path):
    path = tmp_path / "t5.json"
    path.write_text(json.dumps({"model_type": "t5", "d_model": 512}))
    with pytest.raises(MeshplanError, match=r"t5\.json: unknown model_type 't5'; supported: llama, mistral"):
        load_model(str(path))


@pytest.mark.parametrize("cfg, said", [
    ({}, "no 'model_type' and no 'architectures'"),
    ({"architectures": ["FooForCausalLM"]},
     "no 'model_type' and its 'architectures' \\['FooForCausalLM'\\] names none"),
])
def test_a_config_without_model_type_says_what_it_lacks(tmp_path, cfg, said):
    path = tmp_path / "anon.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(MeshplanError, match=rf"anon\.json: {said}.*supported model types: llama"):
        load_model(str(path))


def test_missing_required_field(tmp_path):
    cfg = json.loads(data_path("model_configs", "qwen3-30b-a3b.json").read_text())
    del cfg["moe_intermediate_size"]
    path = tmp_path / "q.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(MeshplanError, match="missing required field 'moe_intermediate_size'"):
        load_model(str(path))


def test_invalid_values(tmp_path):
    cfg = json.loads(data_path("model_configs", "llama-3.1-8b-instruct.json").read_text())
    for key, value, msg in [("hidden_size", -1, "'hidden_size' must be an integer >= 1, got -1"),
                            ("num_key_value_heads", 5, "not a multiple of num_key_value_heads 5"),
                            ("tie_word_embeddings", "yes", "'tie_word_embeddings' must be true or false")]:
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps(dict(cfg, **{key: value})))
        with pytest.raises(MeshplanError, match=msg):
            load_model(str(path))
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(MeshplanError, match="expected a JSON object"):
        load_model(str(path))


def test_file_not_found_and_unknown_name(tmp_path):
    with pytest.raises(MeshplanError, match=r"nope\.json: file not found"):
        load_model(str(tmp_path / "nope.json"))
    with pytest.raises(MeshplanError, match="llama-9b: unknown model"):
        load_model("llama-9b")


def test_direct_construction_validates():
    with pytest.raises(MeshplanError, match="num_heads 32 is not a multiple of num_kv_heads 5"):
        ModelSpec(name="x", source="x", model_type="llama", hidden_size=4096, num_layers=2, num_heads=32,
                  num_kv_heads=5, head_dim=128, v_head_dim=128, ffn_hidden_size=1, vocab_size=10,
                  tied_embeddings=False, gated_mlp=True, norm="rmsnorm")
