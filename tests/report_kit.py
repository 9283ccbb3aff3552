"""What the report-section tests share: a bench record filed for a fake CPU where a section module looks, and the
section's tables and text."""

from __future__ import annotations

import json

from tformer.machine.profile_store import bench_results_name
from tformer.report.doc import Table, Text


def file_record(tmp_path, monkeypatch, section_module, cpu, doc) -> None:
    """``doc`` (a dict, or raw text for a damaged file) as ``cpu``'s bench results, where ``section_module`` reads."""
    (tmp_path / bench_results_name(cpu.model, cpu.physical_cores)).write_text(
        doc if isinstance(doc, str) else json.dumps(doc))
    monkeypatch.setattr(section_module, "RESULTS_DIR", tmp_path)


def tables(sec) -> list[Table]:
    return [b for b in sec.blocks if isinstance(b, Table)]


def texts(sec) -> str:
    return " ".join(b.text for b in sec.blocks if isinstance(b, Text))
