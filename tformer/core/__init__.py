"""The bottom layer: what every other layer may use, with no torch and nothing heavy.

    errors   TformerError: bad input, shown as one line and exit status 2
    config   ModelConfig (one name per concept), validation, the named presets
    atomic   writers that never leave a half-written file or directory under the final name
    fmt      number formatting: SI prefixes, bytes (GB and GiB), times, percentages
"""

from tformer.core import atomic, fmt
from tformer.core.config import ModelConfig, preset, preset_names
from tformer.core.errors import TformerError

__all__ = ["ModelConfig", "TformerError", "atomic", "fmt", "preset", "preset_names"]
