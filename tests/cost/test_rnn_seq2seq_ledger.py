"""The ledger of arch='rnn-seq2seq': parameters == numel; matmul FLOPs == FlopCounterMode for the forward pass, a
training step and a decode step, for each attention kind (and a bidirectional encoder); the per-step attention
cost's growth with the source; the description names the model's parameters."""

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.cost.architecture import describe
from tformer.cost.ledger import Workload, ledger
from tformer.cost.recurrent import recurrent_params
from tformer.cost.recurrent_attention import attention_keys_flops, attention_params, attention_step_flops
from tformer.data.batch import example_batch
from tformer.measure.flops import FlopCounter
from tformer.model import build, runner_for

pytestmark = pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
KINDS = ["bahdanau", "luong-dot", "luong-general", "none"]


def config(**kw):
    return ModelConfig.from_dict({"arch": "rnn-seq2seq", "vocab_size": 23, "d_model": 11, "d_hidden": 9,
                                  "n_layers": 2, **kw})


def _flops(fn) -> int:
    # As tests/cost/test_recurrent_ledger.py: without oneDNN torch runs the cells' matmuls, which the counter sees.
    with FlopCounter() as fc:
        fn()
    return fc.get_total_flops()


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_params_and_description_equal_the_model(kind, bidirectional):
    c = config(rnn_attention=kind, bidirectional=bidirectional, cell="gru")
    model = build(c, device="meta")
    assert {k: tuple(v.shape) for k, v in model.named_parameters()} == describe(c).parameters()
    for phase in ("forward", "train", "decode"):
        assert ledger(c, Workload(phase=phase, batch=2, seq=7)).params["total"] == model.num_parameters()
    rec = ledger(c, Workload(batch=2, seq=7)).recurrent
    assert rec["attention_params"] == sum(p.numel() for n, p in model.named_parameters() if n.startswith("attention"))
    recurrent = sum(p.numel() for n, p in model.named_parameters() if n.startswith(("encoder", "decoder")))
    assert rec["params_exact"] == recurrent
    assert rec["params_exact"] - rec["params_course"] == 3 * 9 * 2 * (3 if bidirectional else 2)  # one bias per gate


@pytest.mark.parametrize("cell", ["lstm", "rnn"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("kind, feeding", [(k, True) for k in KINDS] + [("luong-dot", False), ("luong-general", False)])
def test_matmul_flops_equal_flop_counter(kind, feeding, bidirectional, cell):
    c = config(rnn_attention=kind, bidirectional=bidirectional, cell=cell,
               **({} if feeding else {"rnn_input_feeding": False}))
    torch.manual_seed(0)
    model = build(c)
    runner = runner_for(model)
    src, tgt = torch.randint(0, 23, (3, 7)), torch.randint(0, 23, (3, 5))
    batch = example_batch(model.config, src, tgt)
    with torch.no_grad():
        forward = _flops(lambda: runner.forward(batch))
    train = _flops(lambda: runner.loss(batch).backward())
    cache = runner.new_cache(3)
    with torch.no_grad():
        runner.prefill(cache, tgt[:, :3], source=src)
        decode = _flops(lambda: runner.step(cache, tgt[:, 3]))

    def lg(phase, **kw):
        return ledger(c, Workload(phase=phase, batch=3, seq=7, seq_decoder=5, **kw)).flops["matmul"]

    assert (lg("forward"), lg("train"), lg("decode", context=3)) == (forward, train, decode)


def test_attention_cost_per_step_grows_with_the_source():
    h = 9
    assert attention_params("bahdanau", h) == 2 * h * h + h and attention_params("luong-dot", h) == 2 * h * h
    assert attention_params("luong-general", h) == 3 * h * h and attention_params("none", h) == 0
    assert attention_step_flops("bahdanau", h, 10) == 2 * h * h + 4 * 10 * h
    assert attention_step_flops("luong-general", h, 20) - attention_step_flops("luong-general", h, 10) == 4 * 10 * h
    assert attention_keys_flops("bahdanau", h, 10) == 2 * 10 * h * h == attention_keys_flops("luong-general", h, 10)
    assert attention_keys_flops("luong-dot", h, 10) == 0 and attention_step_flops("none", h, 10) == 0
    c = config(rnn_attention="luong-dot")
    steps = [ledger(c, Workload(phase="decode", batch=1, seq=n, context=4)).flops["matmul"] for n in (8, 16)]
    assert steps[1] - steps[0] == 4 * 8 * 9  # 8 more source positions: scores and context, 2nh each
    rec = ledger(c, Workload(phase="train", batch=2, seq=30, seq_decoder=12)).recurrent
    assert rec["encoder_sequential_steps_per_layer"] == 30 and rec["sequential_steps_per_layer"] == 12
    assert rec["step_matmul_flops"] == sum(recurrent_params("lstm", d, 9, bias=False) * 2 for d in (11 + 9, 9)) \
        + attention_step_flops("luong-dot", 9, 30)


def test_the_cache_holds_state_memory_keys_and_feed():
    c = config(rnn_attention="luong-general")
    lg = ledger(c, Workload(phase="decode", batch=2, seq=6, context=3))
    h = 9
    state, memory, keys, feed = 2 * 2 * 2 * h, 2 * 6 * h, 2 * 6 * h, 2 * h  # LSTM h and c, 2 layers, 2 rows
    assert lg.memory["kv_cache"] == (state + memory + keys + feed) * 4
    runner = runner_for(build(c))
    cache = runner.new_cache(2)
    with torch.no_grad():
        runner.prefill(cache, torch.randint(0, 23, (2, 3)), source=torch.randint(0, 23, (2, 6)))
    assert cache.nbytes == lg.memory["kv_cache"]
