"""Oracle for ptrain::data::load_image_folder: writes small image folders with PIL and dumps what torchvision's
ImageFolder (default PIL loader, convert("RGB")) loads from them.

  data_image_folder.py make ROOT          image folder with RGB/grey/RGBA/palette PNGs and RGB/grey JPEGs, 5x7
  data_image_folder.py make-mixed ROOT    two classes, one image 6x7 instead of 5x7: ROOT/b/2.png
  data_image_folder.py dump ROOT OUT      OUT/images.u8 (N x 3 x H x W), OUT/labels.txt, OUT/classes.txt,
                                          OUT/paths.txt
"""
import os
import sys

import numpy as np
from PIL import Image


def rgb(rng, h, w):
    return rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def save(img, path, **kw):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    img.save(path, **kw)


def make(root):
    rng = np.random.default_rng(1234)
    h, w = 5, 7
    # Class folders deliberately created out of order and with an uppercase extension and a non-image file.
    save(Image.fromarray(rgb(rng, h, w)), f"{root}/zebra/b.png")
    save(Image.fromarray(rgb(rng, h, w)), f"{root}/zebra/a.PNG")
    save(Image.fromarray(rng.integers(0, 256, size=(h, w), dtype=np.uint8), "L"), f"{root}/zebra/c_grey.png")
    save(Image.fromarray(rng.integers(0, 256, size=(h, w, 4), dtype=np.uint8), "RGBA"), f"{root}/ant/rgba.png")
    pal = Image.fromarray(rgb(rng, h, w)).convert("P", palette=Image.ADAPTIVE, colors=16)
    save(pal, f"{root}/ant/palette.png")
    # Smooth content so that JPEG quality is not the point; the decoders must agree on it anyway.
    yy, xx = np.mgrid[0:h, 0:w]
    smooth = np.stack([yy * 40, xx * 30, (yy + xx) * 20 + 10], axis=-1).astype(np.uint8)
    save(Image.fromarray(smooth), f"{root}/ant/photo.jpg", quality=90)
    save(Image.fromarray(rgb(rng, h, w)), f"{root}/ant/noisy.JPEG", quality=75)
    save(Image.fromarray(smooth[:, :, 1]), f"{root}/mole/grey.jpeg", quality=95)
    # ImageFolder walks class folders recursively: mole/zz.png precedes mole/a_sub/x.png (directory first).
    save(Image.fromarray(rgb(rng, h, w)), f"{root}/mole/zz.png")
    save(Image.fromarray(rgb(rng, h, w)), f"{root}/mole/a_sub/x.png")
    with open(f"{root}/mole/notes.txt", "w") as f:
        f.write("not an image\n")


def make_mixed(root):
    rng = np.random.default_rng(7)
    save(Image.fromarray(rgb(rng, 5, 7)), f"{root}/a/1.png")
    save(Image.fromarray(rgb(rng, 5, 7)), f"{root}/b/1.png")
    save(Image.fromarray(rgb(rng, 6, 7)), f"{root}/b/2.png")
    save(Image.fromarray(rgb(rng, 5, 7)), f"{root}/b/3.png")


def dump(root, out):
    import torchvision

    ds = torchvision.datasets.ImageFolder(root)
    os.makedirs(out, exist_ok=True)
    images = np.stack([np.asarray(ds.loader(path)).transpose(2, 0, 1) for path, _ in ds.samples])
    images.astype(np.uint8).tofile(f"{out}/images.u8")
    with open(f"{out}/labels.txt", "w") as f:
        f.write(" ".join(str(label) for _, label in ds.samples) + "\n")
    with open(f"{out}/classes.txt", "w") as f:
        f.write("\n".join(ds.classes) + "\n")
    with open(f"{out}/paths.txt", "w") as f:
        f.write("\n".join(path for path, _ in ds.samples) + "\n")
    with open(f"{out}/shape.txt", "w") as f:
        f.write(" ".join(str(d) for d in images.shape) + "\n")


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "make":
        make(sys.argv[2])
    elif command == "make-mixed":
        make_mixed(sys.argv[2])
    elif command == "dump":
        dump(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {command}")
