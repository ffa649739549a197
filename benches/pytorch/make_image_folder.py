#!/usr/bin/env python3
"""Writes Fashion-MNIST's 10,000 test images as an image folder for benches/folder-decode.sh:
ROOT/train/<class>/<index>.<ext> for the first 8,000, ROOT/test/... for the last 2,000.

    python3 benches/pytorch/make_image_folder.py data/fashion-mnist ROOT --format png
    python3 benches/pytorch/make_image_folder.py data/fashion-mnist ROOT --format jpeg --size 256 --colour

--size upscales (bicubic) to SIZE x SIZE, --colour tints each image into RGB (R = v,
G = v / 2, B = 255 - v), so that decoding costs what photos of that size cost.
Needs numpy and Pillow (torchvision installs it).
"""
import argparse
import gzip
import pathlib

import numpy as np
from PIL import Image

CLASSES = ["0-T-shirt", "1-Trouser", "2-Pullover", "3-Dress", "4-Coat", "5-Sandal", "6-Shirt",
           "7-Sneaker", "8-Bag", "9-Ankle-boot"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("idx_dir", type=pathlib.Path)
    p.add_argument("root", type=pathlib.Path)
    p.add_argument("--format", choices=["png", "jpeg"], default="png")
    p.add_argument("--size", type=int, default=28)
    p.add_argument("--colour", action="store_true")
    args = p.parse_args()
    raw = gzip.open(args.idx_dir / "t10k-images-idx3-ubyte.gz").read()
    images = np.frombuffer(raw[16:], np.uint8).reshape(-1, 28, 28)
    labels = np.frombuffer(gzip.open(args.idx_dir / "t10k-labels-idx1-ubyte.gz").read()[8:], np.uint8)
    ext = "png" if args.format == "png" else "jpg"
    for i, (img, label) in enumerate(zip(images, labels)):
        split = "train" if i < 8000 else "test"
        folder = args.root / split / CLASSES[label]
        folder.mkdir(parents=True, exist_ok=True)
        if args.colour:
            v = img.astype(np.uint16)
            pil = Image.fromarray(np.stack([v, v // 2, 255 - v], axis=-1).astype(np.uint8), "RGB")
        else:
            pil = Image.fromarray(img, "L")
        if args.size != 28:
            pil = pil.resize((args.size, args.size), Image.BICUBIC)
        if args.format == "png":
            pil.save(folder / f"{i:05}.{ext}")
        else:
            pil.save(folder / f"{i:05}.{ext}", quality=90)


if __name__ == "__main__":
    main()
