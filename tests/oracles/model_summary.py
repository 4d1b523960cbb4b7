"""torchvision's count of a model's parameters, as the reference for ptrain's model summary.

  model_summary.py ARCH NUM_CLASSES
      prints one line "total PARAMETERS TRAINABLE BUFFER_ELEMENTS" and then one "NAME PARAMETERS" line per
      top-level child of torchvision.models.ARCH(num_classes=NUM_CLASSES) that holds parameters, in order
"""
import sys

import torchvision


def main():
    arch, classes = sys.argv[1], int(sys.argv[2])
    model = torchvision.models.__dict__[arch](num_classes=classes)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    buffers = sum(b.numel() for b in model.buffers())
    print("total", total, trainable, buffers)
    for name, child in model.named_children():
        count = sum(p.numel() for p in child.parameters())
        if count:
            print(name, count)


if __name__ == "__main__":
    main()
