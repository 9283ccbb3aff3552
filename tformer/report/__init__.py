"""`tformer report`: the whole system analysis of a model on this machine, and its pieces.

    from tformer.report import ReportOptions, make_report
    result = make_report(ReportOptions(preset="char-small", quick=True))

build (the runs and the files), context (what is measured once and shared by the sections),
runs (training, profiling and decoding runs), one module per section, doc/markdown/html (one
document, two renderings), plots.
"""

from tformer.report.build import ReportResult, make_report
from tformer.report.context import ReportOptions

__all__ = ["ReportOptions", "ReportResult", "make_report"]
