"""The decode-speed Linear: same numbers as F.linear, and it stays out of the way of autograd."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.machine.path_choices import PathPoint, PathTable, load_paths, paths_path
from tformer.model import build, linear, linear_tuning
from tformer.model.linear import Linear, split_rows_linear
from tformer.model.path_choice import choose_paths


@pytest.mark.parametrize("out_features", [512, 515, 1031])
@pytest.mark.parametrize("rows", [1, 3, 32])
@pytest.mark.parametrize("bias", [True, False])
def test_split_product_equals_f_linear(out_features, rows, bias):
    g = torch.Generator().manual_seed(out_features + rows)
    x = torch.randn(rows, 96, generator=g)
    w = torch.randn(out_features, 96, generator=g)
    b = torch.randn(out_features, generator=g) if bias else None
    for parts in (2, 3, 4):
        got = split_rows_linear(x, w, b, parts)
        assert got.shape == (rows, out_features)
        torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_leading_dimensions_are_kept():
    x = torch.randn(2, 1, 3, 64)
    w, b = torch.randn(300, 64), torch.randn(300)
    got = split_rows_linear(x, w, b, 2)
    assert got.shape == (2, 1, 3, 300)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def _spy(monkeypatch):
    calls = []
    real = linear.split_rows_linear
    monkeypatch.setattr(linear, "split_rows_linear", lambda *a: calls.append(a[3]) or real(*a))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    return calls


def _table(gain: float, rows: int = 4, n: int = 1024, k: int = 256, threads: int = 2) -> PathTable:
    """Timings of one shape on a pretend machine where the split path is ``gain`` times faster."""
    return PathTable([PathPoint("linear", "split", rows, n, k, threads, "fp32", 1e-3 * gain, 1e-3, "test")])


def _chosen(layer, table):
    """``layer`` after the choosing pass made from ``table`` (a PathTable or a mode)."""
    with linear.use_paths(table):
        choose_paths(layer)
    return layer


def test_a_profile_that_prefers_split_yields_split(monkeypatch):
    calls = _spy(monkeypatch)
    layer = _chosen(Linear(256, 1024), _table(gain=1.5))
    x = torch.randn(1, 4, 256)
    with torch.no_grad():
        got = layer(x)
    assert calls == [2] and 4 in layer.split_rows and layer.split_threads == 2
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("table", [_table(gain=0.8), _table(gain=1.05), PathTable(), _table(1.5, threads=4)],
                         ids=["prefers-plain", "within-noise", "empty", "other-thread-count"])
def test_a_profile_that_prefers_plain_or_knows_nothing_yields_plain(monkeypatch, table):
    calls = _spy(monkeypatch)
    with torch.no_grad():
        _chosen(Linear(256, 1024), table)(torch.randn(1, 4, 256))
    assert calls == []


def test_forward_only_reads_what_the_pass_chose(monkeypatch):
    """No mode, table or timing is consulted in forward: a forward before any pass is F.linear, one after it
    follows the pass, whatever the environment says by then."""
    calls = _spy(monkeypatch)
    layer = Linear(256, 1024)
    with torch.no_grad():
        layer(torch.randn(1, 4, 256))
        assert calls == []  # never chosen: F.linear
        _chosen(layer, "split")

        def refuse(*_):
            raise AssertionError("forward consulted the choice")

        monkeypatch.setattr(linear, "path_table", refuse)
        monkeypatch.setattr(linear, "mode", refuse)
        monkeypatch.setenv("TFORMER_LINEAR_PATH", "plain")
        layer(torch.randn(1, 4, 256))
    assert calls == [2]


def test_the_split_is_never_taken_where_it_is_not_a_candidate(monkeypatch):
    calls = _spy(monkeypatch)
    layer = _chosen(Linear(256, 1024), "split")  # every candidate would split: what is left out here is not one
    y = layer(torch.randn(1, 4, 256))  # autograd on: the backward must be PyTorch's own
    y.sum().backward()
    assert layer.weight.grad is not None
    with torch.no_grad():
        _chosen(Linear(256, 1024).double(), "split")(torch.randn(1, 4, 256).double())  # not fp32
        _chosen(Linear(256, 1), "split")(torch.randn(1, 4, 256))  # fewer output rows than slices
        layer.double()(torch.randn(1, 4, 256).double())  # cast after the choice
        layer.float()
        monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
        layer(torch.randn(1, 4, 256))  # another thread count than the choice's
        assert _chosen(Linear(256, 1024), "split").split_rows == frozenset()  # one thread: nothing to split over
    assert calls == []


def test_every_path_gives_the_same_model_outputs_to_float_rounding():
    model = build(ModelConfig(n_layers=2, d_model=96, n_heads=3, d_ff=200, vocab_size=301, max_positions=32)).eval()
    ids = torch.randint(0, 301, (2, 5))
    outs = {}
    for how in ("plain", "split"):
        _chosen(model, how)
        with torch.no_grad():
            outs[how] = model(ids).logits
    torch.testing.assert_close(outs["split"], outs["plain"], rtol=1e-5, atol=1e-5)


def test_far_from_every_measured_shape_is_plain(monkeypatch):
    calls = _spy(monkeypatch)
    table = _table(gain=2.0, rows=4, n=1024, k=256)
    with torch.no_grad():
        _chosen(Linear(256, 1024), table)(torch.randn(1, 64, 256))  # 16x the measured rows (a prefill)
        _chosen(Linear(4096, 64), table)(torch.randn(1, 4, 4096))  # 16x the measured input width
        _chosen(Linear(32, 32), table)(torch.randn(1, 4, 32))  # 256x smaller weight: it sits in cache
        _chosen(Linear(256, 16384), table)(torch.randn(1, 4, 256))  # a larger weight streams alike: split
    assert calls == [2]


def test_env_var_forces_a_path_and_refuses_an_unknown_one(monkeypatch):
    calls = _spy(monkeypatch)
    layer = Linear(256, 1024)
    for how in ("plain", "split"):
        monkeypatch.setenv("TFORMER_LINEAR_PATH", how)
        choose_paths(layer)
        with torch.no_grad():
            layer(torch.randn(1, 4, 256))
    assert calls == [2]
    monkeypatch.setenv("TFORMER_LINEAR_PATH", "fastest")
    with pytest.raises(TformerError, match="TFORMER_LINEAR_PATH"):
        choose_paths(layer)


def test_first_use_tunes_once_saves_beside_the_profile_and_the_next_process_reads_it(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(linear, "_state", {"table": None, "override": None})
    tuned = []

    def fake_first_use(threads):  # the timings a machine where the split pays would give
        tuned.append(threads)
        return list(_table(gain=1.6, threads=threads).points)

    monkeypatch.setattr(linear.linear_tuning, "first_use", fake_first_use)
    calls = _spy(monkeypatch)
    layers = torch.nn.ModuleList([Linear(256, 1024), Linear(256, 1024)])
    choose_paths(layers)
    choose_paths(layers)
    with torch.no_grad():
        for layer in layers:
            layer(torch.randn(1, 4, 256))
    assert tuned == [2] and calls == [2, 2]
    saved = load_paths()
    assert saved.covers("linear", 2, "fp32") and Path(paths_path()).parent == tmp_path / "tformer" / "profiles"
    monkeypatch.setattr(linear, "_state", {"table": None, "override": None})  # a new process
    layer = Linear(256, 1024)
    choose_paths(layer)
    with torch.no_grad():
        layer(torch.randn(1, 4, 256))
    assert tuned == [2] and calls == [2, 2, 2]  # read from the file, not tuned again


def test_first_use_under_a_flop_counter_counts_only_the_model_s_products(monkeypatch, tmp_path):
    """The micro-benchmark runs outside any active dispatch mode: its own products are not the model's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(linear, "_state", {"table": None, "override": None})
    monkeypatch.setattr(linear_tuning, "FIRST_USE", [(1, 256, 128)])  # one small real timing, to keep it quick
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    layer = Linear(96, 200)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        choose_paths(layer)
        layer(torch.randn(3, 96))
    assert counter.get_total_flops() == 2 * 3 * 96 * 200
    assert load_paths().covers("linear", 2, "fp32")  # it did tune, and saved


