"""CLIP on scikit-learn's digits with captions ("a photo of the digit seven", ...), end to end:
`tformer train --task contrastive` (clip-digits, the image defaults), then zero-shot accuracy from text prompts alone
and recall@1/@5 both ways on the held-out pairs (tformer.train.contrastive_eval), and the wall time.

    python bench/clip_digits.py           # target: >= 80% zero-shot accuracy on the held-out digits
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _image_training import main  # noqa: E402  (bench/_image_training.py)


def summarise(out):
    scores = json.loads((out / "contrastive_eval.json").read_text())
    i2t, t2i = scores["image_to_text_recall"], scores["text_to_image_recall"]
    zero_shot = f"zero-shot accuracy {scores['zero_shot_accuracy']:.1%} ({scores['pairs']} held-out images)"
    recall = f"recall@1/@5 image->text {i2t['1']:.1%}/{i2t['5']:.1%}, text->image {t2i['1']:.1%}/{t2i['5']:.1%}"
    return scores, [zero_shot, recall]


if __name__ == "__main__":
    sys.exit(main("clip_digits", "contrastive", summarise, __doc__))
