"""Our models equal the transformers reference implementations, loaded through tformer.load_hf.

Each reference is built from a tiny random config (seeded), every parameter perturbed so that
norm weights, biases and the logits bias are not at their trivial initial values, saved with
``save_pretrained`` and loaded with ``tformer.load_hf``. Logits must agree to 1e-5 (fp32, eval),
with and without padding. The round trip goes the other way: ``tformer.save_hf`` writes a folder
that ``transformers`` loads with identical outputs.
"""

from __future__ import annotations

import copy

import pytest
import torch

import tformer

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

TOL = 1e-5
VOCAB = 97
B, S, T = 2, 7, 5  # batch, source length, target length


def _gpt2(**kw):
    kw = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=16, bos_token_id=0, eos_token_id=0) | kw
    return transformers.GPT2Config(**kw), transformers.GPT2LMHeadModel


def _llama(**kw):
    kw = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
              vocab_size=VOCAB, max_position_embeddings=32, rms_norm_eps=1e-6, tie_word_embeddings=False) | kw
    return transformers.LlamaConfig(**kw), transformers.LlamaForCausalLM


def _bert(cls="BertForMaskedLM", **kw):
    kw = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=48, vocab_size=VOCAB,
              max_position_embeddings=16) | kw
    return transformers.BertConfig(**kw), getattr(transformers, cls)


def _bart(**kw):
    kw = dict(encoder_layers=2, decoder_layers=2, d_model=32, encoder_attention_heads=4, decoder_attention_heads=4,
              encoder_ffn_dim=48, decoder_ffn_dim=48, vocab_size=VOCAB, max_position_embeddings=16) | kw
    return transformers.BartConfig(**kw), transformers.BartForConditionalGeneration


def _t5(**kw):
    kw = dict(num_layers=2, num_decoder_layers=2, d_model=32, d_kv=8, num_heads=4, d_ff=48, vocab_size=VOCAB,
              relative_attention_num_buckets=8, relative_attention_max_distance=16) | kw
    return transformers.T5Config(**kw), transformers.T5ForConditionalGeneration


def reference(make, seed=0, **kw):
    """A seeded, perturbed, eval-mode transformers model."""
    config, cls = make(**kw)
    torch.manual_seed(seed)
    model = cls._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for name, buf in model.named_buffers():
            if name == "final_logits_bias":
                buf.normal_(0, 0.05)
        if getattr(config, "scale_decoder_outputs", True) is False:
            # T5 v1.1 does not scale before its head; shrink the random head instead so logits stay
            # near size 4 (not 20) and fp32 rounding of their magnitude stays well inside the tolerance.
            model.lm_head.weight.mul_(config.d_model**-0.5)
    return model


