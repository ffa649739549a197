#!/usr/bin/env python3
"""The PyTorch side of benches/folder-decode.sh: reads an image folder once as a torchvision user
does, torchvision.datasets.ImageFolder plus a DataLoader, and reports the time and images/s.

    python3 benches/pytorch/imagefolder.py ROOT --channels 1 --workers 2 --repeat 5 --json out.json

ROOT holds train/ and test/ (or val/) folders of class folders, as ember's --dataset folder:ROOT
reads it; both are iterated, as ember decodes both. Each image is opened by PIL, converted to
the channels asked (PIL's convert('L') or convert('RGB'), as ember converts), resized when
--size is given (transforms.Resize, bilinear with antialiasing), and turned into a tensor
(transforms.PILToTensor: uint8, as ember keeps the decoded images), collated into batches of 256.
Each pass is timed from the folder scan (ImageFolder's construction) to the last batch, as ember
times listing, headers and decoding. The first pass warms the page cache and is not reported.
Needs torch and torchvision.
"""
import argparse
import json
import os
import pathlib
import statistics
import time

import torch
import torchvision
from torchvision import transforms


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", type=pathlib.Path)
    p.add_argument("--channels", type=int, choices=[1, 3], default=3)
    p.add_argument("--size", type=int, default=None, help="resize to SIZE x SIZE")
    p.add_argument("--workers", type=int, default=2, help="DataLoader num_workers")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", type=pathlib.Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    mode = "L" if args.channels == 1 else "RGB"

    def loader(path):
        from PIL import Image

        with open(path, "rb") as f:
            return Image.open(f).convert(mode)

    steps = []
    if args.size:
        steps.append(transforms.Resize((args.size, args.size)))
    steps.append(transforms.PILToTensor())
    transform = transforms.Compose(steps)
    splits = [args.root / "train"] + [args.root / n for n in ("test", "val") if (args.root / n).is_dir()][:1]
    images = sum(len(torchvision.datasets.ImageFolder(str(s))) for s in splits)

    def one_pass():
        # Timed from the folder scan on, as ember's figure is.
        start = time.perf_counter()
        datasets = [torchvision.datasets.ImageFolder(str(s), transform=transform, loader=loader) for s in splits]
        seen = 0
        for d in datasets:
            dl = torch.utils.data.DataLoader(
                d, batch_size=args.batch_size, shuffle=False, num_workers=args.workers
            )
            for x, y in dl:
                seen += x.shape[0]
        assert seen == images, (seen, images)
        return time.perf_counter() - start

    one_pass()  # page cache, worker start-up code paths
    seconds = [one_pass() for _ in range(args.repeat)]
    median = statistics.median(seconds)
    record = {
        "tool": "torchvision.datasets.ImageFolder + DataLoader",
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "root": str(args.root),
        "images": images,
        "channels": args.channels,
        "size": args.size,
        "workers": args.workers,
        "threads": args.threads,
        "cpus": os.cpu_count(),
        "seconds": seconds,
        "median_seconds": median,
        "images_per_second": images / median,
    }
    print(
        f"torchvision ImageFolder: {images} images in {median:.3f} s median of {args.repeat} "
        f"(min {min(seconds):.3f}, max {max(seconds):.3f}), {images / median:.0f} images/s, "
        f"{args.workers} workers"
    )
    if args.json:
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
