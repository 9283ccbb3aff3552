"""Seq2seq batches: synthetic copy/reverse tasks and translation pairs with padding."""

import pytest
import torch

from tformer.data import seq2seq as s2s
from tformer.core.errors import TformerError


def _rows(batch, i):
    """(source symbols, target symbols) of row i, without specials and padding."""
    src = batch.input_ids[i][batch.attention_mask[i].bool()].tolist()
    lab = batch.labels[i][batch.labels[i] != s2s.IGNORE_INDEX].tolist()
    assert src[-1] == s2s.SYNTH_EOS and lab[-1] == s2s.SYNTH_EOS
    return src[:-1], lab[:-1]


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_synthetic_tasks(task):
    batch = s2s.synthetic_batch(task, 64, torch.Generator().manual_seed(0), vocab_size=12, min_len=2, max_len=9)
    lengths = set()
    for i in range(64):
        src, tgt = _rows(batch, i)
        assert tgt == (src if task == "copy" else src[::-1])
        assert all(3 <= t < 12 for t in src) and 2 <= len(src) <= 9
        lengths.add(len(src))
    assert len(lengths) > 3  # lengths vary, so padding is exercised
    # Teacher forcing: the decoder reads [BOS] + target, predicts target + [EOS].
    dec = batch.decoder_input_ids
    assert (dec[:, 0] == s2s.SYNTH_BOS).all()
    real = batch.labels != s2s.IGNORE_INDEX
    assert torch.equal(real.long(), batch.decoder_attention_mask)
    assert torch.equal(dec[:, 1:][real[:, 1:]], batch.labels[:, :-1][real[:, 1:]])
    assert (batch.input_ids[batch.attention_mask == 0] == s2s.SYNTH_PAD).all()
    again = s2s.synthetic_batch(task, 64, torch.Generator().manual_seed(0), vocab_size=12, min_len=2, max_len=9)
    assert torch.equal(again.input_ids, batch.input_ids)


def test_synthetic_bad_input():
    with pytest.raises(TformerError, match="unknown synthetic task"):
        s2s.synthetic_batch("sort", 2)
    with pytest.raises(TformerError, match="vocab_size must exceed"):
        s2s.synthetic_batch("copy", 2, vocab_size=3)


PAIRS = [("Go.", "Ve."), ("Hi.", "Hola."), ("I am cold.", "Tengo frío."), ("Thanks!", "¡Gracias!"),
         ("Who are you?", "¿Quién eres?"), ("It's late.", "Es tarde."), ("Come here.", "Ven aquí.")] * 3


def test_pair_batches_pad_and_decode_back():
    src_tok, tgt_tok = s2s.pair_tokenizers(PAIRS, kind="char")
    batcher = s2s.PairBatcher(PAIRS, src_tok, tgt_tok, batch_size=4, max_len=64, seed=0, shuffle=False)
    assert len(batcher) == 6 and batcher.dropped == 0
    seen = []
    for batch in batcher:
        for i in range(batch.input_ids.shape[0]):
            src = batch.input_ids[i][batch.attention_mask[i].bool()].tolist()
            lab = batch.labels[i][batch.labels[i] != s2s.IGNORE_INDEX].tolist()
            assert src[-1] == src_tok.eos_id and lab[-1] == tgt_tok.eos_id
            assert batch.decoder_input_ids[i, 0] == tgt_tok.bos_id
            seen.append((src_tok.decode(src[:-1]), tgt_tok.decode(lab[:-1])))
    assert seen == PAIRS  # an unshuffled pass returns every pair in order, then stops


def test_pair_batcher_shuffles_resumes_and_drops_long():
    src_tok, tgt_tok = s2s.pair_tokenizers(PAIRS, kind="char")
    run = s2s.PairBatcher(PAIRS, src_tok, tgt_tok, batch_size=4, max_len=64, seed=1)
    batches = [next(run) for _ in range(10)]  # crosses an epoch (6 batches each)
    resumed = s2s.PairBatcher(PAIRS, src_tok, tgt_tok, batch_size=4, max_len=64, seed=1)
    for _ in range(4):
        next(resumed)
    state = resumed.state_dict()
    fresh = s2s.PairBatcher(PAIRS, src_tok, tgt_tok, batch_size=4, max_len=64, seed=1)
    fresh.load_state_dict(state)
    for b, r in zip(batches[4:], [next(fresh) for _ in range(6)]):
        assert torch.equal(b.input_ids, r.input_ids) and torch.equal(b.labels, r.labels)
    short = s2s.PairBatcher(PAIRS, src_tok, tgt_tok, batch_size=4, max_len=6)
    assert short.dropped == 15 and len(short.examples) == 6  # only "Go."/"Ve." and "Hi."/"Hola." fit 5 + [EOS]
    with pytest.raises(TformerError, match="no pair fits"):
        s2s.PairBatcher(PAIRS, src_tok, tgt_tok, batch_size=4, max_len=2)


def test_bpe_pair_tokenizers_have_specials():
    src_tok, tgt_tok = s2s.pair_tokenizers(PAIRS * 5, kind="bpe", vocab_size=300)
    assert None not in (src_tok.pad_id, tgt_tok.bos_id, tgt_tok.eos_id)
    assert tgt_tok.decode(tgt_tok.encode("¿Quién eres?")) == "¿Quién eres?"
