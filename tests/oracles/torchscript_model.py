"""PyTorch side of the TorchScript model tests: a model that is not in ptrain's zoo, scripted, its data, and
its training in PyTorch, step by step, for ptrain to match.

  torchscript_model.py make DIR
      DIR/net.pt          torch.jit.script of GroupNormNet (seed 0): a GroupNorm convnet whose forward is a
                          chain of submodule calls with computation between them and a root parameter
      DIR/traced.pt       torch.jit.trace of the same module
      DIR/tuple.pt        a scripted module whose forward returns a tuple (ptrain refuses it)
      DIR/bn.pt           a scripted nn.Sequential with BatchNorm (an int64 buffer) and dropout
      DIR/bn_traced_train.pt, DIR/bn_traced_eval.pt
                          the same module traced in training mode and in eval mode: batch norm and dropout
                          fixed in the traced mode
      DIR/skip.pt         a scripted module with a skip connection around its blocks: no chain, no units
      DIR/tiny.pt         a scripted convnet of a few hundred parameters, for tests whose cost is the data
      DIR/eval_fails.pt   tiny.pt whose eval-mode forward fails once it has trained: a run that fails after
                          training, for what such a run must keep
      DIR/vit.pt          a scripted ViT (LayerNorm, nn.TransformerEncoderLayer): it trains under CPU autocast to
                          bfloat16, but its eval-mode fast path (no gradients) fails there with torch 1.13
      DIR/state_dict.pt   torch.save of its state_dict (not a TorchScript archive: ptrain says so)
      DIR/wrong_weights.pt  torch.save of another module's state_dict (weights that do not fit net.pt)
      DIR/data/{train,test}/<class>/*.png   the images (PNG: lossless, so both sides see the same pixels)
  torchscript_model.py train DIR WORLD BATCH STEPS LR SEED OUT.json
      trains DIR/net.pt (torch.jit.load) as ptrain's `--strategy ddp` over WORLD ranks does (each rank's
      share of the epoch's permutation as DistributedSampler(shuffle, drop_last) draws it, BATCH per rank,
      plain SGD with momentum 0.9, no augmentation, images normalised with mean 0.5 and std 0.5) on the whole
      global batch, and writes per step the loss of each rank's share before the update, and the eval
      logits of the test images after STEPS steps
  torchscript_model.py check DIR WEIGHTS OUT.json
      loads WEIGHTS (ptrain's --save-weights: a .pt state dict through torch.load, or .safetensors) into
      DIR/net.pt and into the eager module and writes both models' eval logits of the test images
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_oracle  # noqa: E402

CLASSES = 4
TRAIN_PER_CLASS = 16
TEST_PER_CLASS = 4
SIZE = 16


class Block(nn.Module):
    """A residual block: its forward is no chain, so it stays one unit."""

    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(4, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(4, channels)

    def forward(self, x):
        y = F.relu(self.norm1(self.conv1(x)))
        y = self.norm2(self.conv2(y))
        return F.relu(x + y)


class GroupNormNet(nn.Module):
    def __init__(self, classes=CLASSES):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.GroupNorm(4, 16), nn.ReLU())
        self.blocks = nn.Sequential(Block(16), Block(16))
        self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.scale = nn.Parameter(torch.ones(1))
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        x = self.stem(x)
        x = self.blocks(x)
        x = F.relu(self.down(x))
        x = x.mean(dim=(2, 3)) * self.scale
        return self.head(x)


class TupleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * SIZE * SIZE, CLASSES)

    def forward(self, x):
        y = self.fc(x.flatten(1))
        return y, y.sum()


class SkipNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 3, 3, padding=1)
        self.b = nn.Conv2d(3, 3, 3, padding=1)
        self.head = nn.Linear(3, CLASSES)

    def forward(self, x):
        y = self.b(self.a(x))
        return self.head((x + y).mean(dim=(2, 3)))


def tiny_net():
    return nn.Sequential(nn.Conv2d(3, 8, 4, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, CLASSES))


class EvalFailsNet(nn.Module):
    """Trains as tiny_net does; in eval mode, once trained past the forwards that the checks before the
    first step run, it raises, as a model whose evaluation LibTorch cannot run after training: those checks
    pass, and only what the run does after training can meet the failure."""

    def __init__(self):
        super().__init__()
        self.net = tiny_net()
        self.trained_steps = 0

    def forward(self, x):
        if self.training:
            self.trained_steps += 1
        elif self.trained_steps > 4:
            raise RuntimeError("this model cannot evaluate once trained")
        return self.net(x)


def bn_net():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Dropout(0.5), nn.Linear(8, CLASSES))


class ViT(nn.Module):
    """Patches, a learned position embedding (fp32: it turns the autocast patches back into fp32), one encoder
    layer. In eval mode without gradients nn.TransformerEncoderLayer takes its fused fast path, which under
    CPU autocast to bfloat16 meets fp32 weights with bfloat16 activations and fails; training does not."""

    def __init__(self, dim=16, patch=4):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.position = nn.Parameter(torch.zeros(1, (SIZE // patch) ** 2, dim))
        self.encoder = nn.TransformerEncoderLayer(dim, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2) + self.position
        x = self.encoder(x)
        return self.head(self.norm(x).mean(dim=1))


def images(split, per_class, seed):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for c in range(CLASSES):
        for i in range(per_class):
            base = torch.randint(0, 256, (3, SIZE, SIZE), generator=gen, dtype=torch.int64)
            # Class c brightens channel c % 3, so there is something to learn.
            base[c % 3] = (base[c % 3] // 2 + 128)
            out.append((c, i, base.to(torch.uint8)))
    return out


def make(root):
    torch.manual_seed(0)
    model = GroupNormNet()
    os.makedirs(root, exist_ok=True)
    torch.jit.script(model).save(os.path.join(root, "net.pt"))
    torch.jit.trace(model, torch.zeros(2, 3, SIZE, SIZE)).save(os.path.join(root, "traced.pt"))
    torch.jit.script(TupleNet()).save(os.path.join(root, "tuple.pt"))
    torch.jit.script(bn_net()).save(os.path.join(root, "bn.pt"))
    # Traced in training mode (the default) and in eval mode: the graph records the mode.
    example = torch.zeros(2, 3, SIZE, SIZE)
    torch.jit.trace(bn_net(), example, check_trace=False).save(os.path.join(root, "bn_traced_train.pt"))
    torch.jit.trace(bn_net().eval(), example, check_trace=False).save(os.path.join(root, "bn_traced_eval.pt"))
    torch.jit.script(SkipNet()).save(os.path.join(root, "skip.pt"))
    torch.jit.script(tiny_net()).save(os.path.join(root, "tiny.pt"))
    torch.jit.script(EvalFailsNet()).save(os.path.join(root, "eval_fails.pt"))
    torch.jit.script(ViT()).save(os.path.join(root, "vit.pt"))
    torch.save(model.state_dict(), os.path.join(root, "state_dict.pt"))
    torch.save(SkipNet().state_dict(), os.path.join(root, "wrong_weights.pt"))
    for split, per_class, seed in (("train", TRAIN_PER_CLASS, 1), ("test", TEST_PER_CLASS, 2)):
        for c, i, pixels in images(split, per_class, seed):
            folder = os.path.join(root, "data", split, f"class{c}")
            os.makedirs(folder, exist_ok=True)
            Image.fromarray(pixels.permute(1, 2, 0).numpy()).save(os.path.join(folder, f"{i:03d}.png"))


def load_split(root, split):
    """The folder as ptrain's image folder reads it: classes sorted, files sorted within each."""
    base = os.path.join(root, "data", split)
    xs, ys = [], []
    for c, name in enumerate(sorted(os.listdir(base))):
        for f in sorted(os.listdir(os.path.join(base, name))):
            xs.append(torch.from_numpy(np.array(Image.open(os.path.join(base, name, f)).convert("RGB"))).permute(2, 0, 1))
            ys.append(c)
    x = torch.stack(xs).float().div(255.0).sub(0.5).div(0.5)
    return x, torch.tensor(ys)


