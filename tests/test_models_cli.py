"""``meshplan models`` through typer's CliRunner."""
from __future__ import annotations

import json

from meshplan.cli.main import app
from tests.helpers import data_path


def test_models_table_lists_presets(runner):
    res = runner.invoke(app, ["models"], env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    for name in ("llama-3.1-8b-instruct", "deepseek-v3", "megatron-gpt-1t", "gpt3-175b", "gpt-neox-20b"):
        assert name in res.output
    assert "671.03B" in res.output and "37.55B" in res.output  # DeepSeek-V3 total and active


def test_models_json(runner):
    res = runner.invoke(app, ["models", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert rows["mixtral-8x7b-v0.1"]["num_params"] == 46_702_792_704  # shared/model_configs/PROVENANCE.md
    assert rows["mixtral-8x7b-v0.1"]["active_params"] == 12_879_925_248
    assert rows["qwen3-30b-a3b"]["model_type"] == "qwen3_moe"
    assert "mixtral-8x7b" in rows["mixtral-8x7b-v0.1"]["aliases"]


def test_models_show_alias_json_with_flops(runner):
    res = runner.invoke(app, ["models", "show", "llama-3.1-8b", "--json", "--seq-len", "8192"])
    assert res.exit_code == 0, res.output
    spec = json.loads(res.stdout)
    assert spec["num_params"] == 8_030_261_248 and spec["num_kv_heads"] == 8
    assert abs(spec["model_flops_per_token"] - 51.47e9) < 0.005e9  # models.md §4.4


def test_models_show_file_table(runner):
    res = runner.invoke(app, ["models", "show", str(data_path("model_configs", "gpt2.json"))],
                        env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    assert "124,439,808" in res.output  # GPT-2 golden count


def test_models_show_mtp(runner):
    res = runner.invoke(app, ["models", "show", "deepseek-v3", "--mtp", "--json"])
    assert res.exit_code == 0, res.output
    spec = json.loads(res.stdout)
    assert spec["num_mtp_layers"] == 1 and spec["num_params"] > 671_026_419_200 + 11e9


def _one_line_error(res, *fragments):
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in res.output, err
    for fragment in fragments:
        assert fragment in err, err


def test_bad_inputs_exit_2_one_line(runner, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    _one_line_error(runner.invoke(app, ["models", "show", str(bad)]), "bad.json", "malformed JSON")

    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    _one_line_error(runner.invoke(app, ["models", "show", str(unknown)]), "unknown.json", "unknown model_type 'bert'",
                    "gpt_neox")

    missing = tmp_path / "missing.json"
    cfg = json.loads(data_path("model_configs", "llama-3.1-8b-instruct.json").read_text())
    del cfg["num_hidden_layers"]
    missing.write_text(json.dumps(cfg))
    _one_line_error(runner.invoke(app, ["models", "show", str(missing)]), "missing.json",
                    "missing required field 'num_hidden_layers'")

    _one_line_error(runner.invoke(app, ["models", "show", str(tmp_path / "absent.json")]), "absent.json",
                    "file not found")
    _one_line_error(runner.invoke(app, ["models", "show", "no-such-model"]), "no-such-model", "unknown model")
