"""ViT on scikit-learn's digits, end to end: `tformer train --task image-classification` (vit-digits, the image
defaults), then the held-out accuracy (20% of each class, tformer.data.images.split) and the wall time.

    python bench/vit_digits.py            # target: >= 95% held-out accuracy within 5 minutes on a 2-core CPU
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _image_training import last_eval, main  # noqa: E402  (bench/_image_training.py)


def summarise(out):
    final = last_eval(out)
    return ({"held_out_accuracy": final["val_accuracy"], "val_loss": final["val_loss"]},
            [f"held-out accuracy {final['val_accuracy']:.1%} (val loss {final['val_loss']:.4f})"])


if __name__ == "__main__":
    sys.exit(main("vit_digits", "image-classification", summarise, __doc__))