def rank_orders(n, world, seed, epoch):
    """torch.utils.data.DistributedSampler(shuffle=True, drop_last=True), as ptrain's sampler draws it."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    per_rank = n // world
    perm = perm[: per_rank * world]
    return [perm[r::world] for r in range(world)]


def train(root, world, batch, steps, lr, seed, out):
    torch.set_num_threads(1)
    model = torch.jit.load(os.path.join(root, "net.pt"))
    model.train()
    x, y = load_split(root, "train")
    xt, _ = load_split(root, "test")
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=0.0)
    losses = []
    per_epoch = (len(y) // world) // batch
    for step in range(steps):
        epoch, b = divmod(step, per_epoch)
        orders = rank_orders(len(y), world, seed, epoch)
        parts = [o[b * batch:(b + 1) * batch] for o in orders]
        with torch.no_grad():
            losses.append([F.cross_entropy(model(x[p]), y[p]).item() for p in parts])
        index = [i for p in parts for i in p]
        opt.zero_grad()
        F.cross_entropy(model(x[index]), y[index]).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        logits = model(xt)
    with open(out, "w") as f:
        json.dump({"losses": losses, "eval_logits": logits.tolist()}, f)


def check(root, weights, out):
    torch.set_num_threads(1)
    if weights.endswith(".safetensors"):
        state = safetensors_oracle.read(weights)[0]
    else:
        state = torch.load(weights)
    scripted = torch.jit.load(os.path.join(root, "net.pt"))
    scripted.load_state_dict(state)
    eager = GroupNormNet()
    eager.load_state_dict(state)
    xt, _ = load_split(root, "test")
    scripted.eval()
    eager.eval()
    with torch.no_grad():
        result = {"scripted": scripted(xt).tolist(), "eager": eager(xt).tolist(), "keys": list(state.keys()),
                  "expected_keys": list(GroupNormNet().state_dict().keys())}
    with open(out, "w") as f:
        json.dump(result, f)


def main():
    mode = sys.argv[1]
    if mode == "make":
        make(sys.argv[2])
    elif mode == "train":
        root, world, batch, steps, lr, seed, out = sys.argv[2:9]
        train(root, int(world), int(batch), int(steps), float(lr), int(seed), out)
    elif mode == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
