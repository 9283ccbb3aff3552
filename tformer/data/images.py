"""Real images that ship inside packages, as float arrays a ViT reads.

digits: scikit-learn's copy of the UCI optical-digits set (1,797 scans of handwritten 0-9, 8x8 pixels,
16 grey levels), read from the CSV inside the installed scikit-learn package (hash-pinned; scikit-learn
itself is not imported, nothing downloads).
"""

from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tformer.core.errors import TformerError
from tformer.data.packages import sha256_of

DIGITS_SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"  # sklearn/datasets/data/digits.csv.gz
DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


@dataclass
class ImageSet:
    """Images with one class each. images: (N, C, H, W) float32 in [0, 1]; labels: (N,) int64 in [0, len(classes))."""

    name: str
    images: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: np.ndarray) -> ImageSet:
        return ImageSet(self.name, self.images[index], self.labels[index], self.classes)


def digits_file() -> Path:
    """The digits CSV inside the installed scikit-learn, checked against its pinned sha256."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it (about a second)
    if spec is None or spec.origin is None:
        raise TformerError("the digits images ship with scikit-learn, which is not installed; "
                           "pip install scikit-learn (or reinstall tformer)")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        raise TformerError(f"scikit-learn at {path.parents[2]} has no digits.csv.gz; reinstall scikit-learn")
    if sha256_of(path) != DIGITS_SHA256:
        raise TformerError(f"{path} is not the pinned digits file (sha256 differs); reinstall scikit-learn")
    return path


def digits() -> ImageSet:
    """The 1,797 digits as (N, 1, 8, 8) grey images in [0, 1] (ink is 1), labels 0-9, in the file's order."""
    with gzip.open(digits_file(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)  # 64 pixel values (0-16), then the label
    images = (table[:, :64] / 16.0).reshape(-1, 1, 8, 8)
    return ImageSet("digits", np.ascontiguousarray(images), table[:, 64].astype(np.int64), tuple(map(str, range(10))))


def split(images: ImageSet, val_fraction: float = 0.2, seed: int = 0) -> tuple[ImageSet, ImageSet]:
    """(train, held-out): each class shuffled with ``seed`` and cut at the same fraction, so both sides keep the
    class balance. The same seed gives the same split on every machine."""
    if not 0 < val_fraction < 1:
        raise TformerError(f"the held-out fraction must be between 0 and 1, got {val_fraction}")
    rng = np.random.default_rng(seed)
    train, val = [], []
    for c in range(len(images.classes)):
        members = rng.permutation(np.flatnonzero(images.labels == c))
        cut = round(len(members) * val_fraction)
        val.append(members[:cut])
        train.append(members[cut:])
    order = lambda parts: np.sort(np.concatenate(parts))
    return images.subset(order(train)), images.subset(order(val))
