#!/usr/bin/env python3
"""PyTorch reference for ptrain's comparisons, eager or compiled, on one device or with PyTorch's own
multi-GPU strategies.

Trains torchvision's ResNets (and ptrain's CIFAR ResNets) on the same data, with the same recipe as
`ptrain train` (SGD momentum 0.9, nesterov off, weight decay 5e-4 on every parameter, cosine schedule,
random crop with padding 4 and horizontal flip done on the device on uint8 batches, bilinear resize,
normalisation), and GPT-2 style language models built as ptrain's gpt-* zoo builds them (same module
names and initialisation, AdamW) on ptrain's token datasets, generated exactly as ptrain generates them,
in the precision modes ptrain offers. Each run writes one JSON document with ptrain's run-record field
names (docs/metrics.md), so that reports put both side by side. Data is decoded once into memory and
augmented on the device, as ptrain does: the comparison measures the training step, not a Python data
loader.

PyTorch at its best (all off by default, so that the classic comparison is the eager one):
  --channels-last     NHWC activations and 4-D weights (convolutional models only).
  --compile           torch.compile (default mode) of the model for training; evaluation runs the same
                      module uncompiled, so that eval mode and a short last batch cost no recompilation.
                      PyTorch 2.x only.
  --compile-mode M    torch.compile's mode: default, reduce-overhead (forward and backward replayed as CUDA
                      graphs, the optimizer step outside them), max-autotune or max-autotune-no-cudagraphs.
  --fused-optimizer   torch.optim's fused=True SGD/AdamW step (one kernel over all parameters) instead of
                      the default foreach step; refused where this torch or device has none.
The record says which ran: `compiled` (and `compile.mode`), `fused_optimizer`, `channels_last`.

Strategies (--strategy):
  single  one device.
  dp      torch.nn.DataParallel over all visible GPUs (or --gpus N) from one process. --batch-size is per
          GPU, so each step takes batch x N images. On the CPU DataParallel runs the module itself.
  ddp     DistributedDataParallel, one process per GPU started by torchrun (nccl on CUDA, gloo on the CPU),
          default bucket size. Each rank trains on its share of every epoch, split as torch's
          DistributedSampler(shuffle=True, seed=--seed, drop_last=True) with set_epoch(epoch) does.
  fsdp    FullyShardedDataParallel, FULL_SHARD, auto-wrapped by size (--fsdp-min-params). amp-* modes
          autocast as `single` does (ShardedGradScaler for amp-fp16); pure fp16/bf16 use FSDP's
          MixedPrecision(param, reduce and buffer dtype = the half type), which keeps fp32 sharded parameters
          for the update, unlike `single`'s model.half(). CUDA and PyTorch 2.x only. Parameters of an
          FSDP unit are flattened, so --channels-last changes only the activations' layout.
  zero1   ddp plus torch.distributed.optim.ZeroRedundancyOptimizer around SGD: optimizer state sharded.

Under ddp/fsdp/zero1 only rank 0 writes the JSON. Values that differ per rank are reduced: peak allocated,
reserved and NVML-used bytes are the maximum over ranks, GPU utilisation mean the mean over ranks and its
peak the maximum; throughput counts the images of all ranks and an epoch's time is the slowest rank's.
Evaluation is sharded: each rank evaluates a contiguous share of the test split (every rank runs the same
number of batches, since FSDP's forward is a collective) and the loss and correct counts are all-reduced.

  python3 bench/pytorch_reference.py --data .data/cifar10 --dataset cifar10 --model resnet50 \\
      --image-size 224 --batch-size 128 --epochs 5 --precision amp-bf16 --metrics-out ref.json
  torchrun --nproc_per_node 2 bench/pytorch_reference.py --strategy ddp --data .data/cifar10 \\
      --precision amp-bf16 --epochs 5 --metrics-out ref-ddp.json
  python3 bench/pytorch_reference.py --dataset synthetic --data 256:3x16x16:4 --model resnet18 \\
      --image-size 16 --batch-size 8 --device cpu --max-steps 4 --metrics-out cpu.json
  python3 bench/pytorch_reference.py --model gpt-small --dataset synthetic-tokens --data 640:1024:50257 \\
      --batch-size 16 --optimizer adamw --lr 6e-4 --warmup-steps 10 --max-steps 40 --precision amp-bf16 \\
      --compile --fused-optimizer --metrics-out gpt.json
"""
import argparse
import contextlib
import functools
import json
import math
import os
import re
import resource
import sys
import threading
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

STRATEGIES = ["single", "dp", "ddp", "fsdp", "zero1"]
PROCESS_PER_GPU = ("ddp", "fsdp", "zero1")
EVAL_BATCH = 500
COMPILE_MODES = {  # torch.compile's modes: whether each replays CUDA graphs
    "default": False, "reduce-overhead": True, "max-autotune": True, "max-autotune-no-cudagraphs": False}
SYNTHETIC_DEFAULT = "50000:3x32x32:10"  # ptrain's default synthetic spec

NORMALIZATION = {
    "cifar10": ([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]),
    "fashion-mnist": ([0.2860], [0.3530]),
}


def quantile(values, q):
    """The q-th quantile, linear between the nearest ranks as numpy's and ptrain's metrics::quantile; None for none."""
    if not values:
        return None
    v = sorted(values)
    at = min(max(q, 0.0), 1.0) * (len(v) - 1)
    below = int(math.floor(at))
    above = min(below + 1, len(v) - 1)
    return v[below] + (v[above] - v[below]) * (at - below)


def spread_indices(n, limit):
    """ptrain's data::spread_subset: sample floor(i * N / limit), so that a class-ordered folder keeps its
    classes; None for all of them (limit 0 or not below N)."""
    if limit <= 0 or limit >= n:
        return None
    return torch.arange(limit, dtype=torch.int64) * n // limit


def load_image_folder(root, cache_dir=None, limit=0):
    from concurrent.futures import ThreadPoolExecutor
    from PIL import Image

    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    files = []
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        for f in sorted(os.listdir(folder)):
            if f.lower().endswith((".jpg", ".jpeg", ".png")):
                files.append((os.path.join(folder, f), label))
    # A limited set decodes only the images it keeps: a shortened bench on CIFAR-10 starts in a second.
    keep = spread_indices(len(files), limit)
    if keep is not None:
        files = [files[i] for i in keep.tolist()]
    # Decoding in Python takes 20-odd seconds for CIFAR-10 (the GIL lets few threads work at once): a bench
    # of many runs decodes once and keeps the pixels, keyed by the folder, its files and their times.
    cache = None
    if cache_dir:
        import hashlib
        key = hashlib.sha1(os.path.abspath(root).encode())
        for path, label in files:
            key.update(f"{path}:{label}:{os.stat(path).st_mtime_ns}\n".encode())
        cache = os.path.join(cache_dir, f"images-{key.hexdigest()[:16]}.npz")
        if os.path.exists(cache):
            with np.load(cache) as z:
                return torch.from_numpy(z["x"]), torch.from_numpy(z["y"]), classes

    def decode(item):
        with Image.open(item[0]) as im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8)

    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        images = list(pool.map(decode, files, chunksize=256))
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()
    y = torch.tensor([label for _, label in files], dtype=torch.int64)
    if cache:
        os.makedirs(cache_dir, exist_ok=True)
        temp = f"{cache}.{os.getpid()}.tmp.npz"  # ranks may write at once: each its own file, then a rename
        np.savez(temp, x=x.numpy(), y=y.numpy())
        os.replace(temp, cache)
    return x, y, classes


def parse_synthetic_spec(spec):
    m = re.fullmatch(r"(\d+):(\d+)x(\d+)x(\d+):(\d+)", spec)
    if not m or any(int(g) <= 0 for g in m.groups()):
        raise SystemExit(f"--data: synthetic dataset spec '{spec}': expected N:CxHxW:classes of positive "
                         f"integers, e.g. {SYNTHETIC_DEFAULT}")
    n, c, h, w, classes = (int(g) for g in m.groups())
    if classes > 256:
        raise SystemExit(f"--data: synthetic dataset spec '{spec}': classes must be 1..256")
    return n, c, h, w, classes


def make_synthetic(n, channels, height, width, classes, seed):
    # ptrain's algorithm (src/ptrain/data/synthetic.cpp): a grey level per class plus uniform noise, so the
    # task is learnable and the class balance matches.
    gen = torch.Generator().manual_seed(seed)
    labels = (torch.arange(n, dtype=torch.int64) % classes)[torch.randperm(n, generator=gen)]
    spacing = 255.0 / classes
    amplitude = int(0.75 * spacing + 32.0)
    level = ((labels.float() + 0.5) * spacing).round().to(torch.int16)
    images = torch.empty(n, channels, height, width, dtype=torch.uint8)
    for start in range(0, n, 4096):
        count = min(4096, n - start)
        noise = torch.randint(-amplitude, amplitude + 1, (count, channels, height, width), generator=gen,
                              dtype=torch.int16)
        images[start:start + count] = (level[start:start + count].view(-1, 1, 1, 1) + noise).clamp(0, 255).to(
            torch.uint8)
    return images, labels, [f"class{c}" for c in range(classes)]


