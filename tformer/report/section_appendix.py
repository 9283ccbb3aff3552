"""Appendix: the conventions in force, every op's verdict, and how this report was made (time, load,
versions), so any number can be traced and the run reproduced."""

from __future__ import annotations

import os
import platform

import torch

from tformer import __version__
from tformer.core import fmt
from tformer.report.doc import Section
from tformer.report.section_roofline import appendix_ops


def build(ctx, wall_s: float, load_after: float | None) -> Section:

    sec = Section(None, "Appendix: conventions, every op, and this run", "appendix")
    conv = ctx.ledgers["train"].conventions()
    sec.table(["convention", "statement"], [[k, v] for k, v in conv.items()], caption="Conventions (the ledger's)")
    appendix_ops(ctx, sec)
    load = ctx.load_before
    sec.table(["this run", "value"], [
        ["report wall time", fmt.seconds(wall_s)],
        ["1-minute load average before / after", f"{fmt.num(load)} / {fmt.num(load_after)} on {os.cpu_count()} logical CPUs"],
        ["mode", ("--quick" if ctx.options.quick else "default") + ("" if ctx.options.train else ", --no-train")],
        ["torch threads", str(torch.get_num_threads())],
        ["versions", f"tformer {__version__}, torch {torch.__version__}, Python {platform.python_version()}"],
    ], caption="How this report was made")
    for note in ctx.notes:
        sec.text(note)
    return sec
