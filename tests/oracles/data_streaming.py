"""torchvision's evaluation transform of ImageNet (Resize(round(size / 0.875)), CenterCrop(size)) on an
image folder, for the streaming folder's tests, with PIL's decoders; and the same crop taken in one
resample, PIL's resize with a box (the region of the original image the centre crop covers), which is
what ptrain computes.

  data_streaming.py make DIR                 writes DIR/train and DIR/test: PNG and JPEG images of several sizes
                                             and aspect ratios, two classes
  data_streaming.py jpegs DIR                JPEGs in every layout libjpeg decodes differently (4:2:0, 4:2:2, 4:4:4,
                                             greyscale, progressive, odd sizes), for the window decode's test
  data_streaming.py eval DIR SPLIT SIZE OUT  every image of DIR/SPLIT, in ImageFolder's order, as uint8 3 x SIZE x
                                             SIZE, back to back in the raw files OUT.torchvision and OUT.box
"""
import os
import sys

import numpy as np
import torchvision.transforms as T
from PIL import Image

SIZES = [(96, 64), (64, 96), (50, 50), (200, 130), (31, 47), (160, 120)]


def make(root):
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in range(2):
            folder = os.path.join(root, split, f"c{c}")
            os.makedirs(folder, exist_ok=True)
            for i, (w, h) in enumerate(SIZES):
                coarse = rng.integers(0, 256, (max(2, h // 32), max(2, w // 32), 3), dtype=np.uint8)
                img = Image.fromarray(coarse).resize((w, h), Image.BICUBIC)
                ext = "png" if i % 2 == 0 else "jpg"
                img.save(os.path.join(folder, f"{i:02d}.{ext}"), quality=95)


def jpegs(root):
    rng = np.random.default_rng(1)
    os.makedirs(root, exist_ok=True)
    layouts = [("420", dict(subsampling=2)), ("422", dict(subsampling=1)), ("444", dict(subsampling=0)),
               ("grey", dict(subsampling=2)), ("progressive", dict(subsampling=2, progressive=True))]
    for name, options in layouts:
        for w, h in [(333, 251), (500, 375), (97, 211)]:
            coarse = rng.integers(0, 256, (h // 16, w // 16, 3), dtype=np.uint8)
            img = Image.fromarray(coarse).resize((w, h), Image.BICUBIC)
            noise = rng.integers(-20, 21, (h, w, 3))
            img = Image.fromarray(np.clip(np.array(img).astype(int) + noise, 0, 255).astype(np.uint8))
            if name == "grey":
                img = img.convert("L")
            img.save(os.path.join(root, f"{name}-{w}x{h}.jpg"), quality=90, **options)


def evaluate(root, split, size, out):
    transform = T.Compose([T.Resize(round(size / 0.875)), T.CenterCrop(size)])
    base = os.path.join(root, split)
    with open(out + ".torchvision", "wb") as tv, open(out + ".box", "wb") as box:
        for c in sorted(os.listdir(base)):
            for name in sorted(os.listdir(os.path.join(base, c))):
                img = Image.open(os.path.join(base, c, name)).convert("RGB")
                tv.write(np.ascontiguousarray(np.array(transform(img)).transpose(2, 0, 1)).tobytes())
                w, h = img.size
                side = size * min(w, h) / round(size / 0.875)
                x0, y0 = (w - side) / 2, (h - side) / 2
                cut = img.resize((size, size), Image.BILINEAR, box=(x0, y0, x0 + side, y0 + side))
                box.write(np.ascontiguousarray(np.array(cut).transpose(2, 0, 1)).tobytes())


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "jpegs":
        jpegs(sys.argv[2])
    else:
        evaluate(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
