"""The ledger of arch='rnn': parameters == numel, matmul FLOPs == FlopCounterMode (forward, prefill, decode),
the state as the cache, and the textbook's LSTM worked cases (copied into oracles/textbook_lstm_cases.json)."""

import json
from pathlib import Path

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.cost.architecture import describe
from tformer.cost.ledger import Workload, ledger
from tformer.cost.recurrent import recurrent_params, recurrent_step_flops, sequential_steps, state_bytes
from tformer.data.batch import example_batch
from tformer.measure.flops import FlopCounter
from tformer.model import build, runner_for

pytestmark = pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
_ORACLE = Path(__file__).parent / "oracles" / "textbook_lstm_cases.json"
CASES = {c["id"]: c for c in json.loads(_ORACLE.read_text())["cases"]}


def config(cell, **kw):
    return ModelConfig.from_dict({"arch": "rnn", "cell": cell, "vocab_size": 29, "d_model": 13, "d_hidden": 19,
                                  "n_layers": 3, **kw})


def _flops(fn) -> int:
    # FlopCounter turns oneDNN's fused LSTM off (FlopCounterMode has no formula for it): the cell's matmuls run.
    with FlopCounter() as fc:
        fn()
    return fc.get_total_flops()


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
@pytest.mark.parametrize("kw", [{}, {"d_hidden": 13}, {"bias": False, "n_layers": 1}])
def test_params_equal_numel(cell, kw):
    c = config(cell, **kw)
    model = build(c, device="meta")
    for phase in ("forward", "train", "decode"):
        assert ledger(c, Workload(phase=phase, batch=2, seq=7)).params["total"] == model.num_parameters()


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
@pytest.mark.parametrize("teaching", [False, True])
def test_matmul_flops_equal_flop_counter(cell, teaching):
    c = config(cell, rnn_teaching=teaching)
    torch.manual_seed(0)
    model = build(c).eval()
    ids = torch.randint(0, 29, (2, 9))
    assert ledger(c, Workload(phase="forward", batch=2, seq=9)).flops["matmul"] == _flops(lambda: model(ids))
    runner = runner_for(model)
    cache = runner.new_cache(2)
    with torch.no_grad():
        prefill = _flops(lambda: runner.prefill(cache, ids, all_logits=True))  # the ledger's head: every position
        decode = _flops(lambda: runner.step(cache, ids[:, 0]))
    assert ledger(c, Workload(phase="prefill", batch=2, seq=9)).flops["matmul"] == prefill
    assert ledger(c, Workload(phase="decode", batch=2, seq=10)).flops["matmul"] == decode


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_training_matmul_flops_equal_flop_counter(cell):
    c = config(cell)
    runner = runner_for(build(c))
    batch = example_batch(c, torch.randint(0, 29, (2, 9)))
    counted = _flops(lambda: runner.loss(batch).backward())
    assert ledger(c, Workload(phase="train", batch=2, seq=9)).flops["matmul"] == counted


def test_rows_are_named_by_the_described_parameters_and_the_state_is_the_cache():
    c = config("lstm")
    names = set(describe(c).parameters())
    lg = ledger(c, Workload(phase="decode", batch=4, seq=50))
    rnn_rows = [op for op in lg.ops if op.kind in ("rnn_input", "rnn_hidden")]
    assert len(rnn_rows) == 2 * 3 and all(op.name in names for op in rnn_rows)
    assert lg.memory["kv_cache"] == state_bytes("lstm", 19, batch=4, layers=3) == 2 * 3 * 4 * 19 * 4
    assert lg.memory["kv_cache_per_token"] == 0  # fixed size, whatever the context
    assert lg.params["by_component"]["recurrent"] == sum(recurrent_params("lstm", d, 19) for d in (13, 19, 19))
    rec = ledger(c, Workload(phase="forward", seq=20)).recurrent
    assert rec["sequential_steps_per_layer"] == 20 and rec["sequential_steps_attention_layer"] == 1
    assert ledger(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=24), Workload()).recurrent is None


def test_formulas_per_cell():
    d, h = 7, 5
    assert recurrent_params("lstm", d, h) == 4 * ((d + h) * h + 2 * h)
    assert recurrent_params("lstm", d, h, convention="course") == 4 * ((d + h) * h + h)
    assert recurrent_params("gru", d, h) == 3 * ((d + h) * h + 2 * h)
    assert recurrent_params("rnn", d, h, bias=False) == (d + h) * h
    assert [recurrent_step_flops(c, d, h) for c in ("lstm", "gru", "rnn")] == [8 * h * (h + d), 6 * h * (h + d),
                                                                               2 * h * (h + d)]
    assert sequential_steps(True, 512) == 512 and sequential_steps(False, 512) == 1
    torch.manual_seed(0)
    for cell, module in (("lstm", torch.nn.LSTM), ("gru", torch.nn.GRU), ("rnn", torch.nn.RNN)):
        assert recurrent_params(cell, d, h) == sum(p.numel() for p in module(d, h).parameters())


def test_textbook_lstm_cases():
    case = CASES["P-F-LSTM-COURSE"]
    d, h = case["inputs"]["d"], case["inputs"]["h"]
    assert recurrent_params("lstm", d, h, convention="course") == case["expected"] == 6_295_552
    assert recurrent_params("lstm", d, h) == 6_299_648  # torch's two bias vectors, as the case's note says
    assert sum(p.numel() for p in torch.nn.LSTM(d, h, device="meta").parameters()) == 6_299_648
    case = CASES["F-F-LSTM-STEP"]
    assert recurrent_step_flops("lstm", case["inputs"]["d"], case["inputs"]["h"]) == case["expected"]
    case = CASES["F-F-LSTM-SEQ"]
    n, d, h = case["inputs"]["n"], case["inputs"]["d"], case["inputs"]["h"]
    c = ModelConfig.from_dict({"arch": "rnn", "cell": "lstm", "vocab_size": 10, "d_model": d, "d_hidden": h,
                               "n_layers": 1, "max_positions": n})
    lg = ledger(c, Workload(phase="forward", batch=1, seq=n))
    layer = sum(op.matmul_flops for op in lg.ops if op.kind in ("rnn_input", "rnn_hidden"))
    assert layer == case["expected"] == n * recurrent_step_flops("lstm", d, h)
    case = CASES["B-F-LSTM-STATES"]
    i = case["inputs"]
    per_step = state_bytes("lstm", i["h"], batch=i["B"], bytes_per_element=i["bytes_per_element"])
    assert i["n"] * per_step == case["expected"]
