#!/usr/bin/env python3
"""Writes an image folder (train/<class>/*.jpg and test/<class>/*.jpg, torchvision's ImageFolder layout) of
generated photos-like JPEGs: smooth colour fields with texture, so that they compress and decode like
photographs do (ImageNet's average JPEG is about 500x375 and 110 kB), in sizes and aspect ratios drawn per
image. Deterministic for a seed. Needs numpy and PIL (Debian: python3-numpy python3-pil).

  ImageNet-shaped, for decode throughput on a many-core machine (about 40 s on 16 cores, 5.5 GB):
    /usr/bin/python3 scripts/make_image_folder.py .data/imagenet-like --classes 100 --train-per-class 500 \\
        --test-per-class 50 --min-side 300 --max-side 500 --jobs 16
  Small and mixed, for tests:
    /usr/bin/python3 scripts/make_image_folder.py /tmp/folder --classes 4 --train-per-class 250 \\
        --test-per-class 10 --min-side 40 --max-side 120
"""
import argparse
import io
import os
import sys
from multiprocessing import Pool

import numpy as np
from PIL import Image


def image(seed, min_side, max_side):
    rng = np.random.default_rng(seed)
    # A longer side in [min_side, max_side] and an aspect ratio between 3:4 and 4:3, either way up.
    longer = int(rng.integers(min_side, max_side + 1))
    shorter = max(1, int(round(longer * rng.uniform(0.75, 1.0))))
    width, height = (longer, shorter) if rng.random() < 0.75 else (shorter, longer)
    # Low-frequency colour field (a small random image upscaled) plus fine texture.
    coarse = rng.integers(0, 256, (max(2, height // 48), max(2, width // 48), 3), dtype=np.uint8)
    field = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), dtype=np.float32)
    texture = rng.normal(0.0, 12.0, (height, width, 1)).astype(np.float32)
    pixels = np.clip(field + texture, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def write(job):
    path, seed, min_side, max_side, quality = job
    buffer = io.BytesIO()
    image(seed, min_side, max_side).save(buffer, format="JPEG", quality=quality)
    with open(path, "wb") as f:
        f.write(buffer.getvalue())
    return buffer.tell()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--train-per-class", type=int, default=100)
    p.add_argument("--test-per-class", type=int, default=10)
    p.add_argument("--min-side", type=int, default=300, help="shortest longer side, pixels")
    p.add_argument("--max-side", type=int, default=500, help="longest longer side, pixels")
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = p.parse_args(argv)
    jobs = []
    for split, per_class, split_id in (("train", a.train_per_class, 0), ("test", a.test_per_class, 1)):
        for c in range(a.classes):
            folder = os.path.join(a.root, split, f"class{c:04d}")
            os.makedirs(folder, exist_ok=True)
            for i in range(per_class):
                seed = ((a.seed * 2 + split_id) * 100003 + c) * 1000003 + i
                jobs.append((os.path.join(folder, f"{i:06d}.jpg"), seed, a.min_side, a.max_side, a.quality))
    if a.jobs > 1:
        with Pool(a.jobs) as pool:
            sizes = pool.map(write, jobs, chunksize=64)
    else:
        sizes = [write(j) for j in jobs]
    total = sum(sizes)
    print(f"{a.root}: {len(jobs)} JPEGs, {total / 1e6:.1f} MB, {total / max(1, len(jobs)) / 1e3:.0f} kB each on average")


if __name__ == "__main__":
    sys.exit(main())
