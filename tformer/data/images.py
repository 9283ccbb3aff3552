"""Real images that ship inside packages, as float arrays a ViT reads.

digits: scikit-learn's copy of the UCI optical-digits set (1,797 scans of handwritten 0-9, 8x8 pixels,
16 grey levels), read from the CSV inside the installed scikit-learn package (hash-pinned; scikit-learn
itself is not imported, nothing downloads). image_folder: a folder of PNG/JPEG files, one subfolder per class,
read with Pillow.
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


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
# Pillow's mode for each channel count it can convert any image to.
PIL_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}


def _mode(channels: int) -> str:
    if channels not in PIL_MODES:
        raise TformerError(f"images can be converted to 1 (grey), 2, 3 (RGB) or 4 (RGBA) channels, not {channels}; "
                           "build the model with --set num_channels=1 or 3")
    return PIL_MODES[channels]


def image_folder(path, channels: int = 3, size: int = 224) -> ImageSet:
    """An image folder as an ImageSet: one subfolder per class (its name is the class; classes sorted by name), each
    holding PNG or JPEG files, every image converted to ``channels`` and resized to ``size`` x ``size`` (bilinear; a
    non-square image is squashed, not cropped). Hidden files are skipped; any other file is refused in one line."""
    mode = _mode(channels)
    root = Path(path)
    if not root.is_dir():
        raise TformerError(f"--data {path}: no such image folder (and not a dataset name); give a folder with one "
                           "subfolder of PNG/JPEG files per class, or --data digits")
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not class_dirs:
        raise TformerError(f"image folder {root} has no class subfolders; put each class's PNG/JPEG files in a "
                           "subfolder named after the class")
    images, labels = [], []
    for label, folder in enumerate(class_dirs):
        files = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
        if not files:
            raise TformerError(f"class folder {folder} holds no images; add PNG/JPEG files or remove the folder")
        for file in files:
            images.append(_read_image(file, mode, size))
            labels.append(label)
    pixels = np.stack(images).astype(np.float32) / 255.0  # (N, H, W[, C])
    pixels = pixels[..., None] if pixels.ndim == 3 else pixels
    return ImageSet(root.name, np.ascontiguousarray(pixels.transpose(0, 3, 1, 2)), np.asarray(labels, dtype=np.int64),
                    tuple(p.name for p in class_dirs))


def _read_image(file: Path, mode: str, size: int) -> np.ndarray:
    # deferred: Pillow loads only when an image folder is read (digits need none)
    from PIL import Image, UnidentifiedImageError

    if not file.is_file() or file.suffix.lower() not in IMAGE_SUFFIXES:
        raise TformerError(f"{file} is not a PNG or JPEG file; an image folder holds only images "
                           f"({', '.join(IMAGE_SUFFIXES)}) in its class subfolders")
    try:
        with Image.open(file) as img:
            img = img.convert(mode)
            if img.size != (size, size):
                img = img.resize((size, size), Image.BILINEAR)
            return np.asarray(img, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise TformerError(f"{file} cannot be read as an image ({type(exc).__name__}); replace or remove it") from None


def fit_channels(images: ImageSet, channels: int, size: int) -> ImageSet:
    """A fixed-size set (digits) for a model reading ``channels`` x ``size`` x ``size``: grey is repeated into RGB
    (as a grey photo is); another size is refused, since upsampling an 8x8 scan adds nothing but cost."""
    _, c, h, w = images.images.shape
    if (h, w) != (size, size):
        raise TformerError(f"{images.name} images are {h}x{w} pixels but the model reads {size}x{size}; "
                           f"--set image_size={h} (with a patch_size that divides it, e.g. --set patch_size=2)")
    if c == channels:
        return images
    if c != 1 or channels not in (3, 4):
        raise TformerError(f"{images.name} images have {c} channel(s) and cannot become {channels}; "
                           f"--set num_channels={c}")
    pixels = np.repeat(images.images, 3, axis=1)
    if channels == 4:
        pixels = np.concatenate([pixels, np.ones_like(images.images)], axis=1)  # opaque alpha
    return ImageSet(images.name, pixels, images.labels, images.classes)


def load_images(data: str, channels: int, size: int) -> ImageSet:
    """``digits`` (scikit-learn's 8x8 scans) or an image folder (``image_folder``), in the model's channels and size."""
    if data == "digits":
        return fit_channels(digits(), channels, size)
    return image_folder(data, channels, size)
