#!/usr/bin/env python3
"""PyTorch eager reference for ptrain's single-device comparison.

Trains torchvision's ResNet on the same data, with the same recipe as `ptrain train` (SGD momentum 0.9,
nesterov off, weight decay 5e-4 on every parameter, cosine schedule, random crop with padding 4 and
horizontal flip done on the GPU on uint8 batches, bilinear resize, normalisation), in the precision modes
ptrain offers, and writes one JSON document per run with ptrain's metrics field names, so that reports
put both side by side. Data is decoded once into memory and augmented on the device, as ptrain does: the
comparison measures the training step, not a Python data loader.

  python3 bench/pytorch_reference.py --data .data/cifar10 --dataset cifar10 --model resnet50 \
      --image-size 224 --batch-size 128 --epochs 5 --precision amp-bf16 --metrics-out ref.json
"""
import argparse
import json
import math
import os
import sys
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F
import torchvision

NORMALIZATION = {
    "cifar10": ([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]),
    "fashion-mnist": ([0.2860], [0.3530]),
    "synthetic": ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]),
}


def load_image_folder(root):
    from concurrent.futures import ThreadPoolExecutor
    from PIL import Image

    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    files = []
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        for f in sorted(os.listdir(folder)):
            if f.lower().endswith((".jpg", ".jpeg", ".png")):
                files.append((os.path.join(folder, f), label))

    def decode(item):
        with Image.open(item[0]) as im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8)

    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        images = list(pool.map(decode, files, chunksize=256))
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()
    y = torch.tensor([label for _, label in files], dtype=torch.int64)
    return x, y, classes


def load_dataset(name, path, train):
    if name == "cifar10":
        return load_image_folder(os.path.join(path, "train" if train else "test"))
    if name == "synthetic":
        g = torch.Generator().manual_seed(1 if train else 2)
        n = 50000 if train else 10000
        y = torch.randint(0, 10, (n,), generator=g)
        x = (torch.rand(n, 3, 32, 32, generator=g) * 128 + y.view(-1, 1, 1, 1) * 12).to(torch.uint8)
        return x, y, [str(i) for i in range(10)]
    raise SystemExit(f"--dataset: {name} is not supported by the reference")


def augment(batch_u8, size, mean, std, dtype, train, gen, channels_last):
    x = batch_u8
    b, c, h, w = x.shape
    if train:
        pad = 4
        padded = F.pad(x, (pad, pad, pad, pad))
        dy = torch.randint(0, 2 * pad + 1, (b,), generator=gen).to(x.device)
        dx = torch.randint(0, 2 * pad + 1, (b,), generator=gen).to(x.device)
        rows = (dy.view(b, 1) + torch.arange(h, device=x.device).view(1, h))  # b,h
        cols = (dx.view(b, 1) + torch.arange(w, device=x.device).view(1, w))  # b,w
        idx_b = torch.arange(b, device=x.device).view(b, 1, 1, 1)
        idx_c = torch.arange(c, device=x.device).view(1, c, 1, 1)
        x = padded[idx_b, idx_c, rows.view(b, 1, h, 1), cols.view(b, 1, 1, w)]
        flip = (torch.rand(b, generator=gen) < 0.5).to(x.device)
        x = torch.where(flip.view(b, 1, 1, 1), x.flip(3), x)
    x = x.float().div_(255)
    if size and size != h:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    m = torch.tensor(mean, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, device=x.device).view(1, -1, 1, 1)
    x = ((x - m) / s).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