def test_the_micro_benchmark_measures_both_paths_at_real_shapes():
    """Structure only (no speed is asserted): a point per shape, both paths timed, within the sweep."""
    points = linear_tuning.measure([(1, 64, 32), (3, 96, 48)], threads=2, budget_s=None)
    assert [(p.rows, p.n, p.k, p.threads) for p in points] == [(1, 64, 32, 2), (3, 96, 48, 2)]
    assert all(p.plain_s > 0 and p.path_s > 0 and p.path == "split" for p in points)


def test_a_spent_budget_still_measures_one_point(monkeypatch):
    """A slow machine whose budget is gone before the first timing still saves one point; otherwise its
    table never covers the thread count and every new shape would tune again."""
    clock = iter(range(0, 10_000, 100))  # every reading of the clock is 100 s after the last
    monkeypatch.setattr(linear_tuning.time, "perf_counter", lambda: float(next(clock)))
    points = linear_tuning.measure([(1, 64, 32), (3, 96, 48)], threads=2, budget_s=0.1, pool_cap=16 << 20)
    assert [(p.rows, p.n, p.k) for p in points] == [(1, 64, 32)]


def test_state_dict_keys_are_nn_linear_s():
    assert list(Linear(4, 3).state_dict()) == list(torch.nn.Linear(4, 3).state_dict())


def test_a_compiled_graph_of_fixed_rows_takes_the_split_as_one_op_and_a_dynamic_one_keeps_f_linear():
    """generate's compiled step (one row, called under fixed_rows_graph) runs the choice the pass made, as the op
    tformer::split_rows_linear, with eager's numbers bit for bit; a graph whose rows are symbolic (serving's) stays
    on F.linear, so the choice never specializes it to a row count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the split needs two threads to split over (an earlier test may have left one)
    try:
        _compiled_split_check()
    finally:
        torch.set_num_threads(threads)


def _compiled_split_check():
    from torch._dynamo.testing import CompileCounterWithBackend

    layer = _chosen(Linear(256, 1024), "split")
    assert layer.split_rows
    x = torch.randn(1, 256)
    with torch.no_grad():
        eager = layer(x)
        counter = CompileCounterWithBackend("aot_eager")
        fixed = torch.compile(layer, backend=counter, fullgraph=True, dynamic=False)
        with linear.fixed_rows_graph():
            assert torch.equal(fixed(x), eager)
        graph = "\n".join(str(g.graph) for g in counter.graphs)
        assert "split_rows_linear" in graph
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("aot_eager")
        rows = torch.randn(3, 256)
        torch._dynamo.mark_dynamic(rows, 0)
        dynamic = torch.compile(layer, backend=counter, fullgraph=True)
        torch.testing.assert_close(dynamic(rows), F.linear(rows, layer.weight, layer.bias))
        assert "split_rows_linear" not in "\n".join(str(g.graph) for g in counter.graphs)
