#!/usr/bin/env python3
"""Multiply-accumulates and output elements of the convolutions and linear layers of one forward
pass over one image, counted by forward hooks on the PyTorch twins (models.py): the expected
values of `layer_counts` and `mac_counts` in src/model.rs.

    ~/torch-venv/bin/python benches/pytorch/layer_counts.py
"""
import torch

import models


def count(model, shape):
    macs, outputs = 0, 0

    def hook(module, _inputs, out):
        nonlocal macs, outputs
        if isinstance(module, torch.nn.Conv2d):
            macs += out.numel() * module.in_channels * module.kernel_size[0] * module.kernel_size[1]
            outputs += out.numel()
        elif isinstance(module, torch.nn.Linear):
            macs += module.in_features * module.out_features
            outputs += out.numel()

    for module in model.modules():
        module.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.zeros(1, *shape))
    return macs, outputs


def main():
    for name in ("resnet20", "resnet18"):
        for shape in ((1, 28, 28), (3, 32, 32), (1, 112, 112)):
            model = getattr(models, name)(in_channels=shape[0])
            print(name, "x".join(map(str, shape)), *count(model, shape))
    for name in ("pytorch-example-net", "flashlight-cnn", "speedrun-net", "lenet5"):
        make = models.MODELS[name][0]
        print(name, "1x28x28", *count(make(), (1, 28, 28)))


if __name__ == "__main__":
    main()
