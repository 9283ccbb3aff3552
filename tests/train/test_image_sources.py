"""The image batch sources: batch shapes and targets, a fixed held-out walk, and the sampler's RNG state making a
resumed run draw exactly the batches an unbroken one does."""

import numpy as np
import torch

from tformer.data.images import ImageSet
from tformer.train.sources import ImageSource, ImageTextSource


def image_set(n=40, classes=4):
    rng = np.random.default_rng(0)
    return ImageSet("toy", rng.random((n, 1, 8, 8), dtype=np.float32), np.arange(n) % classes,
                    tuple(map(str, range(classes))))


def captions_for(classes=4, paraphrases=3, length=6):
    ids = np.arange(classes * paraphrases * length).reshape(classes, paraphrases, length) % 50 + 2
    return ids, np.ones_like(ids)


def test_batches_and_held_out_walk():
    train, val = image_set(), image_set(10)
    src = ImageSource(train, val, seed=1, tokens_per_row=5)
    b = src.next_batch(8)
    assert b.inputs["pixel_values"].shape == (8, 1, 8, 8) and b.targets.shape == (8,)
    walked = list(src.eval_batches(100, 4))
    assert [len(x.targets) for x in walked] == [4, 4, 2]  # the held-out set once, in order
    assert torch.equal(torch.cat([x.targets for x in walked]), src.val_labels)
    assert len(list(src.eval_batches(1, 4))) == 1


def test_shift_moves_each_image_by_at_most_one_pixel():
    one = ImageSet("dot", np.zeros((1, 1, 8, 8), np.float32), np.array([0]), ("0",))
    one.images[0, 0, 4, 4] = 1
    src = ImageSource(one, one, seed=3, tokens_per_row=5, shift=1)
    seen = set()
    for _ in range(40):
        (y, x) = np.argwhere(src.next_batch(1).inputs["pixel_values"][0, 0].numpy() == 1)[0]
        seen.add((int(y), int(x)))
    assert seen <= {(4 + dy, 4 + dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)} and len(seen) > 3


def test_resume_from_the_sampler_state_draws_the_same_batches():
    ids, mask = captions_for()
    for make in (lambda: ImageSource(image_set(), image_set(8), 7, 5, shift=1),
                 lambda: ImageTextSource(image_set(), image_set(8), 7, 11, ids, mask, shift=1)):
        a = make()
        a.next_batch(6)
        state = {k: v.clone() for k, v in a.state_dict().items()}
        expected = [a.next_batch(6) for _ in range(3)]
        b = make()
        b.load_state_dict(state)
        for want, got in zip(expected, (b.next_batch(6) for _ in range(3))):
            assert want.inputs.keys() == got.inputs.keys()
            assert all(torch.equal(want.inputs[k], got.inputs[k]) for k in want.inputs)
            assert torch.equal(want.targets, got.targets)


def test_pairs_caption_each_image_with_its_class():
    ids, mask = captions_for()
    train = image_set()
    src = ImageTextSource(train, image_set(8), 2, 11, ids, mask)
    b = src.next_batch(12)
    assert torch.equal(b.targets, torch.arange(12)) and b.inputs["input_ids"].shape == (12, 6)
    for pixels, caption in zip(b.inputs["pixel_values"], b.inputs["input_ids"]):
        index = next(i for i in range(len(train)) if np.array_equal(train.images[i], pixels.numpy()))
        assert any(torch.equal(caption, c) for c in src.caption_ids[train.labels[index]])
    held = src.held_out_pairs()
    assert torch.equal(held.inputs["input_ids"], src.caption_ids[src.val_labels, src.val_paraphrase])