def load_idx_gz(path):
    # The gzipped IDX files of (Fashion-)MNIST: magic (2 zero bytes, type 0x08, rank), big-endian sizes, data.
    import gzip
    with gzip.open(path, "rb") as f:
        data = f.read()
    rank = data[3]
    sizes = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return torch.frombuffer(bytearray(data[4 + 4 * rank:]), dtype=torch.uint8).view(*sizes)


SYNTHETIC_TOKENS_DEFAULT = "20000:64:256"  # ptrain's default synthetic-tokens spec
TEXT_DEFAULT_SEQ_LEN = 256
TEXT_TRAIN_FRACTION = 0.9
TOKEN_SUCCESSOR_PROBABILITIES = (0.6, 0.2, 0.1, 0.1)
TOKEN_CHAIN_SEED = 1234


def make_synthetic_tokens(n, seq_len, vocab, seed, chain_seed=TOKEN_CHAIN_SEED):
    """ptrain's make_synthetic_tokens (src/ptrain/data/tokens.cpp), call for call on the same CPU generators, so
    that both frameworks train on the same tokens: a first-order Markov chain whose every token has four
    successors (drawn once from chain_seed) taken with probabilities 0.6, 0.2, 0.1 and 0.1; the first token is
    uniform. Returns int64 sequences [n, seq_len + 1]."""
    successors = torch.randint(vocab, (vocab, len(TOKEN_SUCCESSOR_PROBABILITIES)),
                               generator=torch.Generator().manual_seed(chain_seed), dtype=torch.int64)
    gen = torch.Generator().manual_seed(seed)
    sequences = torch.empty(n, seq_len + 1, dtype=torch.int64)
    sequences[:, 0] = torch.randint(vocab, (n,), generator=gen, dtype=torch.int64)
    u = torch.rand(n, seq_len, generator=gen, dtype=torch.float64)
    cumulative = 0.0
    choice = torch.zeros(n, seq_len, dtype=torch.int64)
    for probability in TOKEN_SUCCESSOR_PROBABILITIES[:-1]:
        cumulative += probability
        choice += u.ge(cumulative).to(torch.int64)
    flat_successors = successors.flatten()
    k = len(TOKEN_SUCCESSOR_PROBABILITIES)
    for t in range(1, seq_len + 1):
        sequences[:, t] = flat_successors.index_select(0, sequences[:, t - 1] * k + choice[:, t - 1])
    return sequences


def parse_token_spec(spec, seq_len):
    fields = (spec or SYNTHETIC_TOKENS_DEFAULT).split(":")
    if len(fields) != 3 or not all(f.isdigit() and int(f) > 0 for f in fields):
        raise SystemExit(f"--data: synthetic-tokens spec '{spec}': expected N:T:V (sequences:tokens per "
                         f"sequence:vocabulary) of positive integers, e.g. {SYNTHETIC_TOKENS_DEFAULT}")
    n, t, vocab = (int(f) for f in fields)
    if vocab < 2:
        raise SystemExit(f"--data: synthetic-tokens spec '{spec}': the vocabulary V needs at least 2 tokens")
    return n, (seq_len if seq_len > 0 else t), vocab


def load_text_tokens(path, seq_len, train):
    """ptrain's load_text_tokens: the file's bytes as tokens (vocabulary 256) in windows of seq_len + 1 bytes
    overlapping by one, over the first 90% of the file for train and the last 10% for test."""
    if not path or not os.path.isfile(path):
        raise SystemExit(f"--data {path}: dataset text needs a text file")
    with open(path, "rb") as f:
        data = f.read()
    t = seq_len if seq_len > 0 else TEXT_DEFAULT_SEQ_LEN
    split = int(len(data) * TEXT_TRAIN_FRACTION)
    begin, end = (0, split) if train else (split, len(data))
    windows = (end - begin - 1) // t
    if windows < 1:
        raise SystemExit(f"--data {path}: {len(data)} bytes, too few for one {t + 1}-byte window in its "
                         f"{'first 90% (train' if train else 'last 10% (test'} split); give a longer file or a "
                         f"smaller --seq-len")
    raw = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.uint8).to(torch.int64)
    return raw[:windows * t + 1].unfold(0, t + 1, t).contiguous()


