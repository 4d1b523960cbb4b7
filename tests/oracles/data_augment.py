"""Oracle for ptrain::data::augment_batch: the same pipeline written with torchvision.transforms.functional, one
sample at a time, as a torchvision training script would apply it.

  data_augment.py IN.u8 B C H W DRAWS.txt OPTIONS OUT.f32
IN.u8: uint8 B x C x H x W. DRAWS.txt: one line per sample "dy dx flip" (ignored when empty/eval).
OPTIONS: comma-separated key=value: crop (0/1), padding, flip (0/1), resize (0 = keep), eval (0/1),
mean and std (colon-separated floats, empty = none). OUT.f32: float32 result, B x C x H' x W'.
"""
import sys

import numpy as np
import torch
import torchvision.transforms.functional as F
from torchvision.transforms import InterpolationMode


def main():
    in_path, b, c, h, w, draws_path, options, out_path = sys.argv[1:9]
    b, c, h, w = int(b), int(c), int(h), int(w)
    opts = dict(item.split("=", 1) for item in options.split(","))
    images = torch.from_numpy(np.fromfile(in_path, dtype=np.uint8).reshape(b, c, h, w))
    evaluate = opts.get("eval", "0") == "1"
    draws = [] if evaluate else [tuple(int(v) for v in line.split()) for line in open(draws_path) if line.strip()]
    padding = int(opts.get("padding", "4"))
    resize = int(opts.get("resize", "0"))
    mean = [float(v) for v in opts.get("mean", "").split(":") if v]
    std = [float(v) for v in opts.get("std", "").split(":") if v]
    out = []
    for i in range(b):
        img = images[i]
        if not evaluate and opts.get("crop") == "1":
            dy, dx, _ = draws[i]
            img = F.crop(F.pad(img, [padding], fill=0), dy, dx, h, w)
        if not evaluate and opts.get("flip") == "1" and draws[i][2]:
            img = F.hflip(img)
        img = F.convert_image_dtype(img, torch.float32)
        if resize > 0:
            img = F.resize(img, resize, interpolation=InterpolationMode.BILINEAR, antialias=False)
        if mean:
            img = F.normalize(img, mean * (c // len(mean)), std * (c // len(std)))
        out.append(img)
    torch.stack(out).contiguous().numpy().astype(np.float32).tofile(out_path)


if __name__ == "__main__":
    main()
