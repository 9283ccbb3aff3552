"""The GGUF family records (tformer.interop.gguf_families): one per architecture a file names, covering what the
reader and the writer list; the writer's choice of family for a config; the one-line refusals; the tensor-name
maps, which must hold every tensor of a tiny model of the family and agree with the Hugging Face names the reader
loads through. And ``tformer.load_gguf``, public, behind an ``import tformer`` that stays torch-free."""

from __future__ import annotations

import subprocess
import sys

import pytest

import tformer
from tformer.core.config import ModelConfig, preset
from tformer.core.errors import TformerError
from tformer.interop import gguf_config, gguf_write
from tformer.interop.gguf_families import (
    EXPORTS,
    FAMILIES,
    GEMMA3,
    GPT2,
    HEAD,
    LLAMA,
    family_for_config,
    gguf_family,
)
from tformer.interop.hf import FAMILIES as HF_RULES
from tformer.interop.hf_config import SUPPORTED

LLAMA_FIELDS = {"position": "rope", "norm": "rmsnorm", "activation": "silu", "gated_mlp": True, "bias": False}
GPT2_FIELDS = {"position": "learned", "norm": "layernorm", "activation": "gelu_tanh", "bias": True}


def tiny_config(**kw) -> ModelConfig:
    fields = {"arch": "decoder", "n_layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 128, "vocab_size": 50,
              "max_positions": 64, "tied_embeddings": False, **kw}
    return ModelConfig(**fields)


def tiny_gemma3() -> ModelConfig:
    return preset("gemma3-270m").replace(n_layers=2, d_model=64, n_heads=4, n_kv_heads=1, head_dim=16,
                                         attn_scale_dim=16, d_ff=128, vocab_size=50, max_positions=64, attn_window=8,
                                         layer_types=["sliding", "full"], tied_embeddings=False)


def one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# --- tformer.load_gguf -------------------------------------------------------------------------------------------


def test_load_gguf_is_public():
    from tformer.interop import gguf_model

    assert tformer.load_gguf is gguf_model.load_gguf
    assert "load_gguf" in tformer.__all__


def test_import_tformer_and_the_records_stay_torch_free():
    code = ("import sys, tformer, tformer.interop.gguf_families, tformer.interop.gguf_config; "
            "assert 'torch' not in sys.modules, 'torch imported'; assert callable(tformer.__getattr__)")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# --- which records, and the lookups ------------------------------------------------------------------------------


def test_every_architecture_the_reader_and_writer_list_has_a_record():
    assert gguf_config.ARCHITECTURES == ("llama", "qwen2", "qwen3", "phi3", "gemma3", "gpt2")
    assert gguf_write.ARCHITECTURES == ("llama", "qwen2", "qwen3", "gpt2")
    for name in gguf_config.ARCHITECTURES:
        family = gguf_family(name)
        assert family.name == name and family.reads
        assert family.hf_model_type in SUPPORTED and family.hf_model_type in HF_RULES
    for name in gguf_write.ARCHITECTURES:
        family = gguf_family(name, "writes")
        assert family.name == name and family.writes and family.match and family.refusal
    assert [f.name for f in FAMILIES] == ["llama", "qwen2", "qwen3", "phi3", "gemma3", "gpt2"]
    assert (LLAMA.hf_model_type, LLAMA.hidden_act) == ("llama", "silu")
    assert (GEMMA3.hf_model_type, GEMMA3.hidden_act) == ("gemma3_text", "gelu_pytorch_tanh")


@pytest.mark.parametrize("name, family", [("llama-7b", LLAMA), ("llama-70b", LLAMA), ("gpt2", GPT2),
                                          ("char-small", GPT2)])
def test_the_writer_files_a_preset_under_its_family(name, family):
    config = preset(name)
    assert family_for_config(config) is family
    assert gguf_write.gguf_architecture(config) == family.name


