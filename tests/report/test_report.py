"""`tformer report` on a tiny config, with a fake measured profile (no real bench runs): the files,
the sections, the totals against the ledger, training on a local text, and bad input."""

import errno
import json
import os
import re
from pathlib import Path

import pytest
import torch

from tformer.cli import main
from tformer.core.config import preset
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload, ledger
from tformer.machine.profile_store import machine_key, save_profile
from tformer.measure.bench import BenchResult, Comparison, DeviceBench, MatmulPoint, StreamPoint
from tformer.report.doc import Document, Section

TINY = ["--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64",
        "--set", "max_positions=24"]
# The real model of section 14 has its own test (test_real_model.py); here the section says it was skipped.
TINY_RUN = TINY + ["--seq", "24", "--batch", "4", "--sentence", "To be, or not to be", "--no-real-model"]
SECTIONS = ["1. The machine", "2. The model", "3. The roofline", "4. Prediction vs measurement",
            "5. Training vs inference", "6. Scaling", "7. Beyond one device", "8. Attention, made visible",
            "9. Attention at long context", "10. Why attention", "11. Serving: what batching buys",
            "12. Seeing images: ViT patches and attention", "13. Adapting and compressing",
            "14. A real model: SmolLM2-135M-Instruct from its GGUF file"]
FAKE_NAME = "Fake Test CPU"


def tiny_config():
    return preset("char-small").with_overrides(TINY[1::2])


def timing(t: float) -> dict:
    return {"median_s": t, "min_s": t, "max_s": t, "q1_s": t, "q3_s": t, "reps": 3, "calls_per_rep": 1}


def fake_bench() -> BenchResult:
    """A plausible measured profile: a rising matmul curve and STREAM figures, all made up here so
    the tests never spend time benchmarking (and never depend on this machine's speed)."""
    points = []
    for n, rate in ((32, 2e9), (128, 1e10), (512, 3e10)):
        t = 2 * n**3 / rate
        points.append(MatmulPoint("cpu", "fp32", n, 2 * n**3, rate, rate, **timing(t)))
    stream = []
    for kernel, arrays, bw in (("copy", 2, 8e9), ("scale", 2, 8e9), ("add", 3, 9e9), ("triad", 3, 9e9)):
        nbytes = arrays * 4 * 2**20
        t = nbytes / bw
        stream.append(StreamPoint("cpu", kernel, 2**20, 4, nbytes, bw, bw, **timing(t)))
    comp = [Comparison("fp32 matmul", "FLOP/s", 3e10, 1e11, 0.3, "made up for the test", ["a test reason"])]
    dev = DeviceBench(device="cpu", name=FAKE_NAME, threads=1, memory_bytes=8 * 2**30, matmul=points,
                      stream=stream, comparisons=comp)
    return BenchResult(machine_key=machine_key(), created="2026-01-01T00:00:00+00:00", quick=True,
                       torch_version=torch.__version__, wall_s=1.0, devices=[dev], conventions=["test convention"],
                       load_before=0.0, logical_cpus=os.cpu_count())


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A private XDG cache holding the fake profile (module-scoped: the report runs once)."""
    root = tmp_path_factory.mktemp("cache")
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(root)
    save_profile(fake_bench())
    yield root
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


@pytest.fixture(scope="module")
def report(cache, tmp_path_factory):
    """One whole report, trained for 2 s on a local text (the report's real path: what every section reads)."""
    root = tmp_path_factory.mktemp("rep")
    text = root / "corpus.txt"
    text.write_text("To be, or not to be, that is the question.\nWhether 'tis nobler in the mind to suffer\n" * 60)
    out = root / "out" / "report"
    prev = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is faster and steadier on a shared machine
    try:
        rc = main(["report", "--quick", "--train-seconds", "2", "--data", str(text), "--out", str(out), *TINY_RUN])
    finally:
        torch.set_num_threads(prev)
    assert rc == 0
    return out


def _error_line(capsys) -> str:
    # Progress lines ("report: ...") come first on stderr; the error is the one other line.
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("report: ")]
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