def inputs(kind: str, padding: str | None, seed=1):
    """Token ids and masks; padded rows hold random ids, so only real positions are compared."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (B, S), generator=g)
    dec = torch.randint(3, VOCAB, (B, T), generator=g)

    def mask(n):
        m = torch.ones(B, n, dtype=torch.long)
        if padding == "right":
            m[1, n - 3:] = 0
        elif padding == "left":
            m[1, :3] = 0
        return m

    out = {"input_ids": ids}
    if padding:
        out["attention_mask"] = mask(S)
        if kind == "decoder" and padding == "left":
            out["position_ids"] = (out["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    if kind == "encoder":
        out["token_type_ids"] = torch.randint(0, 2, (B, S), generator=g)
    if kind == "seq2seq":
        out["decoder_input_ids"] = dec
        if padding:
            out["decoder_attention_mask"] = mask(T)
    return out


def valid(kind: str, batch: dict) -> torch.Tensor:
    """(B, T) bool: positions whose outputs mean something."""
    key = "decoder_attention_mask" if kind == "seq2seq" else "attention_mask"
    ref = batch["decoder_input_ids"] if kind == "seq2seq" else batch["input_ids"]
    return batch[key].bool() if key in batch else torch.ones_like(ref, dtype=torch.bool)


def max_diff(a: torch.Tensor, b: torch.Tensor, keep: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs()[keep].max().item()


def compare(ours, ref, kind, padding, field="logits", device="cpu") -> float:
    batch = {k: v.to(device) for k, v in inputs(kind, padding).items()}
    with torch.no_grad():
        a = getattr(ours(**batch), field)
        b = getattr(ref(**batch), field)
    return max_diff(a, b, valid(kind, batch))


CASES = {
    "gpt2": (_gpt2, {}, "decoder"),
    "llama-gqa": (_llama, {}, "decoder"),
    "bert-mlm": (_bert, {}, "encoder"),
    "bart": (_bart, {}, "seq2seq"),
    "t5": (_t5, {}, "seq2seq"),
}
PADDINGS = {"decoder": [None, "right", "left"], "encoder": [None, "right"], "seq2seq": [None, "right"]}
PARAMS = [(name, pad) for name, (_, _, kind) in CASES.items() for pad in PADDINGS[kind]]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """name -> (reference, ours), each reference saved and loaded once."""
    out = {}
    for name, (make, kw, _) in CASES.items():
        ref = reference(make, **kw)
        path = tmp_path_factory.mktemp(name)
        ref.save_pretrained(path)
        out[name] = (ref, tformer.load_hf(path))
    return out


@pytest.mark.parametrize("name,padding", PARAMS, ids=[f"{n}-{p or 'nopad'}" for n, p in PARAMS])
def test_logits_match_reference(loaded, name, padding, device):
    # Copies on the test device: the module-scoped pair stays on the CPU for the round-trip tests.
    ref, ours = (copy.deepcopy(m).to(device) for m in loaded[name])
    assert not ours.training
    diff = compare(ours, ref, CASES[name][2], padding, device=device)
    print(f"{name} padding={padding}: max|diff| = {diff:.2e}")
    assert diff <= TOL


def test_loaded_configs_describe_the_references(loaded):
    gpt2, llama, bert, bart, t5 = (loaded[n][1].config for n in ("gpt2", "llama-gqa", "bert-mlm", "bart", "t5"))
    assert (gpt2.activation, gpt2.tied_embeddings, gpt2.position) == ("gelu_tanh", True, "learned")
    assert (llama.n_heads, llama.n_kv_heads, llama.gated_mlp, llama.tied_embeddings) == (4, 2, True, False)
    assert (bert.lm_head, bert.pooler, bert.norm_placement) == (True, False, "post")
    assert (bart.position_offset, bart.final_logits_bias, bart.pad_token_id) == (2, True, 1)
    assert (t5.position, t5.rescale_tied_head, t5.scale_attention, t5.head_dim) == ("relative", True, False, 8)


# Variants: other checkpoint layouts and settings of the same families -----------------
VARIANTS = {
    # A GPT2Model file: no "transformer." prefix and no head, so the head is the tied embedding.
    "gpt2-bare": (_gpt2, {}, "decoder", "GPT2Model"),
    "gpt2-untied-relu": (_gpt2, {"tie_word_embeddings": False, "activation_function": "relu"}, "decoder", None),
    "llama-tied-mqa": (_llama, {"tie_word_embeddings": True, "num_key_value_heads": 1,
                                "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}}, "decoder", None),
    "bart-scaled": (_bart, {"scale_embedding": True, "activation_function": "relu"}, "seq2seq", None),
    "t5-v1.1": (_t5, {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}, "seq2seq", None),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variants_match_reference(tmp_path, name, device):
    make, kw, kind, body = VARIANTS[name]
    ref = reference(make, **kw)
    if body == "GPT2Model":  # save only the body; compare hidden states through the tied head
        ref.transformer.save_pretrained(tmp_path)
        ours = tformer.load_hf(tmp_path)
        assert ours.config.tied_embeddings
    else:
        ref.save_pretrained(tmp_path)
        ours = tformer.load_hf(tmp_path)
    diff = compare(ours.to(device), ref.to(device), kind, "right", device=device)
    print(f"{name}: max|diff| = {diff:.2e}")
    assert diff <= TOL


def test_bert_model_without_head_has_pooler_and_hidden_states(tmp_path):
    ref = reference(_bert, cls="BertModel")
    ref.save_pretrained(tmp_path)  # BertModel files carry no "bert." prefix
    ours = tformer.load_hf(tmp_path)
    assert (ours.config.lm_head, ours.config.pooler) == (False, True)
    batch = inputs("encoder", "right")
    with torch.no_grad():
        a, b = ours(**batch), ref(**batch)
    assert a.logits is None
    diff = max(max_diff(a.last_hidden_state, b.last_hidden_state, valid("encoder", batch)),
               (a.pooler_output - b.pooler_output).abs().max().item())
    print(f"bert-model: max|diff| = {diff:.2e}")
    assert diff <= TOL


def test_pytorch_bin_checkpoint(tmp_path):
    """The .bin path: a pickled state dict read with weights_only=True, tied head and mask buffers included."""
    ref = reference(_gpt2)
    ref.config.save_pretrained(tmp_path)
    state = dict(ref.state_dict())  # holds lm_head.weight as well, like old checkpoints
    for i in range(ref.config.n_layer):  # old files also carry the causal mask buffers
        state[f"transformer.h.{i}.attn.bias"] = torch.ones(1, 1, 16, 16, dtype=torch.bool).tril()
    torch.save(state, tmp_path / "pytorch_model.bin")
    ours = tformer.load_hf(tmp_path)
    diff = compare(ours, ref, "decoder", "left")
    print(f"gpt2 .bin: max|diff| = {diff:.2e}")
    assert diff <= TOL


# Round trip: our model -> save_hf -> transformers ---------------------------------------
AUTO = {"decoder": "AutoModelForCausalLM", "encoder": "AutoModelForMaskedLM", "seq2seq": "AutoModelForSeq2SeqLM"}


@pytest.mark.parametrize("name", list(CASES))
def test_save_hf_round_trip(loaded, tmp_path, name):
    _, ours = loaded[name]
    kind = CASES[name][2]
    with torch.no_grad():  # make the weights ours, not the reference's
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    tformer.save_hf(ours, tmp_path)
    back = getattr(transformers, AUTO[kind]).from_pretrained(tmp_path, attn_implementation="eager").eval()
    diffs = [compare(ours, back, kind, pad) for pad in PADDINGS[kind]]
    print(f"{name} round trip: max|diff| = {max(diffs):.2e}")
    assert max(diffs) <= TOL
    again = tformer.load_hf(tmp_path)
    assert again.config == ours.config.replace(name=again.config.name)
    for (k, a), b in zip(ours.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k


def test_save_hf_bert_model_and_t5_v11(tmp_path):
    for i, (make, kw, kind, auto, field) in enumerate([
        (_bert, {"cls": "BertModel"}, "encoder", "AutoModel", "last_hidden_state"),
        (_t5, {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}, "seq2seq",
         "AutoModelForSeq2SeqLM", "logits"),
    ]):
        ref = reference(make, **kw)
        ref.save_pretrained(tmp_path / f"ref{i}")
        ours = tformer.load_hf(tmp_path / f"ref{i}")
        tformer.save_hf(ours, tmp_path / f"ours{i}")
        back = getattr(transformers, auto).from_pretrained(tmp_path / f"ours{i}", attn_implementation="eager").eval()
        diff = compare(ours, back, kind, "right", field)
        print(f"{make.__name__} round trip: max|diff| = {diff:.2e}")
        assert diff <= TOL


def test_save_hf_overwrites_in_place_and_keeps_other_files(tmp_path):
    model = tformer.build_model(tformer.preset("char-small", n_layers=1, d_model=32, n_heads=2, d_ff=64))
    (tmp_path / "tokenizer.json").write_text("{}")
    tformer.save_hf(model, tmp_path)
    tformer.save_hf(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert tformer.load_hf(tmp_path).config.n_layers == 1


def test_save_hf_refuses_configs_no_family_holds(tmp_path):
    vaswani = tformer.build_model(tformer.preset("vaswani-base", n_layers=1, n_decoder_layers=1, d_model=32,
                                                 n_heads=2, d_ff=64, vocab_size=50))
    with pytest.raises(tformer.TformerError, match="no Hugging Face family"):
        tformer.save_hf(vaswani, tmp_path / "v")
    post_ln_gpt = tformer.build_model(tformer.preset("char-small", n_layers=1, d_model=32, n_heads=2, d_ff=64,
                                                     norm_placement="post"))
    with pytest.raises(tformer.TformerError, match="norm_placement"):
        tformer.save_hf(post_ln_gpt, tmp_path / "g")
    assert not (tmp_path / "v").exists() and not (tmp_path / "g").exists()


def test_t5_file_with_its_own_head(tmp_path):
    """Hub T5 v1.1 files store lm_head.weight apart from the embedding (and embed_tokens copies)."""
    from safetensors.torch import save_file

    ref = reference(_t5, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    with torch.no_grad():
        ref.lm_head.weight = torch.nn.Parameter(ref.shared.weight.detach().clone() * 0.5 + 0.01)
    ref.config.save_pretrained(tmp_path)
    state = {k: v.detach().clone().contiguous() for k, v in ref.state_dict().items()}
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    assert "lm_head.weight" in state and "encoder.embed_tokens.weight" in state
    ours = tformer.load_hf(tmp_path)
    assert (ours.config.tied_embeddings, ours.config.rescale_tied_head) == (False, False)
    diff = compare(ours, ref, "seq2seq", "right")
    print(f"t5 separate head: max|diff| = {diff:.2e}")
    assert diff <= TOL


def test_save_hf_encoder_without_segments(tmp_path):
    """A plain encoder (no segment embeddings) is written as a BERT with one zero segment row."""
    config = tformer.ModelConfig(arch="encoder", n_layers=1, d_model=32, n_heads=4, d_ff=48, vocab_size=VOCAB,
                                 max_positions=16, norm_placement="post", final_norm=False, embedding_norm=True,
                                 norm_eps=1e-12, lm_head=True)
    torch.manual_seed(0)
    ours = tformer.build_model(config).eval()
    tformer.save_hf(ours, tmp_path)
    back = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    batch = inputs("encoder", "right")
    batch.pop("token_type_ids")
    with torch.no_grad():
        diff = max_diff(ours(**batch).logits, back(**batch).logits, valid("encoder", batch))
    assert diff <= TOL
