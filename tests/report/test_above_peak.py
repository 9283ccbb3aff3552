"""A measured peak above the spec-derived one (a nominal clock hiding the boost clock) is said so on the
same line as the ratio, with the clock the measurement implies: in `tformer bench`, in the report's
machine section and in its summary line. Never a bare "115% of theoretical"."""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace

from tformer.machine import (BenchResult, CPUInfo, DeviceBench, MatmulPoint, cpu_flops_per_cycle, cpu_peaks,
                             vector_units)
from tformer.machine import specs as machine_specs
from tformer.measure.bench import compare

CLOCK = 2.445e9  # the nominal clock a VM reports


def _specs():
    specs = machine_specs.detect()
    cpu = CPUInfo(model="AMD EPYC 9R14", vendor="AuthenticAMD", arch="x86_64", family=25, physical_cores=2,
                  logical_cpus=2, usable_cpus=2, flags={"avx": True, "avx2": True, "fma": True, "avx512f": True},
                  current_clock_hz=CLOCK, clock_source="/proc/cpuinfo", hypervisor=True)
    cpu.simd_bits, cpu.fma_units, cpu.vector_source = vector_units(cpu)
    return replace(specs, cpu=cpu, cpu_peaks=cpu_peaks(cpu), notes=[])


def _point(n, rate):
    t = 2 * n**3 / rate
    return MatmulPoint(device="cpu", dtype="fp32", n=n, flops=2 * n**3, flops_per_s=rate, flops_per_s_best=rate,
                       median_s=t, min_s=t, max_s=t, q1_s=t, q3_s=t, reps=3, calls_per_rep=1)


def _bench(specs, above=1.15):
    theo = specs.cpu_peaks["fp32"].value
    db = DeviceBench(device="cpu", name=specs.cpu.model, threads=2, matmul=[_point(256, 0.5 * theo),
                                                                          _point(1024, above * theo)])
    db.comparisons = compare(db, specs)
    return BenchResult(machine_key="test", created="2026-01-01T00:00:00+00:00", quick=True, torch_version="t",
                       wall_s=1.0, devices=[db])


def test_compare_records_the_formula_per_cycle():
    specs = _specs()
    comp = _bench(specs).devices[0].comparisons[0]
    assert comp.flops_per_cycle == cpu_flops_per_cycle(specs.cpu, "fp32") == 2 * 16 * 2 * 1
    assert comp.ratio > 1 and "implies a 2.812 GHz clock" in comp.above_peak()


def test_bench_output_says_why_above_theoretical(capsys, monkeypatch):
    from tformer.cli.bench import _print

    monkeypatch.setenv("COLUMNS", "400")  # one table row per line: the note and its ratio side by side
    _print(_bench(_specs()), None)
    row = next(line for line in capsys.readouterr().out.splitlines() if "fp32 matmul" in line)
    assert "1.15 (measured above the theoretical peak: it implies a 2.812 GHz clock, the formula used 2.445 GHz" in row


def test_report_machine_section_and_summary_say_why():
    from tformer.report import section_machine
    from tformer.report.build import machine_line

    specs = _specs()
    bench = _bench(specs)
    ctx = SimpleNamespace(specs=specs, bench=bench, torch_device="cpu", is_gpu=False, bench_note="saved profile",
                          measured=bench.to_device("cpu"), theoretical=specs.cpu_device(), data={}, dtype="fp32")
    sec = section_machine.build(ctx)
    text = repr(sec.__dict__)
    assert "115.0% (measured above the theoretical peak: it implies a 2.812 GHz clock" in text
    assert not re.search(r"115\.0%'\]", text)  # never the bare ratio as a cell
    line = machine_line(ctx)
    assert line.startswith("machine: fp32 matmul measured")
    assert ": 115.0% (measured above the theoretical peak: it implies a 2.812 GHz clock" in line