def test_files_and_sections(report):
    for name in ("report.md", "report.html", "report.json"):
        assert (report / name).is_file() and (report / name).stat().st_size > 0
    md = (report / "report.md").read_text()
    page = (report / "report.html").read_text()
    for heading in SECTIONS:
        assert f"## {heading}" in md
        assert f">{heading}</h2>" in page
    # Every plot referenced by the markdown exists beside it, and the HTML embeds each one.
    refs = re.findall(r"\]\(plots/([\w-]+)\.png\)", md)
    assert {"matmul_curve", "roofline", "op_times", "decode_curve", "parallel_memory", "attention", "long_context_time",
            "long_context_memory", "why_attention_ledger", "vit_patches", "vit_rollout"} <= set(refs)
    for name in refs:
        assert (report / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert page.count('src="data:image/png;base64,') == len(refs)
    # Self-contained: nothing to fetch.
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert "<script" not in page and "<link" not in page
    # No temporary directories left beside the report.
    assert [p.name for p in report.parent.iterdir()] == ["report"]


def test_totals_equal_the_ledger(report):
    data = json.loads((report / "report.json").read_text())
    config = tiny_config()
    fwd = ledger(config, Workload(phase="forward", batch=4, seq=24))
    train = ledger(config, Workload(phase="train", batch=4, seq=24))
    dec = ledger(config, Workload(phase="decode", batch=1, seq=24, context=23))
    t = data["totals"]
    assert t["params"] == fwd.params["total"] == sum(p.numel() for p in _model(config).parameters())
    assert t["flops_forward"] == fwd.flops["total"] and t["flops_forward_matmul"] == fwd.flops["matmul"]
    assert t["flops_train"] == train.flops["total"] and t["flops_train_matmul"] == train.flops["matmul"]
    assert t["kv_cache"] == dec.memory["kv_cache"] and t["memory_train"] == train.memory["total"]
    md = (report / "report.md").read_text()
    # The same exact integers appear in the human text, with their units.
    assert f"| total | {fwd.params['total']:,}" in md
    assert f"**{fwd.flops['total']:,} FLOPs" in md
    assert f"**{train.flops['total']:,} FLOPs" in md
    assert f"{train.rules_of_thumb['value']:,} FLOPs" in md  # 6ND beside the exact count
    assert f"{dec.memory['kv_cache']:,} B" in md
    # The machine section reads the (fake) measured profile, not this machine's speed.
    assert FAKE_NAME in md and data["machine"]["measured_peak_flops"]["fp32"] == 3e10
    # The trained model's maps say so (an untrained one's: test_untrained_maps_say_so).
    assert "of the model trained above" in md and "Attention heat maps (trained model)" in md
    assert "untrained" not in md.split("## 8.")[1].split("\n## ")[0]
    assert data["attention"]["trained"] is True


def test_beyond_one_device_is_the_layout_ledger_and_a_real_two_process_run(report):
    """Section 7 reads tformer.cost.parallel for the report's workload, and its measured run holds and
    sends exactly what the ledger says (the run itself: tests/cost/test_parallel_measured.py)."""
    from tformer.cost.parallel import Layout, devices_needed, per_device

    par = json.loads((report / "report.json").read_text())["parallel"]
    config, w = tiny_config(), Workload(phase="train", batch=4, seq=24)
    zero3 = {p["devices"]: p["bytes"] for p in par["memory_vs_devices"]["ZeRO-3 (data parallel)"]}
    assert zero3[8] == per_device(config, w, Layout(8, 3))["total"] < zero3[1] == ledger(config, w).memory["total"]
    tp = {p["devices"]: p["bytes"] for p in par["memory_vs_devices"]["tensor parallel"]}
    assert set(tp) == {1, 2}  # 2 heads: no 4- or 8-way split
    need = par["devices_needed"]["llama-70b"]["h100-sxm"]["train_bf16_zero3"]
    big = Workload(phase="train", batch=4, seq=24, dtype="bf16", mixed_precision=True)
    assert need == devices_needed(preset("llama-70b"), big, 80 * 2**30, zero=3) and need["devices"] > 1
    if "measured" not in par:
        pytest.skip("no 2-process run on this machine (fewer than 2 CPUs or no gloo)")
    m = par["measured"]
    assert m["world"] == 2 and m["batch"] == 2 and len(m["bytes"]) == 14
    assert all(r["ratio"] == pytest.approx(1.0, abs=0.01) for r in m["bytes"]), m["bytes"]
    md = (report / "report.md").read_text()
    assert "Bytes per device, rank 0 of 2" in md and f"| ddp | weights | {m['bytes'][0]['measured']:,} B" in md


def test_no_distributed_skips_the_run_and_says_why():
    from types import SimpleNamespace

    from tformer.report import runs

    ctx = SimpleNamespace(options=SimpleNamespace(distributed=False), results={})
    assert runs.parallel_run(ctx) is None and ctx.results["distributed_skip_reason"] == "skipped (--no-distributed)"


def _model(config):
    from tformer.model import build

    return build(config)


def test_report_trains_on_a_local_text(report):
    out = report
    data = json.loads((out / "report.json").read_text())
    run = data["measurement"]["train_run"]
    assert run["steps"] >= 1 and run["tokens"] == run["steps"] * 4 * 24
    assert data["attention"]["trained"] is True
    md = (out / "report.md").read_text()
    assert "plots/loss_curve.png" in md and (out / "plots" / "loss_curve.png").is_file()
    assert f"{run['steps']} steps in" in md


def test_unknown_preset_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["report", "--preset", "no-such-model", "--out", str(out)]) == 2
    assert "no-such-model" in _error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_out_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    # Root ignores permission bits, so "unwritable" is a path under a regular file.
    assert main(["report", "--out", str(blocker / "report"), "--quick", "--no-train"]) == 2
    line = _error_line(capsys)
    assert "is a file, not a folder" in line and str(blocker) in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_out_that_is_not_a_report_is_left_alone(tmp_path, capsys):
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    assert main(["report", "--out", str(mine), "--quick", "--no-train"]) == 2
    assert "not a tformer report" in _error_line(capsys)
    assert (mine / "thesis.tex").read_text() == "precious"