def load_tokens(name, path, seq_len, train):
    """(inputs [N, T], labels [N, T] = the inputs shifted by one, vocabulary) of a token dataset."""
    if name == "synthetic-tokens":
        n, t, vocab = parse_token_spec(path, seq_len)
        sequences = make_synthetic_tokens(n if train else max(n // 5, 1), t, vocab, 1 if train else 2)
    else:
        sequences, vocab = load_text_tokens(path, seq_len, train), 256
    return sequences[:, :-1].contiguous(), sequences[:, 1:].contiguous(), vocab


def load_dataset(name, path, train, cache_dir=None, limit=0):
    """(samples, labels, classes) with at most `limit` samples spread over the split, as ptrain picks them."""
    if name in ("cifar10", "imagefolder"):
        return load_image_folder(os.path.join(path, "train" if train else "test"), cache_dir, limit)
    x, y, classes = load_whole_dataset(name, path, train)
    keep = spread_indices(len(x), limit)
    return (x, y, classes) if keep is None else (x[keep], y[keep], classes)


def load_whole_dataset(name, path, train):
    if name in ("fashion-mnist", "mnist"):
        # ptrain's default location: where Debian's dataset-fashion-mnist installs the files.
        root = path or "/usr/share/datasets/fashion-mnist"
        split = "train" if train else "t10k"
        images = load_idx_gz(os.path.join(root, f"{split}-images-idx3-ubyte.gz")).unsqueeze(1)
        labels = load_idx_gz(os.path.join(root, f"{split}-labels-idx1-ubyte.gz")).to(torch.int64)
        return images, labels, [str(c) for c in range(10)]
    if name == "synthetic":
        n, c, h, w, classes = parse_synthetic_spec(path)
        # Same split sizes and seeds as ptrain: test split is a fifth of N.
        return make_synthetic(n if train else max(n // 5, 1), c, h, w, classes, 1 if train else 2)
    raise SystemExit(f"--dataset: {name} is not supported by the reference (cifar10, imagefolder, fashion-mnist, mnist, "
                     f"synthetic, synthetic-tokens, text)")


def to_device_without_sync(t, device):
    """A small host tensor on the device without waiting for it: a copy from pageable memory makes the host
    wait until the GPU has finished all the work queued so far (cudaMemcpy, then a stream sync), which in a step
    loop keeps the host from queueing the next step while the GPU runs this one. From pinned memory the copy is
    queued like a kernel; the pinned block stays reserved until the copy has run."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def augment(batch_u8, size, mean, std, dtype, train, gen, channels_last):
    """mean and std: tensors of shape [1, C or 1, 1, 1] on batch_u8's device."""
    x = batch_u8
    b, c, h, w = x.shape
    if train:
        pad = 4
        padded = F.pad(x, (pad, pad, pad, pad))
        # Drawn on the host from the seeded generator (the same numbers whatever the device), queued without a sync.
        dy = to_device_without_sync(torch.randint(0, 2 * pad + 1, (b,), generator=gen), x.device)
        dx = to_device_without_sync(torch.randint(0, 2 * pad + 1, (b,), generator=gen), x.device)
        rows = (dy.view(b, 1) + torch.arange(h, device=x.device).view(1, h))  # b,h
        cols = (dx.view(b, 1) + torch.arange(w, device=x.device).view(1, w))  # b,w
        idx_b = torch.arange(b, device=x.device).view(b, 1, 1, 1)
        idx_c = torch.arange(c, device=x.device).view(1, c, 1, 1)
        x = padded[idx_b, idx_c, rows.view(b, 1, h, 1), cols.view(b, 1, 1, w)]
        flip = to_device_without_sync(torch.rand(b, generator=gen) < 0.5, x.device)
        x = torch.where(flip.view(b, 1, 1, 1), x.flip(3), x)
    # Scaled and normalised before the resize, on the small images, and channels-last before it where asked, as
    # ptrain's augment_batch does (the same values up to float rounding: both steps are affine per channel and
    # bilinear weights sum to one); after it they were three passes over the resized batch.
    x = (x.float().div_(255) - mean) / std
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    if size and size != h:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = x.to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def nvml_handle(nvml, cuda_index):
    """NVML's handle for a CUDA device: CUDA_VISIBLE_DEVICES renumbers CUDA devices but not NVML's, so match
    by PCI bus id or UUID where this PyTorch exposes them, as ptrain does. Ids go as bytes, which every pynvml
    release accepts (newer ones also take str)."""
    props = torch.cuda.get_device_properties(cuda_index)
    if getattr(props, "pci_bus_id", None) is not None:
        bus_id = f"{getattr(props, 'pci_domain_id', 0):08X}:{props.pci_bus_id:02X}:" \
                 f"{getattr(props, 'pci_device_id', 0):02X}.0"
        with contextlib.suppress(Exception):
            return nvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode())
    if getattr(props, "uuid", None) is not None:
        uuid = str(props.uuid)
        uuid = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
        with contextlib.suppress(Exception):
            return nvml.nvmlDeviceGetHandleByUUID(uuid.encode())
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if cuda_index < len(visible):
        entry = visible[cuda_index]
        if entry.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(entry))
        return nvml.nvmlDeviceGetHandleByUUID(entry.encode())
    return nvml.nvmlDeviceGetHandleByIndex(cuda_index)


class NvmlSampler:
    """GPU utilisation and device memory in use over this process's GPUs, sampled every 10 ms, as ptrain's
    sampler does: each sample's utilisation is averaged over the GPUs, its peak is the busiest GPU's."""

    def __init__(self, cuda_indices):
        self.util_means, self.util_peak, self.mem_peak = [], None, None
        self.stopping = threading.Event()
        self.nvml, self.handles, self.thread = None, [], None
        if not cuda_indices:
            return
        try:
            import pynvml
            pynvml.nvmlInit()
            self.handles = [nvml_handle(pynvml, i) for i in cuda_indices]
            self.nvml = pynvml
        except Exception:
            self.nvml, self.handles = None, []

    def start(self):
        if self.nvml:
            self.thread = threading.Thread(target=self.loop, daemon=True)
            self.thread.start()

    def loop(self):
        while not self.stopping.is_set():
            utils = [self.nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self.handles]
            used = max(self.nvml.nvmlDeviceGetMemoryInfo(h).used for h in self.handles)
            self.util_means.append(sum(utils) / len(utils))
            self.util_peak = max(utils) if self.util_peak is None else max(self.util_peak, max(utils))
            self.mem_peak = used if self.mem_peak is None else max(self.mem_peak, used)
            self.stopping.wait(0.01)

    def stop(self):
        self.stopping.set()
        if self.thread:
            self.thread.join()

    def stats(self):
        if not self.util_means:
            return None, None, None
        return sum(self.util_means) / len(self.util_means), self.util_peak, self.mem_peak

    def gpu_name(self):
        if not self.handles:
            return None
        name = self.nvml.nvmlDeviceGetName(self.handles[0])
        return name.decode() if isinstance(name, bytes) else name

    def driver_version(self):
        if not self.nvml:
            return None
        v = self.nvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v


class Context:
    """This process's place in the run: rank, world, the devices it drives, and the reductions over ranks."""

    def __init__(self, device, rank=0, world=1, local_rank=0, dp_device_ids=None):
        self.device, self.rank, self.world, self.local_rank = device, rank, world, local_rank
        self.dp_device_ids = dp_device_ids
        self.distributed = world > 1 or dist.is_initialized()

    @property
    def replicas(self):
        return len(self.dp_device_ids) if self.dp_device_ids else 1

    @property
    def cuda_indices(self):
        if self.device.type != "cuda":
            return []
        return list(self.dp_device_ids) if self.dp_device_ids else [self.device.index]

    def sync(self):
        for i in self.cuda_indices:
            torch.cuda.synchronize(i)

    def reduce(self, values, op):
        """values: list of floats, None as missing; returns the reduction, None where every rank missed."""
        if not self.distributed:
            return list(values)
        missing = -math.inf if op == "max" else 0.0
        t = torch.tensor([missing if v is None else float(v) for v in values], dtype=torch.float64,
                         device=self.device)
        present = torch.tensor([0.0 if v is None else 1.0 for v in values], dtype=torch.float64,
                               device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        dist.all_reduce(present, op=dist.ReduceOp.SUM)
        out, present = t.tolist(), present.tolist()
        result = []
        for v, n in zip(out, present):
            if n == 0:
                result.append(None)
            elif op == "mean":
                result.append(v / n)
            else:
                result.append(v)
        return result

    def barrier(self):
        # A tiny all-reduce rather than dist.barrier(): on nccl it needs no device hint and it orders with the
        # training collectives on the same stream.
        if self.distributed:
            t = torch.zeros(1, device=self.device)
            dist.all_reduce(t)
            self.sync()


def host_peak_rss_bytes():
    with contextlib.suppress(OSError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def finite_or_null(value):
    """JSON has no NaN: non-finite doubles are written as null, as ptrain's run record does."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_or_null(v) for v in value]
    return value


def write_tracebacks_whole():
    """An uncaught exception's traceback leaves in one write: under torchrun every rank's stderr is one log,
    and with PYTHONUNBUFFERED=1 Python writes a traceback a few characters at a time, so two ranks failing
    together tore each other's lines (the bench's summary of the run then read carets, not the exception)."""
    def write_whole(kind, value, tb):
        text = "".join(traceback.format_exception(kind, value, tb)).encode(errors="replace")
        sys.stdout.flush()
        while text:
            text = text[os.write(2, text):]
    sys.excepthook = write_whole


def write_json_atomically(path, record):
    # Replaced atomically, as ptrain's run record is: a reader never sees half a file.
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temp = f"{path}.tmp.{os.getpid()}"
    with open(temp, "w") as f:
        json.dump(finite_or_null(record), f, indent=2, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="cifar10",
                   choices=["cifar10", "imagefolder", "fashion-mnist", "mnist", "synthetic", "synthetic-tokens", "text"])
    p.add_argument("--test-limit", type=int, default=0,
                   help="evaluate on N test samples spread evenly over the test set (as ptrain picks them); 0: all")
    p.add_argument("--train-limit", type=int, default=0,
                   help="train on N samples spread evenly over the training set (as ptrain picks them); 0: all")
    p.add_argument("--cache-dir", default=None,
                   help="keep decoded image folders here for later runs (ptrain bench passes one per bench)")
    p.add_argument("--data", default=None,
                   help="cifar10: folder with train/ and test/ (default .data/cifar10); fashion-mnist, mnist: "
                        "folder of the gzipped IDX files (default /usr/share/datasets/fashion-mnist); synthetic: "
                        f"N:CxHxW:classes (default {SYNTHETIC_DEFAULT}); synthetic-tokens: N:T:V (default "
                        f"{SYNTHETIC_TOKENS_DEFAULT}); text: a text file, its bytes the tokens")
    p.add_argument("--seq-len", type=int, default=0,
                   help="token datasets: tokens per sample, replacing the spec's T; 0: the dataset's default")
    p.add_argument("--model", default="resnet50",
                   help="a torchvision model, resnet20/32/44/56 (CIFAR ResNets), gpt-tiny/small/medium/large/xl, or a "
                        "TorchScript file (.pt)")
    p.add_argument("--gpt-layers", type=int, default=0, help="GPT models: transformer blocks; 0 keeps the size's")
    p.add_argument("--gpt-width", type=int, default=0, help="GPT models: embedding width; 0 keeps the size's")
    p.add_argument("--gpt-heads", type=int, default=0, help="GPT models: attention heads; 0 keeps the size's")
    p.add_argument("--vocab-size", type=int, default=0, help="GPT models: vocabulary; 0: the token dataset's")
    p.add_argument("--weights", default="",
                   help="initial weights: a state dict in a torch.save file (.pth, .pt) or a .safetensors file, "
                        "under the model's state_dict names (as ptrain's --weights)")
    p.add_argument("--image-size", type=int, default=224, help="0: the data's own size")
    p.add_argument("--batch-size", type=int, default=128, help="samples per step on each device")
    p.add_argument("--eval-batch-size", type=int, default=0,
                   help=f"evaluation batch; 0: {EVAL_BATCH} images, or --batch-size sequences for language models")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--precision", default="fp32",
                   choices=["fp32", "tf32", "fp16", "bf16", "amp-fp16", "amp-bf16", "fp8"])
    p.add_argument("--channels-last", action="store_true", help="NHWC memory format (convolutional models)")
    p.add_argument("--no-cudnn-benchmark", dest="cudnn_benchmark", action="store_false", default=True,
                   help="cuDNN's heuristics choose convolution algorithms instead of timing them all (ptrain's "
                        "--no-cudnn-benchmark)")
    p.add_argument("--compile", action="store_true",
                   help="train the model through torch.compile (default mode); PyTorch 2.x only")
    p.add_argument("--compile-mode", default="default", choices=list(COMPILE_MODES),
                   help="torch.compile's mode with --compile: reduce-overhead replays CUDA graphs")
    p.add_argument("--fused-optimizer", action="store_true",
                   help="torch.optim's fused=True step instead of the default (foreach) one")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"])
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--nesterov", dest="nesterov", action="store_true", default=False)
    p.add_argument("--no-nesterov", dest="nesterov", action="store_false")
    p.add_argument("--weight-decay", type=float, default=5e-4, help="SGD: L2 on the gradient; AdamW: decoupled")
    p.add_argument("--beta1", type=float, default=0.9, help="AdamW beta1")
    p.add_argument("--beta2", type=float, default=0.999, help="AdamW beta2")
    p.add_argument("--eps", type=float, default=1e-8, help="AdamW epsilon")
    p.add_argument("--schedule", default="cosine", choices=["constant", "step", "cosine"])
    p.add_argument("--milestones", default="", help="step schedule: epochs where lr is multiplied by --gamma, "
                                                     "comma-separated")
    p.add_argument("--gamma", type=float, default=0.1, help="step schedule factor")
    p.add_argument("--min-lr", type=float, default=0.0, help="cosine schedule floor")
    p.add_argument("--warmup-epochs", type=float, default=0.5)
    p.add_argument("--warmup-steps", type=int, default=0,
                   help="linear warm-up in optimizer steps, instead of --warmup-epochs; 0: off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics-out", default="")
    p.add_argument("--no-eval", action="store_true")
    p.add_argument("--log-every", type=int, default=0,
                   help="print the step and the images per second since the last print every N steps (0: per epoch "
                        "only), so that a slow run is told from a stuck one")
    p.add_argument("--strategy", default="single", choices=STRATEGIES)
    p.add_argument("--gpus", type=int, default=0, help="dp: number of GPUs (default: all visible)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (ddp/fsdp/zero1: cuda:LOCAL_RANK)")
    p.add_argument("--fsdp-min-params", type=float, default=1e6,
                   help="fsdp: parameters a module must hold to become its own FSDP unit")
    p.add_argument("--augment", dest="augment", action="store_true", default=True,
                   help="random crop (padding 4) and horizontal flip (default)")
    p.add_argument("--no-augment", dest="augment", action="store_false")
    p.add_argument("--norm", default="batch", choices=["batch", "group"],
                   help="group: GroupNorm instead of BatchNorm, a model without batch statistics, so that "
                        "strategies can be compared exactly (tests)")
    p.add_argument("--dump-params", default="",
                   help="debug: save the final state_dict; rank 0 writes FILE, rank r>0 FILE.rank<r>")
    a = p.parse_args(argv)
    if a.data is None:
        a.data = {"synthetic": SYNTHETIC_DEFAULT, "cifar10": ".data/cifar10",
                  "synthetic-tokens": SYNTHETIC_TOKENS_DEFAULT}.get(a.dataset, "")
    for flag, value in (("--batch-size", a.batch_size), ("--epochs", a.epochs)):
        if value <= 0:
            p.error(f"{flag} must be positive, got {value}")
    for flag, value in (("--max-steps", a.max_steps), ("--gpus", a.gpus), ("--image-size", a.image_size),
                        ("--seq-len", a.seq_len), ("--train-limit", a.train_limit), ("--test-limit", a.test_limit),
                        ("--warmup-steps", a.warmup_steps), ("--eval-batch-size", a.eval_batch_size),
                        ("--gpt-layers", a.gpt_layers), ("--gpt-width", a.gpt_width), ("--gpt-heads", a.gpt_heads),
                        ("--vocab-size", a.vocab_size)):
        if value < 0:
            p.error(f"{flag} must not be negative, got {value}")
    try:
        a.milestones = [int(m) for m in a.milestones.split(",") if m.strip()]
    except ValueError:
        p.error(f"--milestones '{a.milestones}': expected epochs as comma-separated integers")
    if a.milestones != sorted(a.milestones):
        p.error("--milestones must be increasing")
    if a.min_lr > a.lr:
        p.error("--min-lr must not exceed --lr")
    language_model = is_language_model(a.model)
    tokens = a.dataset in ("synthetic-tokens", "text")
    if language_model != tokens:
        p.error(f"--model {a.model} is a language model: it needs a token dataset (--dataset synthetic-tokens or "
                f"text), not {a.dataset}" if language_model else
                f"--model {a.model} is an image model: it cannot train on the token dataset {a.dataset}")
    if language_model and a.channels_last:
        p.error(f"--channels-last: {a.model} has no convolutions (NHWC applies to convolutional models)")
    if a.compile_mode != "default" and not a.compile:
        p.error(f"--compile-mode {a.compile_mode} needs --compile")
    if a.compile:
        if not hasattr(torch, "compile"):
            p.error(f"--compile needs torch.compile (PyTorch 2.x); this is torch {torch.__version__}")
        if a.strategy in ("dp", "fsdp"):
            p.error(f"--compile: the reference compiles single, ddp and zero1 runs, not --strategy {a.strategy}")
    return p, a


def resolve_device(p, a):
    spec = a.device
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return torch.device("cpu")
    if not re.fullmatch(r"cuda(:\d+)?", spec):
        p.error(f"--device: '{a.device}' is not one of auto, cpu, cuda, cuda:N")
    if not torch.cuda.is_available():
        p.error(f"--device {a.device}: CUDA is not available to this PyTorch ({torch.__version__})")
    index = int(spec.split(":")[1]) if ":" in spec else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        p.error(f"--device {a.device}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return torch.device("cuda", index)


def setup(p, a):
    """Checks the strategy against the machine, joins the process group where there is one."""
    if a.strategy == "fsdp":
        major = int(re.match(r"(\d+)", torch.__version__).group(1))
        on_cpu = a.device == "cpu" or (a.device == "auto" and not torch.cuda.is_available())
        if major < 2 or on_cpu or not torch.cuda.is_available():
            p.error(f"--strategy fsdp needs CUDA and PyTorch 2.x (this is torch {torch.__version__}, "
                    f"{'CUDA available' if torch.cuda.is_available() else 'no CUDA'}, --device {a.device})")
    if a.gpus and a.strategy != "dp":
        p.error("--gpus applies to --strategy dp; ddp, fsdp and zero1 take one GPU per torchrun process "
                "(torchrun --nproc_per_node N)")
    device = resolve_device(p, a)
    if device.type == "cpu" and a.precision in ("tf32", "fp16", "amp-fp16", "fp8"):
        p.error(f"--precision {a.precision} needs a CUDA device (on the CPU: fp32, bf16, amp-bf16)")
    if a.precision == "fp8":
        if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
            p.error(f"--precision fp8 needs torch._scaled_mm and float8 dtypes; this is torch {torch.__version__}")
        if torch.cuda.get_device_capability(device) < (8, 9):
            p.error("--precision fp8 needs a GPU of compute capability 8.9 or later (Ada, Hopper)")

    if a.strategy in PROCESS_PER_GPU:
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            p.error(f"--strategy {a.strategy}: RANK/WORLD_SIZE are unset; start one process per GPU with "
                    f"torchrun --nproc_per_node N {sys.argv[0]} --strategy {a.strategy} ...")
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        if device.type == "cuda":
            if ":" in a.device:
                p.error(f"--device {a.device}: under --strategy {a.strategy} each process takes "
                        f"cuda:LOCAL_RANK; pass --device cuda")
            if local_rank >= torch.cuda.device_count():
                p.error(f"--strategy {a.strategy}: LOCAL_RANK {local_rank} but only "
                        f"{torch.cuda.device_count()} CUDA device(s) visible")
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return Context(device, rank, world, local_rank)

    dp_ids = None
    if a.strategy == "dp" and device.type == "cuda":
        n = a.gpus or (torch.cuda.device_count() - device.index)
        if device.index + n > torch.cuda.device_count():
            p.error(f"--gpus {n}: only {torch.cuda.device_count() - device.index} CUDA device(s) visible "
                    f"from {device}")
        dp_ids = list(range(device.index, device.index + n))
    elif a.strategy == "dp" and a.gpus > 1:
        p.error(f"--gpus {a.gpus}: DataParallel on the CPU runs the module once; use --device cuda")
    return Context(device, dp_device_ids=dp_ids)


CIFAR_RESNET_DEPTHS = {"resnet20": 20, "resnet32": 32, "resnet44": 44, "resnet56": 56}


class CifarResNet(torch.nn.Module):
    """He et al.'s CIFAR ResNets as ptrain builds them (src/ptrain/models/resnet.cpp): a 3x3 stem of 16
    channels, three stages of basic blocks (16, 32, 64 channels), 1x1 convolution shortcuts where the
    shape changes, torchvision's initialisation."""

    def __init__(self, depth, in_channels, num_classes, norm_layer):
        super().__init__()
        from torchvision.models.resnet import BasicBlock, conv1x1, conv3x3
        blocks_per_stage = (depth - 2) // 6
        self.conv1 = conv3x3(in_channels, 16)
        self.bn1 = norm_layer(16)
        self.relu = torch.nn.ReLU(inplace=True)
        inplanes = 16
        for stage, planes in enumerate((16, 32, 64)):
            blocks = []
            for b in range(blocks_per_stage):
                stride = 2 if stage > 0 and b == 0 else 1
                shortcut = None
                if stride != 1 or inplanes != planes:
                    shortcut = torch.nn.Sequential(conv1x1(inplanes, planes, stride), norm_layer(planes))
                blocks.append(BasicBlock(inplanes, planes, stride, shortcut, norm_layer=norm_layer))
                inplanes = planes
            setattr(self, f"layer{stage + 1}", torch.nn.Sequential(*blocks))
        self.avgpool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (torch.nn.BatchNorm2d, torch.nn.GroupNorm)):
                torch.nn.init.ones_(m.weight)
                torch.nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ptrain's GPT sizes (src/ptrain/models/zoo.cpp): layers, width, heads; --gpt-layers/-width/-heads reshape them.
GPT_SIZES = {"gpt-tiny": (2, 64, 4), "gpt-small": (12, 768, 12), "gpt-medium": (24, 1024, 16),
             "gpt-large": (36, 1280, 20), "gpt-xl": (48, 1600, 25)}
GPT_INIT_STD = 0.02  # GPT-2's initialiser range
GPT_INIT_CHUNK = 1 << 20
GPT_INIT_SEED_STRIDE = 0x9E3779B97F4A7C15


def is_language_model(name):
    return name.startswith("gpt-")


def to_float8(x, dtype):
    """Tensorwise dynamic scaling as torchao's Float8Linear (and ptrain's kernels/fp8_linear.cpp): x scaled by its
    own amax into the format's range and cast; returns the FP8 data and the inverse scale _scaled_mm takes."""
    fp8_max = torch.finfo(dtype).max
    amax = x.abs().max().float()
    scale = torch.full((), fp8_max, dtype=torch.float32, device=x.device) / amax.clamp(min=1e-12)
    data = (x.contiguous().float() * scale).clamp(-fp8_max, fp8_max).to(dtype)
    return data, scale.reciprocal()


class Fp8Matmul(torch.autograd.Function):
    """x [rows, in] @ w [out, in]^T + b through cuBLASLt's FP8 GEMMs: x and w in E4M3, the output gradient in
    E5M2, each scaled by its own amax; the bias (None for none) in the forward GEMM's epilogue, in bf16; the
    backward reuses the forward's FP8 x and w, and sums the bias gradient from the bf16 output gradient in fp32.
    _scaled_mm takes its first operand row-major and its second column-major. ptrain's recipe, operand for
    operand."""

    @staticmethod
    def forward(ctx, x, w, b):
        x8, x_inv = to_float8(x, torch.float8_e4m3fn)
        w8, w_inv = to_float8(w, torch.float8_e4m3fn)
        ctx.save_for_backward(x8, x_inv, w8, w_inv)
        ctx.dtypes = (x.dtype, w.dtype, None if b is None else b.dtype)
        return torch._scaled_mm(x8, w8.t(), scale_a=x_inv, scale_b=w_inv,
                                bias=None if b is None else b.to(torch.bfloat16), out_dtype=torch.bfloat16,
                                use_fast_accum=True)

    @staticmethod
    def backward(ctx, grad):
        x8, x_inv, w8, w_inv = ctx.saved_tensors
        g8, g_inv = to_float8(grad, torch.float8_e5m2)
        grad_x = torch._scaled_mm(g8, w8.t().contiguous().t(), scale_a=g_inv, scale_b=w_inv, out_dtype=ctx.dtypes[0])
        grad_w = torch._scaled_mm(g8.t().contiguous(), x8.t().contiguous().t(), scale_a=g_inv, scale_b=x_inv,
                                  out_dtype=ctx.dtypes[1])
        grad_b = None if ctx.dtypes[2] is None else grad.sum(0, dtype=torch.float32).to(ctx.dtypes[2])
        return grad_x, grad_w, grad_b


class GptLinear(torch.nn.Module):
    """nn.Linear without the draw on construction, as ptrain's GPT Linear: the initialisation draws each weight
    once, and the global generator must be where ptrain's is when it does. With fp8 (--precision fp8) its product
    runs in FP8 where rows, in and out features are multiples of 16 (else in bf16 under autocast), the bias
    in the FP8 GEMM's epilogue, as ptrain does."""

    def __init__(self, fan_in, fan_out, bias=True):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(fan_out, fan_in))
        self.bias = torch.nn.Parameter(torch.empty(fan_out)) if bias else None
        self.fp8 = False

    def forward(self, x):
        out_features, in_features = self.weight.shape
        rows = x.numel() // in_features
        if self.fp8 and x.is_cuda and rows % 16 == 0 and in_features % 16 == 0 and out_features % 16 == 0:
            y = Fp8Matmul.apply(x.reshape(rows, in_features), self.weight, self.bias)
            return y.view(*x.shape[:-1], out_features)
        return F.linear(x, self.weight, self.bias)


def causal_attention(q, k, v):
    # What ptrain's compat::causal_attention does: fused on PyTorch 2.x, spelled out before.
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.size(-2)
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return torch.matmul(torch.softmax(scores.masked_fill(future, float("-inf")), -1), v)


class GptAttention(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = GptLinear(width, 3 * width)
        self.c_proj = GptLinear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.c_attn(x).split(c, dim=2))
        return self.c_proj(causal_attention(q, k, v).transpose(1, 2).contiguous().view(b, t, c))


class GptMlp(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.c_fc = GptLinear(width, 4 * width)
        self.c_proj = GptLinear(4 * width, width)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GptBlock(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(width, eps=1e-5)
        self.attn = GptAttention(width, heads)
        self.ln_2 = torch.nn.LayerNorm(width, eps=1e-5)
        self.mlp = GptMlp(width)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def fill_normal_(t, std):
    """ptrain's fill_normal: N(0, std^2) in chunks of 2^20 elements, each from a CPU generator of its own seeded
    by one draw from the global generator, so that the same seed gives ptrain's values."""
    base = int(torch.randint(2**63 - 1, (1,), dtype=torch.int64).item())
    flat = t.view(-1)
    for c in range(-(-flat.numel() // GPT_INIT_CHUNK)):
        gen = torch.Generator().manual_seed((base + c * GPT_INIT_SEED_STRIDE) % 2**64)
        flat[c * GPT_INIT_CHUNK:(c + 1) * GPT_INIT_CHUNK].normal_(0.0, std, generator=gen)


class Gpt(torch.nn.Module):
    """ptrain's GPT (src/ptrain/models/gpt.cpp), module for module under the same names (wte, wpe,
    h.N.{ln_1,attn.c_attn,attn.c_proj,ln_2,mlp.c_fc,mlp.c_proj}, ln_f, lm_head): pre-LayerNorm blocks, tanh
    GELU, learned positions, an untied head without bias, and GPT-2's initialisation drawn as ptrain draws it
    (the same modules built in the same order, then each weight filled in named_parameters order), so that the
    same --seed starts both frameworks from the same weights."""

    def __init__(self, vocab, seq_len, layers, width, heads):
        super().__init__()
        if width % heads:
            raise SystemExit(f"--gpt-width {width} must be a multiple of the {heads} heads (--gpt-heads)")
        self.wte = torch.nn.Embedding(vocab, width)
        self.wpe = torch.nn.Embedding(seq_len, width)
        self.h = torch.nn.ModuleList(GptBlock(width, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(width, eps=1e-5)
        self.lm_head = torch.nn.Linear(width, vocab, bias=False)
        residual_std = GPT_INIT_STD / math.sqrt(2.0 * layers)  # one for each residual addition
        with torch.no_grad():
            for name, p in self.named_parameters():
                is_bias = name.endswith(".bias")
                if name.startswith("ln_f.") or ".ln_1." in name or ".ln_2." in name:
                    p.zero_() if is_bias else p.fill_(1.0)
                elif is_bias:
                    p.zero_()
                else:
                    fill_normal_(p, residual_std if "c_proj.weight" in name else GPT_INIT_STD)

    def forward(self, tokens):
        positions = torch.arange(tokens.size(1), device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build_gpt(a, vocab, seq_len):
    if a.model not in GPT_SIZES:
        raise SystemExit(f"--model {a.model}: ptrain's GPT sizes are {', '.join(GPT_SIZES)}")
    layers, width, heads = GPT_SIZES[a.model]
    if a.vocab_size and a.vocab_size < vocab:
        raise SystemExit(f"--vocab-size {a.vocab_size} is smaller than the {vocab} tokens of the data")
    return Gpt(a.vocab_size or vocab, seq_len, a.gpt_layers or layers, a.gpt_width or width, a.gpt_heads or heads)


SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                      "U8": torch.uint8, "BOOL": torch.bool}


def read_weights(path):
    """A state dict from a torch.save file (.pth, .pt) or a .safetensors file (ptrain writes both)."""
    if not os.path.isfile(path):
        raise SystemExit(f"--weights {path}: no such file")
    if not path.endswith(".safetensors"):
        state = torch.load(path, map_location="cpu")
        return state.get("state_dict", state) if isinstance(state, dict) else state
    with open(path, "rb") as f:
        data = f.read()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    state = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise SystemExit(f"--weights {path}: tensor '{name}' has dtype {info['dtype']}, unknown to the reference")
        raw = bytearray(data[8 + size + lo:8 + size + hi])
        flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        state[name] = flat.reshape(info["shape"])
    return state


def load_weights(model, path):
    # Strict, as ptrain's --weights: every key present, none left over; values take each parameter's dtype.
    try:
        model.load_state_dict(read_weights(path), strict=True)
    except RuntimeError as e:
        raise SystemExit(f"--weights {path}: {str(e).splitlines()[0]} ({e})")


def forward_flops_per_sample(model, data):
    """The matrix products and convolutions of one sample's forward, two FLOPs a multiply-add, as ptrain's
    Model::forward_flops counts them (docs/metrics.md, model_flops_per_step): a GPT's weight matrices once a token
    and its attention's two products over the whole T x T square; other models' Conv2d and Linear layers at the
    shapes a one-sample forward shows them (forward hooks). None for a TorchScript module, as ptrain."""
    if isinstance(model, torch.jit.ScriptModule):
        return None
    if data.tokens:
        t = data.seq_len
        total = sum(2 * m.weight.numel() * t for m in model.modules() if isinstance(m, (GptLinear, torch.nn.Linear)))
        return total + sum(4 * t * t * m.c_proj.weight.shape[0] for m in model.modules() if isinstance(m, GptAttention))
    total = [0]

    def conv(m, inputs, output):
        total[0] += 2 * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1] * output.numel()

    def linear(m, inputs, output):
        total[0] += 2 * m.in_features * output.numel()

    hooks = [m.register_forward_hook(conv if isinstance(m, torch.nn.Conv2d) else linear) for m in model.modules()
             if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, data.channels, data.image_size, data.image_size))
    model.train(was_training)
    for h in hooks:
        h.remove()
    return total[0]


def build_model(a, ctx, data, half):
    # Same seed on every rank, and built on the CPU, so that all ranks (and CPU and GPU runs) start alike.
    torch.manual_seed(a.seed)
    norm_layer = (lambda c: torch.nn.GroupNorm(min(32, c), c)) if a.norm == "group" else torch.nn.BatchNorm2d
    if a.model.endswith((".pt", ".pth")):
        # A TorchScript export, the very module `ptrain train --model FILE.pt` trains. Both run its graph op by
        # op through the interpreter (ptrain turns the executor's optimisations off, so does this).
        if a.strategy == "fsdp":
            raise SystemExit(f"--model {a.model}: FullyShardedDataParallel does not wrap TorchScript modules")
        torch._C._set_graph_executor_optimize(False)
        model = torch.jit.load(a.model, map_location="cpu")
    elif data.tokens:
        model = build_gpt(a, data.vocab, data.seq_len)
    elif a.model in CIFAR_RESNET_DEPTHS:
        model = CifarResNet(CIFAR_RESNET_DEPTHS[a.model], data.channels, len(data.classes), norm_layer)
    else:
        import torchvision  # only here: language models and their tests start without it
        factory = getattr(torchvision.models, a.model, None)
        if factory is None or not callable(factory):
            raise SystemExit(f"--model: neither torchvision, the CIFAR ResNets nor ptrain's GPT sizes have a model "
                             f"'{a.model}'")
        if data.channels != 3:
            raise SystemExit(f"--model {a.model}: torchvision's models take 3 channels, the data has {data.channels}")
        kwargs = {"num_classes": len(data.classes)}
        if a.norm == "group":
            kwargs["norm_layer"] = norm_layer
        model = factory(**kwargs)
    if a.weights:
        load_weights(model, a.weights)
    model.ptrain_forward_flops = forward_flops_per_sample(model, data)  # before any wrapper or dtype
    if half is not None and a.strategy != "fsdp":
        model = model.to(half)
    model = model.to(ctx.device)
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)

    if a.strategy == "dp":
        # Without CUDA, DataParallel is the module itself; with CUDA present it would insist on cuda:0.
        if ctx.device.type == "cuda" or not torch.cuda.is_available():
            model = torch.nn.DataParallel(model, device_ids=ctx.dp_device_ids)
    elif a.strategy in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    elif a.strategy == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
        mixed = MixedPrecision(param_dtype=half, reduce_dtype=half, buffer_dtype=half) if half else None
        model = FullyShardedDataParallel(
            model, sharding_strategy=ShardingStrategy.FULL_SHARD,
            auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=int(a.fsdp_min_params)),
            mixed_precision=mixed, device_id=ctx.device)
    return model


def build_optimizer(p, a, ctx, model):
    """ptrain's optimizers: SGD (L2 weight decay added to the gradient, as torch.optim.SGD) or AdamW (decoupled
    decay), over every parameter. By default the step is the one torch picks (foreach on CUDA);
    --fused-optimizer asks for the fused kernel and is refused where this torch or device has none."""
    if a.optimizer == "sgd":
        cls, hyper = torch.optim.SGD, dict(lr=a.lr, momentum=a.momentum, nesterov=a.nesterov,
                                           weight_decay=a.weight_decay)
    else:
        cls, hyper = torch.optim.AdamW, dict(lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                                             weight_decay=a.weight_decay)
    if a.fused_optimizer:
        hyper["fused"] = True
    try:
        if a.strategy == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, **hyper)
        return cls(model.parameters(), **hyper)
    except (TypeError, RuntimeError, ValueError) as e:
        if not a.fused_optimizer:
            raise
        p.error(f"--fused-optimizer: torch {torch.__version__} has no fused {cls.__name__} for these parameters "
                f"on {ctx.device} ({str(e).splitlines()[0]})")


def build_scaler(a):
    enabled = a.precision == "amp-fp16"
    if a.strategy == "fsdp":
        # Gradients are sharded, so the overflow check must be agreed over ranks.
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
        return ShardedGradScaler(enabled=enabled)
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)


def dump_params(a, ctx, model, path):
    if a.strategy == "fsdp":
        from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType
        with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                                                      FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
            state = model.state_dict()
        if ctx.rank != 0:
            return
    else:
        state = getattr(model, "module", model).state_dict()
    state = {k: v.detach().cpu().clone() for k, v in state.items()}
    torch.save(state, path if ctx.rank == 0 else f"{path}.rank{ctx.rank}")


class Data:
    """The training and test splits on the device, and how a batch of them becomes the model's input."""

    def __init__(self, a, ctx):
        self.tokens = a.dataset in ("synthetic-tokens", "text")
        if self.tokens:
            xtr, ytr, self.vocab = load_tokens(a.dataset, a.data, a.seq_len, True)
            xte, yte, _ = load_tokens(a.dataset, a.data, a.seq_len, False)
            keep_train, keep_test = spread_indices(len(xtr), a.train_limit), spread_indices(len(xte), a.test_limit)
            if keep_train is not None:
                xtr, ytr = xtr[keep_train], ytr[keep_train]
            if keep_test is not None:
                xte, yte = xte[keep_test], yte[keep_test]
            self.classes, self.channels, self.image_size = [], 0, 0
            self.seq_len = max(xtr.shape[1], xte.shape[1])  # ptrain's model_spec: the longer split's
        else:
            xtr, ytr, self.classes = load_dataset(a.dataset, a.data, True, a.cache_dir, a.train_limit)
            xte, yte, _ = load_dataset(a.dataset, a.data, False, a.cache_dir, a.test_limit)
            self.channels, self.image_size, self.seq_len, self.vocab = xtr.shape[1], a.image_size or xtr.shape[2], 0, 0
        self.train_size = len(xtr)
        self.xtr, self.ytr = xtr.to(ctx.device), ytr.to(ctx.device)
        self.xte, self.yte = xte.to(ctx.device), yte.to(ctx.device)
        # One value stands for every channel, as in ptrain (synthetic data may have any number of channels).
        mean, std = NORMALIZATION.get(a.dataset, ([0.5], [0.5]))
        # On the device once: made per batch from Python lists, each would be a copy the host waits for.
        self.mean = torch.tensor(mean, device=ctx.device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=ctx.device).view(1, -1, 1, 1)
        self.eval_batch = a.eval_batch_size or (a.batch_size if self.tokens else EVAL_BATCH)

    def batch(self, x_u8, train, in_dtype, gen, a):
        if self.tokens:
            return x_u8
        return augment(x_u8, self.image_size, self.mean, self.std, in_dtype, train and a.augment, gen,
                       a.channels_last)


def predictions(out, y):
    """Language models predict every position's next token: logits [B, T, V] and labels [B, T] flatten to
    [B*T, V] and [B*T], so that loss and accuracy are per predicted token, as ptrain computes them."""
    return (out.flatten(0, -2), y.flatten()) if out.dim() > 2 else (out, y)


def compiled_graphs():
    """How many graphs torch.compile built in this process (None where this torch does not say)."""
    with contextlib.suppress(Exception):
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    return None


def main(argv=None):
    p, a = parse_args(argv)
    ctx = setup(p, a)
    lead = ctx.rank == 0
    cuda = ctx.device.type == "cuda"
    torch.backends.cudnn.benchmark = a.cudnn_benchmark
    tf32 = a.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32

    t0 = time.time()
    data = Data(a, ctx)
    data_seconds = time.time() - t0
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(a.precision)
    # fp8: amp-bf16 around the FP8 products of GPT's projections (GptLinear); the head and convolutions in bf16.
    amp = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16, "fp8": torch.bfloat16}.get(a.precision)
    in_dtype = half or torch.float32
    # CIFAR-sized inputs keep torchvision's ImageNet stem when resized to 224, as the classic comparison does.
    model = build_model(a, ctx, data, half)
    forward_flops = getattr(getattr(model, "module", model), "ptrain_forward_flops", None)
    fp8_layers = 0
    if a.precision == "fp8":
        for m in model.modules():
            if isinstance(m, GptLinear):
                m.fp8 = True
                fp8_layers += 1
    # Training goes through the compiled module; evaluation through the module itself, which shares its
    # parameters: eval mode and a short last test batch would otherwise each compile again.
    train_model = torch.compile(model, mode=a.compile_mode) if a.compile else model
    # CUDA graphs replay into the same output memory: each step tells the graph trees that the previous one's
    # outputs (already consumed) may be overwritten.
    mark_step = torch.compiler.cudagraph_mark_step_begin if a.compile and COMPILE_MODES[a.compile_mode] else None

    # The epoch's order and this rank's share of it, exactly as torch's DistributedSampler makes them.
    sampler = torch.utils.data.DistributedSampler(range(data.train_size), num_replicas=ctx.world, rank=ctx.rank,
                                                  shuffle=True, seed=a.seed, drop_last=True)
    step_images = a.batch_size * ctx.replicas  # what this process feeds per step (dp: split over its GPUs)
    steps_per_epoch = len(sampler) // step_images
    if steps_per_epoch == 0:
        p.error(f"--batch-size {a.batch_size}: a step needs {step_images} samples per process but each of the "
                f"{ctx.world} process(es) gets {len(sampler)} of the {data.train_size} training samples")
    # ptrain's run_steps: --max-steps overrides --epochs (Hugging Face's max_steps), over the epochs it takes.
    total = a.max_steps if a.max_steps else steps_per_epoch * a.epochs
    epochs = -(-total // steps_per_epoch)
    opt = build_optimizer(p, a, ctx, model)
    # ptrain's LrSchedule: --warmup-steps, else --warmup-epochs rounded half away from zero (llround).
    warmup = a.warmup_steps or int(math.floor(a.warmup_epochs * steps_per_epoch + 0.5))
    if warmup > total:
        p.error(f"--warmup-epochs {a.warmup_epochs} (or --warmup-steps) is longer than the whole run")

    def lr_at(step):  # ptrain's schedule: linear warm-up from 0, then constant, step or cosine to --min-lr
        if step < warmup:
            return a.lr * (step + 1) / warmup
        if a.schedule == "constant":
            return a.lr
        if a.schedule == "step":
            return a.lr * a.gamma ** sum(1 for m in a.milestones if m <= step // steps_per_epoch)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_at(step) / a.lr)
    scaler = build_scaler(a)
    autocast = (lambda: torch.autocast(ctx.device.type, dtype=amp)) if amp else contextlib.nullcontext
    unit = "sequences" if data.tokens else "img"

    if lead:
        print(f"[pytorch] ready to train after {time.time() - t0:.1f}s (data {data_seconds:.1f}s)", flush=True)
    for i in ctx.cuda_indices:
        torch.cuda.reset_peak_memory_stats(i)
    nvml = NvmlSampler(ctx.cuda_indices)
    nvml.start()
    # Ranks augment with different streams, as their images differ anyway.
    gen = torch.Generator().manual_seed(a.seed + ctx.rank)
    step, train_seconds, images, epochs_detail = 0, 0.0, 0, []
    # Steady throughput, as ptrain measures it: from the end of step steady_from on (10 steps, or a quarter
    # of a run shorter than 40), outside evaluation.
    steady_from = min(10, total // 4) if total >= 8 else None
    steady_start, steady_seconds, steady_steps = None, 0.0, 0
    # The steady steps one by one, as ptrain times them (docs/metrics.md, steady_step_seconds): each step on the
    # CPU, whose work is done when the step returns; elsewhere each stretch between the synchronisations the
    # loop makes anyway (--log-every, the epoch's end), so that timing adds no wait for the device.
    per_step = ctx.device.type == "cpu"
    step_seconds, last_mark, last_mark_step = [], None, 0

    def mark(at_step):
        nonlocal last_mark, last_mark_step
        start = max(last_mark_step, steady_from or 0)
        if last_mark is None or at_step <= start:
            return
        now = time.time()
        step_seconds.append((now - last_mark) / (at_step - start))
        last_mark, last_mark_step = now, at_step
    first_step_seconds = None
    first_nonfinite = torch.full((), -1, dtype=torch.int64, device=ctx.device)
    final_acc = final_loss = None
    for epoch in range(epochs):
        if step >= total:
            break
        model.train()
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)), dtype=torch.int64).to(ctx.device)
        ctx.sync()
        ctx.barrier()
        e0 = last_log = time.time()
        step_before = step
        if last_mark is not None:  # the evaluation before this epoch is no step's time
            last_mark, last_mark_step = e0, step
        loss_sum = torch.zeros((), device=ctx.device)
        correct = torch.zeros((), dtype=torch.float64, device=ctx.device)
        n_steps = n_predictions = 0
        for i in range(steps_per_epoch):
            if step >= total:
                break
            idx = order[i * step_images:(i + 1) * step_images]
            x = data.batch(data.xtr[idx], True, in_dtype, gen, a)
            y = data.ytr[idx]
            if mark_step:
                mark_step()
            with autocast():
                out = train_model(x)
            logits, labels = predictions(out, y)
            loss = F.cross_entropy(logits.float(), labels)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            sched.step()
            loss_sum += loss.detach().float()
            # The first step whose loss is not finite, kept on the device (no sync per step), as ptrain's
            # divergence watch records it: a diverged reference run says so instead of passing for a result.
            first_nonfinite = torch.where((first_nonfinite < 0) & ~torch.isfinite(loss.detach()),
                                          torch.full_like(first_nonfinite, step + 1), first_nonfinite)
            if data.tokens:  # per token, as ptrain; image runs keep the classic step, without it
                correct += (logits.detach().argmax(1) == labels).sum()
                n_predictions += labels.numel()
            step += 1
            n_steps += 1
            if step == 1 and a.compile:
                ctx.sync()
                first_step_seconds = time.time() - e0
                if lead:
                    print(f"[pytorch] first compiled step after {first_step_seconds:.1f}s", flush=True)
            if step == steady_from:
                ctx.sync()
                steady_start = last_mark = time.time()
                last_mark_step = step
            if per_step:
                mark(step)
            if a.log_every and lead and step % a.log_every == 0:
                ctx.sync()
                mark(step)
                now = time.time()
                print(f"[pytorch] step {step}/{total}: {a.log_every * step_images * ctx.world / (now - last_log):.0f} "
                      f"{unit}/s", flush=True)
                last_log = now
        ctx.sync()
        e1 = time.time()
        mark(step)
        sec = e1 - e0
        if steady_start is not None and step > steady_from:
            steady_seconds += e1 - max(steady_start, e0)
            steady_steps += step - max(step_before, steady_from)
        sec, = ctx.reduce([sec], "max")  # the epoch lasts as long as its slowest rank
        loss_total, correct_total, predicted_total = ctx.reduce([loss_sum.item(), correct.item(), n_predictions],
                                                                "sum")
        train_seconds += sec
        n_epoch = n_steps * a.batch_size * ctx.replicas * ctx.world
        images += n_epoch
        rec = {"epoch": epoch, "wall_seconds": sec, "images": n_epoch,
               "images_per_second": n_epoch / sec if sec > 0 else None,
               "train_loss": loss_total / ctx.world / max(1, n_steps),
               "train_accuracy": correct_total / predicted_total if data.tokens and predicted_total else None,
               "test_loss": None, "test_accuracy": None}
        if not a.no_eval:
            final_acc, final_loss = evaluate(model, ctx, data, in_dtype, a, autocast)
            rec["test_accuracy"], rec["test_loss"] = final_acc, final_loss
        epochs_detail.append(rec)
        if lead:
            print(f"[pytorch] {a.strategy} {a.precision} epoch {epoch + 1}: {sec:.1f}s "
                  f"{rec['images_per_second'] or 0:.0f} {unit}/s train loss {rec['train_loss']:.4f} "
                  f"test acc {final_acc}", flush=True)
    nvml.stop()
    first_bad = int(first_nonfinite.item())
    latest, = ctx.reduce([-float(first_bad if first_bad > 0 else total + 1)], "max")  # the earliest rank's
    diverged_at_step = int(-latest) if -latest <= total else None
    if lead and diverged_at_step is not None:
        print(f"[pytorch] warning: the loss was not finite from step {diverged_at_step} on: its accuracy and "
              f"losses mean nothing", flush=True)
    util_mean, util_peak, nvml_peak = nvml.stats()
    alloc = max((torch.cuda.max_memory_allocated(i) for i in ctx.cuda_indices), default=None)
    reserved = max((torch.cuda.max_memory_reserved(i) for i in ctx.cuda_indices), default=None)
    alloc, reserved, nvml_peak, util_peak = ctx.reduce([alloc, reserved, nvml_peak, util_peak], "max")
    util_mean, = ctx.reduce([util_mean], "mean")
    steady_seconds, = ctx.reduce([steady_seconds], "max")
    steady = steady_steps * step_images * ctx.world / steady_seconds if steady_steps and steady_seconds > 0 else None
    graphs = compiled_graphs() if a.compile else None
    # Compiled only when dynamo built a graph; a model it could not trace at all ran eager.
    compiled = bool(a.compile and (graphs is None or graphs > 0))
    if a.dump_params:
        dump_params(a, ctx, model, a.dump_params)

    devices = ctx.world * ctx.replicas
    environment = {"torch_version": torch.__version__, "device": str(ctx.device)}
    if "torchvision" in sys.modules:  # image models only (docs/metrics.md: keys absent when unknown)
        environment["torchvision_version"] = sys.modules["torchvision"].__version__
    if cuda:
        environment["gpu_name"] = nvml.gpu_name() or torch.cuda.get_device_name(ctx.device)
        if nvml.driver_version():
            environment["driver_version"] = nvml.driver_version()
        if torch.version.cuda:
            environment["cuda_version"] = torch.version.cuda
        if torch.backends.cudnn.is_available():
            environment["cudnn_version"] = str(torch.backends.cudnn.version())
        with contextlib.suppress(Exception):
            v = torch.cuda.nccl.version()
            environment["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    extra = {"implementation": "pytorch-compiled" if compiled else "pytorch-eager",
             "evaluation": "sharded over ranks, sums all-reduced" + (", uncompiled module" if a.compile else ""),
             "augment": a.augment, "norm": a.norm, "optimizer": a.optimizer}
    if cuda:
        extra["cudnn_benchmark"] = a.cudnn_benchmark  # ptrain's record has it in its config
    if a.compile:
        extra["compile"] = {"mode": a.compile_mode, "graphs": graphs, "first_step_seconds": first_step_seconds}
    if ctx.dp_device_ids:
        extra["dp_device_ids"] = ctx.dp_device_ids
    if ctx.distributed:
        extra["backend"] = dist.get_backend()
    if a.strategy == "fsdp":
        extra["fsdp_min_params"] = int(a.fsdp_min_params)
        extra["fsdp_mixed_precision"] = str(half).replace("torch.", "") if half else None
    if a.precision == "fp8":
        # As ptrain's record: GPT's projections in FP8, its head (and any other model's layers) in bf16, each
        # tensor scaled by its own amax (torchao's tensorwise dynamic scaling); the head counts as kept in bf16.
        extra["fp8_layers"] = {"fp8": fp8_layers, "scaling": "dynamic",
                               "why": "lm_head and layers other than GPT's projections in bf16"}
        if is_language_model(a.model):
            extra["fp8_layers"]["kept_in_bf16"] = 1
            extra["fp8_layers"]["head_in_fp8"] = False
    images_per_second = images / train_seconds if train_seconds else None
    # Model FLOP utilisation as ptrain counts it; the dense peaks are ptrain's own table (metrics/flops.cpp), so a
    # PyTorch record has TFLOP/s but no MFU of its own.
    rate = steady or images_per_second
    tflops = 3 * forward_flops * rate / devices / 1e12 if forward_flops is not None and rate else None
    record = {
        # ptrain_version is null: no ptrain release trained this run (docs/metrics.md, `framework`).
        "schema_version": 1, "framework": "pytorch", "ptrain_version": None, "torch_version": torch.__version__,
        "command_line": " ".join(sys.argv), "model": a.model,
        "dataset": a.dataset, "precision": a.precision + ("+channels-last" if a.channels_last else ""),
        "strategy": a.strategy, "device": str(ctx.device), "world_size": ctx.world, "devices": devices,
        "batch_size_per_device": a.batch_size, "global_batch_size": a.batch_size * devices, "epochs": epochs,
        "steps": step, "image_size": data.image_size, "seq_len": data.seq_len or None,
        "channels_last": a.channels_last, "compiled": compiled, "fused_optimizer": a.fused_optimizer,
        # ptrain's own accounts of its step (graph capture, its kernels, step phases) have no counterpart here.
        "cuda_graphs": None, "cuda_graphs_note": "", "kernels": {}, "step_phase_seconds": None,
        "diverged_at_step": diverged_at_step,
        "total_wall_seconds": time.time() - t0,
        "train_wall_seconds": train_seconds, "images_per_second": images_per_second,
        "steady_images_per_second": steady, "steady_from_step": steady_from if steady else None,
        "steady_step_seconds": step_seconds, "steady_step_timing": ("step" if per_step else "window") if step_seconds else "",
        "steady_step_median_seconds": quantile(step_seconds, 0.5), "steady_step_p10_seconds": quantile(step_seconds, 0.1),
        "steady_step_p90_seconds": quantile(step_seconds, 0.9),
        # The reference saves no checkpoints, as ptrain without --checkpoint-dir.
        "checkpoint_blocking_seconds": None, "checkpoint_write_seconds": None,
        "tokens_per_second": images_per_second * data.seq_len if data.tokens and images_per_second else None,
        "steady_tokens_per_second": steady * data.seq_len if data.tokens and steady else None,
        "model_flops_per_step": 3 * forward_flops * a.batch_size * devices if forward_flops is not None else None,
        "tflops": tflops, "mfu": None, "peak_tflops": None, "peak_tflops_basis": "",
        "peak_allocated_bytes": None if alloc is None else int(alloc),
        "peak_reserved_bytes": None if reserved is None else int(reserved),
        "peak_nvml_used_bytes": None if nvml_peak is None else int(nvml_peak),
        "gpu_util_mean": util_mean, "gpu_util_peak": util_peak, "host_peak_rss_bytes": host_peak_rss_bytes(),
        # ptrain's accounting of model-state memory has no PyTorch counterpart here.
        "model_state_param_bytes": None, "model_state_grad_bytes": None, "model_state_optimizer_bytes": None,
        "final_test_accuracy": final_acc, "final_test_loss": final_loss, "epochs_detail": epochs_detail,
        "environment": environment, "extra": extra,
    }
    if lead:
        alloc_text = "n/a" if alloc is None else f"{alloc / 2**30:.2f} GiB"
        steady_text = f" ({steady:.0f} after step {steady_from})" if steady else ""
        tokens_text = f", {record['steady_tokens_per_second'] or record['tokens_per_second'] or 0:.0f} tokens/s" \
            if data.tokens else ""
        print(f"[pytorch] {a.strategy} {a.precision}{' compiled' if compiled else ''}: "
              f"{record['images_per_second'] or 0:.0f} {unit}/s{steady_text}{tokens_text}, peak allocated "
              f"{alloc_text}, test acc {final_acc}", flush=True)
        if a.metrics_out:
            write_json_atomically(a.metrics_out, record)
    if dist.is_initialized():
        # Leave together, then without tearing DDP down: with Debian's torch 1.13 over gloo the DDP reducer's
        # destructor joins a gloo worker that is freeing a tensor and waits for the GIL the main thread
        # holds (seen: rank 0 hung for good after writing its record). Everything worth keeping is written.
        ctx.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def evaluate(model, ctx, data, in_dtype, a, autocast):
    model.eval()
    n = len(data.xte)
    share = -(-n // ctx.world)
    lo, hi = min(n, ctx.rank * share), min(n, (ctx.rank + 1) * share)
    correct = torch.zeros((), dtype=torch.float64, device=ctx.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
    counted = 0
    with torch.no_grad():
        # The same number of batches on every rank: FSDP's forward all-gathers, and DDP's first forward after
        # training broadcasts buffers. A rank whose share ran out runs an uncounted batch of one sample.
        for j in range(-(-share // data.eval_batch)):
            b0, b1 = lo + j * data.eval_batch, min(hi, lo + (j + 1) * data.eval_batch)
            is_counted = b1 > b0
            if not is_counted:
                b0, b1 = 0, 1
            x = data.batch(data.xte[b0:b1], False, in_dtype, None, a)
            with autocast():
                out = model(x)
            if is_counted:
                logits, labels = predictions(out, data.yte[b0:b1])
                loss_sum += F.cross_entropy(logits.float(), labels, reduction="sum").double()
                correct += (logits.argmax(1) == labels).sum().double()
                counted += labels.numel()
    total_correct, total_loss, total_counted = ctx.reduce([correct.item(), loss_sum.item(), counted], "sum")
    return total_correct / total_counted, total_loss / total_counted


if __name__ == "__main__":
    write_tracebacks_whole()
    main()
