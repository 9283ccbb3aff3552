"""Attention heat maps: one figure per head, labelled by token, showing exactly the model's weights."""

import numpy as np
import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.data.tokenizers import CharTokenizer
from tformer.core.errors import TformerError
from tformer.model import build
from tformer.report.attention_maps import attention_heatmaps, save_attention_heatmaps

SENTENCE = "to be\nor not"


def tiny(arch="decoder", heads=3):
    tok = CharTokenizer.from_text(SENTENCE)
    cfg = ModelConfig(arch=arch, n_layers=2, d_model=12, n_heads=heads, d_ff=24, vocab_size=tok.vocab_size,
                      max_positions=32)
    return build(cfg), tok


def model_weights(model, tok):
    """The weights straight from the model, computed here without the module under test."""
    model.eval()
    with torch.no_grad():
        out = model(torch.tensor([tok.encode(SENTENCE)]), output_attentions=True)
    return [a[0].numpy() for a in out.attentions]  # per layer (H, T, T)


def plotted(fig) -> np.ndarray:
    return np.asarray(fig.axes[0].images[0].get_array())


def test_one_figure_per_head_with_the_models_weights():
    model, tok = tiny()
    want = model_weights(model, tok)
    model.train()  # the function must switch dropout off itself and then restore the mode
    figs = attention_heatmaps(model, tok, SENTENCE)
    assert model.training
    assert len(figs) == 2 * 3
    for n, fig in enumerate(figs):
        layer, head = divmod(n, 3)
        np.testing.assert_allclose(plotted(fig), want[layer][head], rtol=0, atol=1e-7)
        ax = fig.axes[0]
        assert ax.get_title() == f"layer {layer + 1} of 2, head {head + 1} of 3"
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert labels == ["t", "o", "␣", "b", "e", "\\n", "o", "r", "␣", "n", "o", "t"]
        assert [t.get_text() for t in ax.get_yticklabels()] == labels
        assert len(fig.axes) == 2  # the heat map and its colour bar
    # A causal model: no query sees a later key.
    assert np.all(np.triu(plotted(figs[0]), k=1) == 0)


def test_layer_and_head_selection():
    model, tok = tiny()
    want = model_weights(model, tok)
    figs = attention_heatmaps(model, tok, SENTENCE, layer=-1, max_heads=2)
    assert len(figs) == 2
    np.testing.assert_allclose(plotted(figs[1]), want[1][1], rtol=0, atol=1e-7)
    with pytest.raises(TformerError, match="layer 2 does not exist"):
        attention_heatmaps(model, tok, SENTENCE, layer=2)
    with pytest.raises(TformerError, match="no tokens"):
        attention_heatmaps(model, tok, "")
    with pytest.raises(TformerError, match="at most 32"):
        attention_heatmaps(model, tok, "to be " * 10)


def test_encoder_maps_are_not_causal():
    model, tok = tiny(arch="encoder", heads=2)
    want = model_weights(model, tok)
    figs = attention_heatmaps(model, tok, SENTENCE, layer=0)
    assert len(figs) == 2
    np.testing.assert_allclose(plotted(figs[0]), want[0][0], rtol=0, atol=1e-7)
    assert np.triu(plotted(figs[0]), k=1).sum() > 0


def test_saved_files_are_real_pngs(tmp_path):
    model, tok = tiny(heads=2)
    paths = save_attention_heatmaps(model, tok, SENTENCE, tmp_path / "maps", layer=0)
    assert [p.name for p in paths] == ["layer1_head1.png", "layer1_head2.png"]
    for p in paths:
        data = p.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000
    svg = save_attention_heatmaps(model, tok, SENTENCE, tmp_path / "svg", layer=1, max_heads=1, fmt="svg")
    assert len(svg) == 1 and "<svg" in svg[0].read_text()[:1000]
