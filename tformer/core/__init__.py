"""The bottom layer: what every other layer may use, with no torch and nothing heavy.

    errors   TformerError: bad input, shown as one line and exit status 2
    config   ModelConfig (one name per concept), validation, the named presets
    atomic   writers that never leave a half-written file or directory under the final name
    fmt      number formatting: SI prefixes, bytes (GB and GiB), times, percentages
    inputs   user text, names and numbers checked where they enter (UTF-8, not blank, finite in a range)
"""

from tformer.core import atomic, fmt, inputs
from tformer.core.config import ModelConfig, preset, preset_names
from tformer.core.errors import TformerError

__all__ = ["ModelConfig", "TformerError", "atomic", "fmt", "inputs", "preset", "preset_names"]
