#!/usr/bin/env python3
"""Exports a torchvision resnet18 for examples/infer.c: the model (graft.export), an image
tensor, ImageNet's class names, and PyTorch's logits for the same image, then prints PyTorch's
top classes (infer.c should print the same).

    .venv/bin/python examples/export_resnet18.py [--out DIR] [--size PX]
    build/examples/infer DIR/resnet18.graft DIR/image.f32 --labels DIR/labels.txt

No download: the weights are torchvision's initialization from a fixed seed (pretrained ones
would come from the network), so the classes are arbitrary but the same in both. The image is
drawn, not read: a disc and stripes, normalized with ImageNet's mean and deviation.
"""
import argparse
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "torch"))  # the in-place build of the graft package

import torch
import torchvision

import graft


def image(size):
    """[1, 3, size, size]: a warm disc on cool stripes, ImageNet-normalized."""
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
    disc = ((xs ** 2 + ys ** 2) < 0.4).float()
    stripes = (torch.sin(xs * 12) > 0).float()
    rgb = torch.stack([0.9 * disc + 0.1 * stripes, 0.3 * disc + 0.4 * stripes, 0.1 * disc + 0.8 * stripes])
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    return ((rgb - mean) / std).unsqueeze(0).contiguous()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/resnet18")
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    x = image(args.size)
    path = os.path.join(args.out, "resnet18.graft")
    graft.export(model, (x,), path)
    x.numpy().tofile(os.path.join(args.out, "image.f32"))
    with torch.no_grad():
        logits = model(x)[0]
    logits.numpy().tofile(os.path.join(args.out, "torch_logits.f32"))
    names = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.meta["categories"]
    with open(os.path.join(args.out, "labels.txt"), "w") as f:
        f.write("\n".join(names) + "\n")
    print("wrote %s (%.1f MB), %s/image.f32 [1,3,%d,%d], labels.txt" % (
        path, os.path.getsize(path) / 1e6, args.out, args.size, args.size))
    print("PyTorch's top classes:")
    top = torch.topk(logits, 5)
    for r, (v, i) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
        print("%d. %-32s (class %4d) logit %.6f" % (r + 1, names[i], i, v))


if __name__ == "__main__":
    main()
