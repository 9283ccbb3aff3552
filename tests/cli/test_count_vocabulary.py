"""`tformer count`'s large-vocabulary analysis: the token table's and LM head's shares of parameters, FLOPs, a decode
step's bytes and training memory, against numbers worked out here from the sizes (Gemma 3 270M's 262,144 tokens)."""

from __future__ import annotations

import json
import subprocess
import sys

from tformer.cost.vocabulary import vocabulary_shares
from tformer.core.config import preset
from tformer.cost.ledger import Workload, ledger


def test_gemma3_270m_shares_from_its_sizes():
    c = preset("gemma3-270m")
    v = vocabulary_shares(c, Workload(phase="forward", batch=1, seq=4096))
    table = 262_144 * 640
    assert v["embedding_params"] == table and v["embedding_params_share"] == table / 268_098_176
    decode = ledger(c, Workload(phase="decode", batch=1, seq=4096, context=4095))
    head = 2 * 640 * 262_144  # one token's logits: a (1, 640) x (640, 262144) product
    assert v["head_flops_share_decode"] == head / decode.flops["matmul"]
    assert 0.5 < v["head_bytes_share_decode"] < 0.7  # the 671 MB fp32 head is most of a 1.07 GB step
    assert v["logits_memory_share_train"] > 0.3  # (4096, 262144) fp32 logits and their log-probabilities


def test_the_shares_grow_with_the_vocabulary_and_a_model_without_a_head_has_none():
    small = vocabulary_shares(preset("gemma3-270m", vocab_size=32_000), Workload(seq=1024))
    large = vocabulary_shares(preset("gemma3-270m"), Workload(seq=1024))
    for key in ("embedding_params_share", "head_flops_share_train", "head_flops_share_decode",
                "head_bytes_share_decode", "logits_memory_share_train"):
        assert small[key] < large[key], key
    assert vocabulary_shares(preset("bert-base"), Workload(seq=128)) is None


def test_count_prints_and_writes_them():
    out = subprocess.run([sys.executable, "-m", "tformer", "count", "--preset", "gemma3-270m", "--seq", "512",
                          "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["vocabulary"]["embedding_params"] == 262_144 * 640
    text = subprocess.run([sys.executable, "-m", "tformer", "count", "--preset", "gemma3-270m", "--seq", "512"],
                          capture_output=True, text=True, timeout=120).stdout
    assert "The vocabulary's share" in text and "62.6%" in text
