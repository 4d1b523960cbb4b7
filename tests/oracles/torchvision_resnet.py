"""torchvision's ResNets as the reference for ptrain's models.

  torchvision_resnet.py export --arch resnet18 --num-classes 10 --image-size 64 [--cifar-stem] --out DIR
      builds the torchvision model (seed 0) and writes into DIR:
        weights.pth      torch.save(model.state_dict()) of the fresh model
        names.txt        one "name<TAB>d0,d1,..." line per state_dict entry, in order
        io.pth           {"input": 2xCxSxS batch, "logits_eval": eval-mode logits,
                          "logits_train": train-mode logits (batch statistics)}
        after_train.pth  state_dict after that train-mode forward (updated running statistics)
  torchvision_resnet.py check --arch ... --num-classes N [--cifar-stem] --weights FILE --io FILE
      loads FILE (.pth via torch.load, .safetensors via safetensors_oracle) strictly into the torchvision
      model and compares its eval logits on io["input"] with io["logits"]; fails above 1e-4 relative error.

--cifar-stem replaces conv1 by a 3x3 stride-1 convolution and maxpool by Identity.
"""
import argparse
import os
import sys

import torch
import torchvision

import safetensors_oracle


def build(args):
    model = torchvision.models.__dict__[args.arch](num_classes=args.num_classes)
    if args.cifar_stem:
        model.conv1 = torch.nn.Conv2d(3, model.conv1.out_channels, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = torch.nn.Identity()
    return model


def relative_error(actual, reference):
    return (torch.linalg.norm(actual - reference) / torch.linalg.norm(reference)).item()


def export(args):
    torch.manual_seed(0)
    model = build(args)
    os.makedirs(args.out, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(args.out, "weights.pth"))
    with open(os.path.join(args.out, "names.txt"), "w") as f:
        for name, tensor in model.state_dict().items():
            f.write(f"{name}\t{','.join(str(d) for d in tensor.shape)}\n")
    x = torch.randn(2, 3, args.image_size, args.image_size)
    with torch.no_grad():
        model.eval()
        logits_eval = model(x)
        model.train()
        logits_train = model(x)
    torch.save({"input": x, "logits_eval": logits_eval, "logits_train": logits_train},
               os.path.join(args.out, "io.pth"))
    torch.save(model.state_dict(), os.path.join(args.out, "after_train.pth"))


def check(args):
    model = build(args)
    if args.weights.endswith(".safetensors"):
        tensors, _ = safetensors_oracle.read(args.weights)
    else:
        tensors = torch.load(args.weights)
    model.load_state_dict(tensors, strict=True)
    io = torch.load(args.io)
    model.eval()
    with torch.no_grad():
        logits = model(io["input"])
    error = relative_error(io["logits"], logits)
    print(f"relative error {error:.3g}")
    if not error <= 1e-4:
        sys.exit(f"logits differ: relative error {error}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["export", "check"])
    parser.add_argument("--arch", required=True)
    parser.add_argument("--num-classes", type=int, required=True)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--cifar-stem", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--weights")
    parser.add_argument("--io")
    args = parser.parse_args()
    torch.set_num_threads(2)
    export(args) if args.command == "export" else check(args)


if __name__ == "__main__":
    main()
