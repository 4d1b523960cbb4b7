"""Forward FLOPs of a torchvision model counted from the shapes its layers actually see, as the reference for
ptrain's Model::forward_flops.

  model_flops.py ARCH SIZE
      prints "flops N": the multiply-adds of every Conv2d and Linear in torchvision.models.ARCH(num_classes=1000)
      on one 3 x SIZE x SIZE image, times two, taken by forward hooks from the layers' real input and output shapes
"""
import sys

import torch
import torchvision


def main():
    arch, size = sys.argv[1], int(sys.argv[2])
    model = torchvision.models.__dict__[arch](num_classes=1000).eval()
    total = [0]

    def conv(module, inputs, output):
        kernel = module.kernel_size[0] * module.kernel_size[1]
        per_output = module.in_channels // module.groups * kernel
        total[0] += 2 * per_output * output.numel()

    def linear(module, inputs, output):
        total[0] += 2 * module.in_features * output.numel()

    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            module.register_forward_hook(conv)
        elif isinstance(module, torch.nn.Linear):
            module.register_forward_hook(linear)
    with torch.no_grad():
        model(torch.zeros(1, 3, size, size))
    print("flops", total[0])


if __name__ == "__main__":
    main()