def _doc() -> Document:
    sec = Section(1, "Only", "only")
    sec.text("hello")
    sec.figure("tiny", b"\x89PNG\r\n\x1a\nnot-really", "a figure")
    return Document("t", ["line"], [sec])


def _disk_full_at(name, monkeypatch):
    """Writing a file called ``name`` fails as on a full disk (ENOSPC); every other write goes through."""
    real = Path.write_text

    def full(self, *a, **k):
        if self.name == name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)


def test_full_disk_keeps_the_old_report_and_leaves_no_partial(tmp_path, monkeypatch):
    from tformer.report import build as report_build

    out = tmp_path / "report"
    report_build.write_report(out, _doc(), {"v": 1})
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    _disk_full_at("report.html", monkeypatch)
    with pytest.raises(TformerError, match="no space left"):
        report_build.write_report(out, _doc(), {"v": 2})
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # the old one, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no temporary directory left


def test_full_disk_through_the_cli_is_exit_2(cache, tmp_path, monkeypatch, capsys):
    """The CLI's path from the command to the atomic writer, with the disk full at report.html. The
    measurements are replaced by a ready document (the fixture's run covers them): only the writing is tested."""
    from tformer.report import build

    def written_only(opts, final, progress):
        return build.write_report(final, _doc(), {"v": 1})

    monkeypatch.setattr(build, "_make", written_only)
    _disk_full_at("report.html", monkeypatch)
    rc = main(["report", "--quick", "--no-train", "--out", str(tmp_path / "r"), *TINY_RUN])
    assert rc == 2
    assert "no space left on the device" in _error_line(capsys)
    assert list(tmp_path.iterdir()) == []  # neither the report nor its temporary directory


def test_quick_never_runs_the_full_bench(tmp_path, monkeypatch):
    from tformer.report import context

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []

    def fake_run_bench(quick=True, **kw):
        calls.append(quick)
        return fake_bench()

    monkeypatch.setattr(context, "run_bench", fake_run_bench)  # the name machine_profile() calls
    bench, note = context.machine_profile("cpu", None, lambda _m: None)
    assert calls == [True] and "quick bench ran now" in note
    # Saved, so the next report reuses it instead of benchmarking again.
    bench, note = context.machine_profile("cpu", None, lambda _m: None)
    assert calls == [True] and "not re-measured" in note


def test_markdown_and_html_say_the_same(report):
    """Both renderers draw from one Document: every table cell of the markdown is in the HTML."""
    import html as html_mod

    md = (report / "report.md").read_text()
    page = html_mod.unescape(re.sub(r"<[^>]+>", "", (report / "report.html").read_text()))
    cells = [c.strip() for line in md.splitlines() if line.startswith("| ") for c in line.strip("|").split(" | ")]
    missing = [c for c in cells if c and c != "---" and c.replace("\\|", "|").replace("**", "").replace("`", "") not in page]
    assert not missing[:5]


def test_untrained_maps_say_so():
    """Section 8 on a model that did not train (the fixture's did): the text names it untrained and why."""
    from types import SimpleNamespace

    from tformer.data.tokenizers import CharTokenizer
    from tformer.model import build
    from tformer.report import section_attention
    from tformer.report.attention_maps import attention_maps

    sentence = "To be, or not to be"
    tokenizer = CharTokenizer.from_text(sentence)
    model = build(tiny_config().replace(vocab_size=tokenizer.vocab_size)).eval()
    ctx = SimpleNamespace(options=SimpleNamespace(sentence=sentence), data={},
                          results={"maps": attention_maps(model, tokenizer, sentence),
                                   "train_skip_reason": "skipped (--no-train was given)"})
    section = section_attention.build(ctx)
    text = " ".join(block.text for block in section.blocks if hasattr(block, "text"))
    assert "**untrained** model" in text and "--no-train" in text and ctx.data["attention"]["trained"] is False
