"""Section 13, "Adapting and compressing": the ledger's fine-tuning table (trained parameters and training memory per
method, equal to tformer.cost.peft) and, for a decoder, the weight bytes and predicted decode step per weight format;
the benches' measured tables from filed records, one line naming the command for each missing one, one line (no
traceback) for a malformed one, and a sentence instead of the fine-tuning table for a model the methods do not take."""

from types import SimpleNamespace

from report_kit import file_record, tables, texts

from tformer.core.config import ModelConfig
from tformer.core.peft import PeftSpec
from tformer.cost.peft import training_memory
from tformer.machine import resolve_hardware
from tformer.report import section_adapt as S

CPU = SimpleNamespace(model="Fake Adapt CPU", physical_cores=2, logical_cpus=2)
DECODER = ModelConfig(arch="decoder", vocab_size=300, d_model=64, n_heads=4, n_layers=2, d_ff=160, max_positions=96)


def context(config=DECODER):
    return SimpleNamespace(specs=SimpleNamespace(cpu=CPU), data={}, config=config,
                           target=resolve_hardware("a100-80gb-sxm"), options=SimpleNamespace(seq=None, batch=4))


def filed(tmp_path, monkeypatch, doc):
    file_record(tmp_path, monkeypatch, S, CPU, doc)


FINETUNE = {"date": "2026-11-25", "steps": 300, "batch": 16, "rows": [
    {"method": "LoRA r=8", "trainable_parameters": 74_498, "parameters": 22_787_714, "predicted_peak_bytes": 2.1e8,
     "measured_peak_bytes": 1.9e8, "step_s": 0.9, "test_accuracy": 0.875, "test_rows": 512}]}


def test_ledger_tables_follow_the_peft_ledger_and_quantized_bytes(tmp_path, monkeypatch):
    filed(tmp_path, monkeypatch, {"finetune": FINETUNE})
    ctx = context()
    sec = S.build(ctx)
    assert sec.heading == "13. Adapting and compressing"
    peft, quant, measured = tables(sec)
    task = DECODER.replace(task="sequence-classification", n_classes=2)
    rows = ctx.data["adapt"]["peft"]["rows"]
    assert [r["method"] for r in rows][:4] == ["full", "head only", "BitFit", "LoRA r=8 (q, v)"]
    assert rows[3]["memory"] == training_memory(task, PeftSpec(method="lora", rank=8),
                                                S.Workload(phase="train", batch=4, seq=96))
    assert rows[1]["trainable"] == 64 * 2 and peft.rows[0][-1] == "1.00x"  # GPT-2's score: no bias
    assert all(r["vs_full"] < 1 for r in rows[1:5])
    # prompt tuning's 20 positions do not fit beside 96 tokens in a 96-position table: named, not dropped silently
    assert "prompt (20 tokens)" not in [r["method"] for r in rows]
    assert "Not costed here: prompt (20 tokens): 116 positions exceed" in texts(sec)
    formats = ctx.data["adapt"]["quantize"]["rows"]
    assert [r["format"] for r in formats] == ["fp32", "int8", "int4 g32"]  # 160 inputs hold no group of 128
    assert formats[0]["weight_bytes"] > formats[1]["weight_bytes"] > formats[2]["weight_bytes"]
    assert formats[1]["speedup"] > 1 and quant.rows[0][-1] == "1.00x"
    assert measured.rows == [["LoRA r=8", "74,498", "210 MB", "190 MB", "900 ms", "87.5%"]]
    for name in ("quantize", "distill", "prune", "export"):
        assert f"python bench/{name}.py" in texts(sec)


def test_a_malformed_record_is_one_line(tmp_path, monkeypatch):
    filed(tmp_path, monkeypatch, {"finetune": {"date": "x", "rows": [{"method": "full"}]}})
    sec = S.build(context())
    assert "the finetune record" in texts(sec) and "malformed" in texts(sec)
    assert len(tables(sec)) == 2


def test_a_model_the_methods_do_not_take_gets_a_sentence(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "RESULTS_DIR", tmp_path)
    t5 = ModelConfig(arch="encoder-decoder", vocab_size=100, d_model=32, n_heads=2, n_layers=1, d_ff=64,
                     max_positions=64)
    sec = S.build(context(t5))
    assert "the fine-tuning methods take encoders, decoders and ViTs" in texts(sec) and not tables(sec)
