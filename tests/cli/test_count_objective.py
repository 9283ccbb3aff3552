"""`tformer count --objective NAME`: the model `tformer train --objective NAME` builds, counted exactly (parameters
== numel, forward matmul FLOPs == FlopCounterMode), with what the objective adds; an objective the architecture
cannot train is one line and exit 2."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from tformer.core.config import preset
from tformer.measure.flops import FlopCounter
from tformer.model import build
from tformer.train.objectives import text_objective

SEQ = 24
TINY = {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_ff": 32, "vocab_size": 61}
CASES = {"mlm+nsp": ("bert-base", {"max_positions": 32}), "mlm+sop": ("albert-base", {"embed_dim": 8}),
         "span-corruption": ("t5-small", {"n_decoder_layers": 1, "head_dim": 8}),
         "denoise": ("bart-base", {"n_decoder_layers": 1, "max_positions": 32}),
         "prefix-lm": ("gpt2", {"max_positions": 32})}


class _Tok:  # the char tokenizer's case: none of the special ids
    vocab_size, mask_id, special_ids = 61, None, {}

    def encode(self, text):
        return [1, 2]


def _count(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "tformer", "count", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def _flags(name, fields):
    sets = [x for k, v in {**TINY, **fields}.items() for x in ("--set", f"{k}={v}")]
    return ["--preset", name, *sets]


@pytest.mark.parametrize("objective", list(CASES))
def test_count_objective_equals_the_model_training_builds(objective):
    name, fields = CASES[objective]
    base = preset(name, **TINY, **fields)
    ids = np.arange(5000) % 61
    config, _ = text_objective(objective, _Tok(), ids, ids, SEQ, 0, base)
    torch.manual_seed(0)
    model = build(config).eval()
    result = _count(*_flags(name, fields), "--objective", objective, "--seq", str(SEQ), "--batch", "2", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    numel = sum(p.numel() for p in model.parameters())
    assert out["params"]["total"] == numel
    assert out["objective"]["params"] == numel - sum(p.numel() for p in build(base, device="meta").parameters())
    ids = torch.randint(0, 61, (2, SEQ))
    kwargs = {"decoder_input_ids": ids} if config.arch == "encoder-decoder" else {}
    if objective.startswith("mlm+"):
        kwargs["token_type_ids"] = (torch.arange(SEQ) >= SEQ // 2).long().expand(2, SEQ)
    with torch.no_grad(), FlopCounter() as fc:
        model(ids, **kwargs)
    assert out["flops"]["matmul"] == fc.get_total_flops()


def test_pair_objective_adds_the_pooler_pair_head_and_mlm_head():
    out = json.loads(_count("--preset", "bert-base", "--objective", "mlm+nsp", "--seq", "128", "--json").stdout)
    d, v = 768, 30522
    mlm_head = d * d + d + 2 * d + (v + 3)  # transform dense, LayerNorm, decoder bias (the decoder weight is tied)
    assert out["objective"]["params"] == mlm_head + 2 * d + 2 + 3 * d  # + pair head, 3 added embedding rows
    assert out["objective"]["config_changes"] == {"vocab_size": v + 3, "lm_head": True, "pair_head": True}
    assert out["objective"]["flops"] > 0
    assert json.loads(_count("--preset", "gpt2", "--objective", "prefix-lm", "--json").stdout)["objective"][
        "params"] == 0


@pytest.mark.parametrize("args, message", [
    (["--preset", "gpt2", "--objective", "mlm+nsp"], "--objective mlm+nsp trains an encoder-only model"),
    (["--preset", "gpt2", "--objective", "span-corruption"], "trains an encoder-decoder model"),
    (["--preset", "roberta-base", "--objective", "mlm+sop"], "--set type_vocab_size=2"),
    (["--preset", "bert-base", "--objective", "nope"], "unknown objective 'nope'"),
])
def test_count_objective_the_model_cannot_train_is_one_line_exit_2(args, message):
    result = _count(*args)
    assert result.returncode == 2 and message in result.stderr
    assert result.stderr.strip().count("\n") == 0