@pytest.mark.parametrize("name, purpose, words", [
    ("falcon", "reads", "the GGUF file holds a 'falcon' model; tformer reads: llama, qwen2, qwen3, phi3, gemma3, gpt2"),
    ("falcon", "writes", "holds a 'falcon' model; tformer writes: llama, qwen2, qwen3, gpt2"),
    ("deci", "reads", "holds a 'deci' model; tformer reads: llama, qwen2, qwen3, phi3, gemma3, gpt2"),
    ("gemma3", "writes", "holds a 'gemma3' model; tformer writes: llama, qwen2, qwen3, gpt2"),
    (None, "reads", "holds a 'NoneType' model; tformer reads: llama, qwen2, qwen3, phi3, gemma3, gpt2"),
    ("x" * 50, "reads", "holds a 'str' model"),
])
def test_an_architecture_it_does_not_handle_is_refused_in_one_line(name, purpose, words):
    with pytest.raises(TformerError) as exc:
        gguf_family(name, purpose)
    assert words in one_line(exc)


def test_a_config_no_family_holds_is_refused_naming_them():
    with pytest.raises(TformerError) as exc:
        family_for_config(preset("gemma3-270m"))
    text = one_line(exc)
    assert "position='rope' with norm='rmsnorm_offset' is neither llama's (rope + rmsnorm) nor gpt2's " \
           "(learned + layernorm)" in text
    assert text.endswith(EXPORTS) and "tformer writes GGUF for llama" in EXPORTS and "and gpt2 (" in EXPORTS


# --- the tensor-name maps ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("family, config", [
    (LLAMA, tiny_config(**LLAMA_FIELDS, n_kv_heads=2)),
    (GPT2, tiny_config(**GPT2_FIELDS)),
    (GEMMA3, tiny_gemma3()),
])
def test_every_tensor_name_maps_to_gguf_and_back(family, config):
    from tformer.model import build

    ours = set(build(config).state_dict())
    to_gguf = {}
    for gguf_name, names, _ in family.expand(config.n_layers):
        for name in names:
            assert name not in to_gguf, name  # each of ours has one place in the file
            to_gguf[name] = gguf_name
    back = {}
    for name, gguf_name in to_gguf.items():
        back.setdefault(gguf_name, []).append(name)
    assert set(to_gguf) == ours  # every tensor of the model, and nothing it lacks
    for gguf_name, names, _ in family.expand(config.n_layers):
        assert tuple(back[gguf_name]) == names  # and back, fused ones in their order
    assert len({g for g, _, _ in family.expand(config.n_layers)}) == len(family.expand(config.n_layers))


def test_gpt2_biases_of_a_model_without_them_are_the_only_names_it_may_lack():
    from tformer.model import build

    ours = set(build(tiny_config(**{**GPT2_FIELDS, "bias": False})).state_dict())
    missing = {n for _, names, row in GPT2.expand(2) for n in names if n not in ours}
    fills = {n for _, names, row in GPT2.expand(2) if row.zero_fill for n in names}
    assert missing and missing <= fills


@pytest.mark.parametrize("family, config", [(LLAMA, tiny_config(**LLAMA_FIELDS)), (GEMMA3, tiny_gemma3())])
def test_the_readers_hugging_face_names_are_the_families(family, config):
    """Each row's Hugging Face name is the one the HF weight table pairs with the row's tformer name."""
    rules, _ = HF_RULES[family.hf_model_type](config, "model.")
    hf_of = {r.ours: r.hf for r in rules}
    for gguf_name, names, row in family.expand(config.n_layers):
        hf = row.hf if row in (*family.first, *family.last, HEAD) else \
            f"model.layers.{gguf_name.split('.')[1]}.{row.hf}"
        assert hf_of[names] == hf, gguf_name


def test_the_permuted_rows_and_stored_norms():
    assert {t.gguf: t.permute for t in LLAMA.layer if t.permute} == {"attn_q.weight": "n_heads",
                                                                      "attn_k.weight": "n_kv_heads"}
    assert not any(t.permute for t in (*GEMMA3.tensors, *GPT2.tensors))
    assert (LLAMA.norm_offset, GEMMA3.norm_offset) == (0.0, 1.0)
    assert GPT2.zero_biases and not LLAMA.zero_biases
    qkv = next(t for t in GPT2.layer if t.gguf == "attn_qkv.weight")
    assert qkv.ours == ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight")
