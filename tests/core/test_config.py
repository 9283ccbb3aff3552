"""ModelConfig: presets build with the published parameter counts; bad configs fail with one clear line."""

import json
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tformer.core.config import ModelConfig, preset, preset_names
from tformer.core.errors import TformerError
from tformer.model import build
from tformer.model.runners import runner_for

REQUIRED_PRESETS = {"vaswani-base", "vaswani-big", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-base",
                    "bert-large", "t5-small", "t5-base", "bart-base", "llama-7b", "llama-13b", "llama-70b",
                    "gpt3-175b", "char-small"}

# Published sizes: GPT-2 124M (tied head), BERT-base BertModel with pooler, LLaMA-7B, the course's char model.
KNOWN_PARAMS = {"gpt2": 124_439_808, "bert-base": 109_482_240, "llama-7b": 6_738_415_616, "char-small": 3_208_960}


def test_all_required_presets_exist():
    assert REQUIRED_PRESETS <= set(preset_names())


@pytest.mark.parametrize("name", sorted(REQUIRED_PRESETS))
def test_preset_builds_on_meta_and_counts_parameters(name):
    config = preset(name)
    model = build(config, device="meta")
    unique = {id(p): p.numel() for p in model.parameters()}
    assert model.num_parameters() == sum(unique.values()) > 0
    if name in KNOWN_PARAMS:
        assert model.num_parameters() == KNOWN_PARAMS[name]


def test_tied_head_is_one_tensor():
    model = build(preset("char-small"))
    assert model.lm_head.weight is model.tok_embed.weight
    untied = build(preset("char-small", tied_embeddings=False))
    assert untied.num_parameters() == model.num_parameters() + 65 * 256


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(d_model=100, n_heads=3), "d_model=100 is not divisible by n_heads=3"),
        (dict(n_heads=8, n_kv_heads=3, d_model=64), "n_kv_heads=3 does not divide n_heads=8"),
        (dict(n_layers=-1), "n_layers must be positive"),
        (dict(d_ff=0), "d_ff must be positive"),
        (dict(position="rotary"), "position='rotary' is unknown"),
        (dict(arch="gpt"), "arch='gpt' is unknown"),
        (dict(norm="batchnorm"), "norm='batchnorm' is unknown"),
        (dict(activation="tanh"), "activation='tanh' is unknown"),
        (dict(dropout=1.5), "dropout must be in [0, 1)"),
        (dict(n_layers=2.5), "n_layers must be a whole number"),
        (dict(position="rope", d_model=36, n_heads=4), "head_dim must be even"),
        (dict(arch="decoder", n_decoder_layers=3), "n_decoder_layers only applies"),
        (dict(arch="decoder", lm_head=False), "needs its LM head"),
    ],
)
def test_bad_configs_fail_with_a_clear_message(changes, message):
    with pytest.raises(TformerError) as info:
        ModelConfig.from_dict({**preset("char-small").to_dict(), **changes})
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(TformerError, match="did you mean 'n_heads'"):
        ModelConfig.from_dict({"n_head": 4})


def test_unknown_preset_suggests_a_near_name():
    with pytest.raises(TformerError, match="did you mean 'gpt2'"):
        preset("gtp2")


def test_overrides_parse_values_and_validate():
    config = preset("char-small").with_overrides(["n_layers=8", "position=rope", "dropout=0.1"])
    assert (config.n_layers, config.position, config.dropout) == (8, "rope", 0.1)
    with pytest.raises(TformerError, match="key=value"):
        preset("char-small").with_overrides(["n_layers"])


def test_mlp_shorthand_sets_gated_activation():
    config = ModelConfig.from_dict({"mlp": "swiglu", "bias": False})
    assert config.activation == "silu" and config.gated_mlp


def test_config_file_round_trip_and_malformed_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(preset("gpt2").to_dict()))
    assert ModelConfig.from_file(path) == preset("gpt2")
    path.write_text("{not json")
    with pytest.raises(TformerError, match="not valid JSON"):
        ModelConfig.from_file(path)
    with pytest.raises(TformerError, match="does not exist"):
        ModelConfig.from_file(tmp_path / "missing.json")


def test_sequence_longer_than_context_is_a_clear_error():
    model = build(preset("char-small")).eval()
    with pytest.raises(TformerError, match="exceeds the model's max_positions=128"):
        model(torch.zeros(1, 129, dtype=torch.long))


def test_a_decode_step_reads_no_token_values_on_the_host():
    """Ids are checked at the entry points, not in forward: a forward that read a value back (int(ids.max()))
    would cost a device-to-host sync per decode step on a GPU. Fake tensors have no values: any such read raises."""
    model = build(preset("char-small")).eval()
    runner = runner_for(model)
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True):
        cache = runner.new_cache(2)
        runner.prefill(cache, torch.randint(0, 65, (2, 5)))
        logits = runner.step(cache, torch.randint(0, 65, (2,)))
    assert logits.shape == (2, model.config.vocab_size)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tformer", *args], capture_output=True, text=True, timeout=120)


def test_cli_version_and_help():
    assert _cli("--version").stdout.startswith("tformer ")
    assert "presets" in _cli("--help").stdout


def test_cli_bad_input_is_one_line_and_exit_2():
    result = _cli("demo", "--preset", "nope")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "unknown preset 'nope'" in result.stderr
    assert "Traceback" not in result.stderr
    result = _cli("demo", "--set", "d_model=100", "--set", "n_heads=3")
    assert result.returncode == 2 and "not divisible" in result.stderr
