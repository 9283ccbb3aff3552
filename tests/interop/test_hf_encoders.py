"""RoBERTa, DistilBERT and ALBERT equal their transformers models, loaded through tformer.load_hf and
saved back with tformer.save_hf. Tiny random configs with odd sizes (d_model 36, d_ff 44, E 14);
padded rows hold the pad id, so RoBERTa's position ids (counted over non-pad tokens) are exercised."""

from __future__ import annotations

import json

import pytest
import torch

import tformer

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

TOL = 1e-5
VOCAB = 97


def _roberta(**kw):
    kw = dict(num_hidden_layers=2, hidden_size=36, num_attention_heads=4, intermediate_size=44, vocab_size=VOCAB,
              max_position_embeddings=19, type_vocab_size=1, pad_token_id=1) | kw
    return transformers.RobertaConfig(**kw)


def _distilbert(**kw):
    kw = dict(n_layers=3, dim=36, n_heads=4, hidden_dim=44, vocab_size=VOCAB, max_position_embeddings=17) | kw
    return transformers.DistilBertConfig(**kw)


def _albert(**kw):
    kw = dict(num_hidden_layers=3, hidden_size=36, embedding_size=14, num_attention_heads=4, intermediate_size=44,
              vocab_size=VOCAB, max_position_embeddings=17) | kw
    return transformers.AlbertConfig(**kw)


CASES = {
    "roberta": (_roberta, {}, "RobertaForMaskedLM"),
    "roberta-segments": (_roberta, {"type_vocab_size": 2}, "RobertaForMaskedLM"),
    "distilbert": (_distilbert, {}, "DistilBertForMaskedLM"),
    "distilbert-relu": (_distilbert, {"activation": "relu"}, "DistilBertForMaskedLM"),
    "albert": (_albert, {}, "AlbertForMaskedLM"),
    "albert-pretraining": (_albert, {}, "AlbertForPreTraining"),
    "albert-unshared": (_albert, {"num_hidden_groups": 3}, "AlbertForMaskedLM"),
}