class NvmlSampler:
    """GPU utilisation and device memory in use, sampled every 100 ms, as ptrain's sampler does."""

    def __init__(self, index):
        self.samples, self.mem_peak, self.stop_flag = [], None, False
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:
            self.nvml = None

    def start(self):
        if self.nvml:
            self.thread = threading.Thread(target=self.loop, daemon=True)
            self.thread.start()

    def loop(self):
        while not self.stop_flag:
            self.samples.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
            used = self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used
            self.mem_peak = used if self.mem_peak is None else max(self.mem_peak, used)
            time.sleep(0.1)

    def stop(self):
        self.stop_flag = True
        if self.nvml:
            self.thread.join()

    def stats(self):
        if not self.samples:
            return None, None, None
        return sum(self.samples) / len(self.samples), max(self.samples), self.mem_peak


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="cifar10")
    p.add_argument("--data", default=".data/cifar10")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--precision", default="fp32",
                   choices=["fp32", "tf32", "fp16", "bf16", "amp-fp16", "amp-bf16"])
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics-out", default="")
    p.add_argument("--no-eval", action="store_true")
    a = p.parse_args()

    device = torch.device("cuda")
    torch.manual_seed(a.seed)
    torch.backends.cudnn.benchmark = True
    tf32 = a.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32

    t0 = time.time()
    xtr, ytr, classes = load_dataset(a.dataset, a.data, True)
    xte, yte, _ = load_dataset(a.dataset, a.data, False)
    mean, std = NORMALIZATION[a.dataset]
    # CIFAR-sized inputs keep torchvision's ImageNet stem when resized to 224, as the classic comparison does.
    model = getattr(torchvision.models, a.model)(num_classes=len(classes)).to(device)
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(a.precision)
    if half is not None:
        model = model.to(half)
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
    amp = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}.get(a.precision)
    in_dtype = half or torch.float32
    steps_per_epoch = len(xtr) // a.batch_size
    total = steps_per_epoch * a.epochs
    if a.max_steps:
        total = min(total, a.max_steps)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, total)))))
    scaler = torch.amp.GradScaler("cuda", enabled=a.precision == "amp-fp16")
    xtr_d, ytr_d = xtr.to(device), ytr.to(device)
    xte_d, yte_d = xte.to(device), yte.to(device)

    torch.cuda.reset_peak_memory_stats()
    sampler = NvmlSampler(torch.cuda.current_device())
    sampler.start()
    gen = torch.Generator().manual_seed(a.seed)
    step, train_seconds, images, epochs_detail = 0, 0.0, 0, []
    final_acc = final_loss = None
    for epoch in range(a.epochs):
        if step >= total:
            break
        model.train()
        perm = torch.randperm(len(xtr), generator=gen).to(device)
        torch.cuda.synchronize()
        e0 = time.time()
        loss_sum = torch.zeros((), device=device)
        n_epoch = 0
        for i in range(steps_per_epoch):
            if step >= total:
                break
            idx = perm[i * a.batch_size:(i + 1) * a.batch_size]
            x = augment(xtr_d[idx], a.image_size, mean, std, in_dtype, True, gen, a.channels_last)
            y = ytr_d[idx]
            with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
                out = model(x)
            loss = F.cross_entropy(out.float(), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            sched.step()
            loss_sum += loss.detach()
            step += 1
            n_epoch += a.batch_size
        torch.cuda.synchronize()
        sec = time.time() - e0
        train_seconds += sec
        images += n_epoch
        rec = {"epoch": epoch, "wall_seconds": sec, "images": n_epoch, "images_per_second": n_epoch / sec,
               "train_loss": (loss_sum.item() * a.batch_size / max(1, n_epoch)), "train_accuracy": None,
               "test_loss": None, "test_accuracy": None}
        if not a.no_eval:
            model.eval()
            correct, lsum = 0, 0.0
            with torch.no_grad():
                for j in range(0, len(xte_d), 500):
                    x = augment(xte_d[j:j + 500], a.image_size, mean, std, in_dtype, False, None, a.channels_last)
                    with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
                        out = model(x)
                    lsum += F.cross_entropy(out.float(), yte_d[j:j + 500], reduction="sum").item()
                    correct += (out.argmax(1) == yte_d[j:j + 500]).sum().item()
            final_acc, final_loss = correct / len(xte_d), lsum / len(xte_d)
            rec["test_accuracy"], rec["test_loss"] = final_acc, final_loss
        epochs_detail.append(rec)
        print(f"[pytorch] {a.precision} epoch {epoch + 1}: {sec:.1f}s {n_epoch / sec:.0f} img/s "
              f"test acc {final_acc}", flush=True)
    sampler.stop()
    util_mean, util_peak, nvml_peak = sampler.stats()
    record = {
        "schema_version": 1, "implementation": "pytorch-eager", "torch_version": torch.__version__,
        "command_line": " ".join(sys.argv), "model": a.model, "dataset": a.dataset,
        "precision": a.precision + ("+channels-last" if a.channels_last else ""), "strategy": "single",
        "device": torch.cuda.get_device_name(), "world_size": 1, "batch_size_per_device": a.batch_size,
        "global_batch_size": a.batch_size, "epochs": a.epochs, "steps": step, "image_size": a.image_size,
        "total_wall_seconds": time.time() - t0, "train_wall_seconds": train_seconds,
        "images_per_second": images / train_seconds if train_seconds else 0,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(), "peak_nvml_used_bytes": nvml_peak,
        "gpu_util_mean": util_mean, "gpu_util_peak": util_peak, "final_test_accuracy": final_acc,
        "final_test_loss": final_loss, "epochs_detail": epochs_detail,
    }
    print(f"[pytorch] {a.precision}: {record['images_per_second']:.0f} img/s, peak allocated "
          f"{record['peak_allocated_bytes'] / 2**30:.2f} GiB, test acc {final_acc}", flush=True)
    if a.metrics_out:
        with open(a.metrics_out, "w") as f:
            json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
