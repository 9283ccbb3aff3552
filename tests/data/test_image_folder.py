"""The image folder reader (one subfolder per class, PNG/JPEG, converted and resized with Pillow), digits fitted to a
model's channels, and the digit captions."""

import numpy as np
import pytest
from PIL import Image

from tformer.core.errors import TformerError
from tformer.data.captions import caption_tokenizer, captions, encode_captions
from tformer.data.images import ImageSet, fit_channels, image_folder


def make_folder(root, classes=("cat", "dog"), per_class=3, size=(12, 10), mode="RGB"):
    for k, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.new(mode, size, color=(40 * k + i,) * len(mode)).save(root / name / f"{i}.png")
    return root


def test_reads_classes_converts_and_resizes(tmp_path):
    folder = make_folder(tmp_path / "pets")
    (folder / "dog" / ".DS_Store").write_bytes(b"x")  # hidden files are skipped
    images = image_folder(folder, channels=1, size=8)
    assert images.images.shape == (6, 1, 8, 8) and images.images.dtype == np.float32
    assert images.classes == ("cat", "dog") and images.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert 0 <= images.images.min() and images.images.max() <= 1
    assert image_folder(folder, channels=3, size=4).images.shape == (6, 3, 4, 4)


@pytest.mark.parametrize("case, message", [
    ("empty", "no class subfolders"),
    ("empty-class", "holds no images"),
    ("text-file", "not a PNG or JPEG"),
    ("broken-png", "cannot be read as an image"),
    ("channels", "not 5"),
])
def test_bad_folders_are_one_line(tmp_path, case, message):
    folder = tmp_path / "data"
    folder.mkdir()
    channels = 3
    if case == "empty-class":
        (folder / "a").mkdir()
    elif case == "text-file":
        make_folder(folder / "x")
        (folder / "x" / "cat" / "notes.txt").write_text("hello")
        folder = folder / "x"
    elif case == "broken-png":
        (folder / "a").mkdir()
        (folder / "a" / "0.png").write_bytes(b"not a png")
    elif case == "channels":
        make_folder(folder / "x")
        folder, channels = folder / "x", 5
    with pytest.raises(TformerError, match=message) as err:
        image_folder(folder, channels=channels, size=8)
    assert "\n" not in str(err.value)


def test_fit_channels_repeats_grey_and_refuses_another_size():
    grey = ImageSet("digits", np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32), np.array([0, 1]),
                    ("0", "1"))
    rgb = fit_channels(grey, 3, 8)
    assert rgb.images.shape == (2, 3, 8, 8) and np.array_equal(rgb.images[:, 2], grey.images[:, 0])
    with pytest.raises(TformerError, match="8x8 pixels but the model reads 224x224"):
        fit_channels(grey, 3, 224)
    with pytest.raises(TformerError, match="cannot become 2"):
        fit_channels(grey, 2, 8)


def test_digit_captions_end_in_the_end_token():
    table = captions(tuple(map(str, range(10))))
    assert "a photo of the digit seven" in table[7] and "a handwritten 7" in table[7]
    tok = caption_tokenizer(table)
    ids, mask = encode_captions(tok, table, 32)
    lengths = mask.sum(-1)
    rows = np.arange(10)[:, None], np.arange(len(table[0]))[None, :]
    assert (ids[rows[0], rows[1], lengths - 1] == tok.eos_id).all()
    assert tok.decode(ids[7, 1, : lengths[7, 1] - 1].tolist()) == "a handwritten 7"
    with pytest.raises(TformerError, match="max_positions"):
        encode_captions(tok, table, 10)