def reference(name: str, seed: int = 0):
    make, kw, cls = CASES[name]
    torch.manual_seed(seed)
    model = getattr(transformers, cls)._from_config(make(**kw), attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def batch(pad_id: int, padding: str | None, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    if padding == "right":
        mask[1, 4:] = 0
    elif padding == "left":
        mask[1, :3] = 0
    ids[mask == 0] = pad_id
    return {"input_ids": ids, "attention_mask": mask}


def _logits(out):
    return out.logits if getattr(out, "logits", None) is not None else out.prediction_logits


def max_diff(ours, ref, inputs) -> float:
    with torch.no_grad():
        a, b = ours(**inputs), ref(**inputs)
    keep = inputs["attention_mask"].bool()
    diff = (a.logits - _logits(b)).abs()[keep].max().item()
    if getattr(b, "sop_logits", None) is not None:
        diff = max(diff, (a.pair_logits - b.sop_logits).abs().max().item())
    return diff


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    out = {}
    for name in CASES:
        ref = reference(name)
        path = tmp_path_factory.mktemp(name)
        ref.save_pretrained(path)
        out[name] = (ref, tformer.load_hf(path))
    return out


@pytest.mark.parametrize("padding", [None, "right", "left"])
@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_reference(loaded, name, padding):
    ref, ours = loaded[name]
    diff = max_diff(ours, ref, batch(ref.config.pad_token_id, padding))
    print(f"{name} padding={padding}: max|diff| = {diff:.2e}")
    assert diff <= TOL


def test_loaded_configs_say_what_each_variant_is(loaded):
    roberta, distil, albert, pre, unshared = (loaded[n][1].config for n in (
        "roberta", "distilbert", "albert", "albert-pretraining", "albert-unshared"))
    assert (roberta.position_offset, roberta.max_positions) == (2, 17)
    assert (roberta.type_vocab_size, roberta.pooler) == (1, False)
    assert (distil.type_vocab_size, distil.pooler, distil.lm_head, distil.n_layers) == (0, False, True, 3)
    assert (albert.embed_dim, albert.share_layers, albert.pooler, albert.pair_head) == (14, True, False, False)
    assert (pre.pooler, pre.pair_head, pre.lm_head) == (True, True, True)
    assert not unshared.share_layers
    # one shared layer: its parameters once, as HF holds them
    for name in ("albert", "albert-pretraining", "albert-unshared"):
        ref, ours = loaded[name]
        assert ours.num_parameters() == sum(p.numel() for p in ref.parameters()), name
    assert len(loaded["albert"][1].encoder.layers) == 1 and len(loaded["albert-unshared"][1].encoder.layers) == 3


def test_roberta_positions_count_non_pad_tokens(loaded):
    """A row with pads in the middle: ids after them continue the count, as HF's create_position_ids does."""
    ref, ours = loaded["roberta"]
    ids = torch.tensor([[5, 6, 1, 1, 7, 8, 9]])
    inputs = {"input_ids": ids, "attention_mask": (ids != 1).long()}
    assert max_diff(ours, ref, inputs) <= TOL


@pytest.mark.parametrize("name", list(CASES))
def test_save_hf_round_trip(loaded, tmp_path, name):
    ref, ours = loaded[name]
    tformer.save_hf(ours, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == [CASES[name][2]]
    back = getattr(transformers, CASES[name][2]).from_pretrained(tmp_path, attn_implementation="eager").eval()
    for padding in (None, "right"):
        assert max_diff(ours, back, batch(ref.config.pad_token_id, padding)) <= TOL
    again = tformer.load_hf(tmp_path)
    assert again.config == ours.config.replace(name=again.config.name)
    for (k, a), b in zip(ours.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k


def test_bare_models_save_without_prefix(tmp_path):
    for i, (make, cls) in enumerate([(_albert, "AlbertModel"), (_distilbert, "DistilBertModel"),
                                     (_roberta, "RobertaModel")]):
        torch.manual_seed(0)
        ref = getattr(transformers, cls)._from_config(make(), attn_implementation="eager").eval()
        ref.save_pretrained(tmp_path / f"ref{i}")
        ours = tformer.load_hf(tmp_path / f"ref{i}")
        assert not ours.config.lm_head
        tformer.save_hf(ours, tmp_path / f"ours{i}")
        back = transformers.AutoModel.from_pretrained(tmp_path / f"ours{i}", attn_implementation="eager").eval()
        inputs = batch(ref.config.pad_token_id, "right")
        with torch.no_grad():
            a, b = ours(**inputs), back(**inputs)
        keep = inputs["attention_mask"].bool()
        assert (a.last_hidden_state - b.last_hidden_state).abs()[keep].max().item() <= TOL, cls


def test_which_family_saves_an_encoder():
    from tformer.interop.hf_config import hf_family

    base = dict(n_layers=1, d_model=32, n_heads=4, d_ff=48, vocab_size=VOCAB, max_positions=16)
    assert hf_family(tformer.preset("roberta-base", **base))[0] == "roberta"
    assert hf_family(tformer.preset("distilbert-base", **base))[0] == "distilbert"
    assert hf_family(tformer.preset("albert-base", **base)) == ("albert", "AlbertForMaskedLM")
    assert hf_family(tformer.preset("albert-base", pooler=True, pair_head=True, **base))[1] == "AlbertForPreTraining"
    assert hf_family(tformer.preset("bert-base", **base)) == ("bert", "BertModel")


@pytest.mark.parametrize("changes,match", [
    ({"inner_group_num": 2}, "inner_group_num=2"),
    ({"num_hidden_groups": 2}, "num_hidden_groups=2"),
])
def test_albert_files_tformer_cannot_reproduce(changes, match):
    from tformer.interop.hf_config import config_from_hf

    d = _albert(**changes).to_dict()
    with pytest.raises(tformer.TformerError, match=match):
        config_from_hf(d)


def test_roberta_with_another_head_activation_is_refused():
    from tformer.interop.hf_config import config_from_hf

    with pytest.raises(tformer.TformerError, match="RobertaLMHead always applies exact GELU"):
        config_from_hf(_roberta(hidden_act="relu").to_dict())
