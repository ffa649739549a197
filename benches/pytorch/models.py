"""ember's models in PyTorch, layer for layer (see models/src/*.rs), and MNIST IDX loading.

Shared by parity.py, mnist_example.py and the benchmark scripts. Plain PyTorch + numpy.
"""
import gzip
import pathlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class PytorchExampleNet(nn.Module):
    """pytorch/examples mnist/main.py as the seed benchmark ran it (Dropout2d after the pool)."""

    def __init__(self, dropout1=0.25, dropout2=0.5):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout2d(dropout1)
        self.dropout2 = nn.Dropout(dropout2)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


class TchNet(nn.Module):
    """The tch-rs variant: no ReLU after conv2, element-wise dropout, logits out."""

    def __init__(self, dropout1=0.5, dropout2=0.5):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(dropout1)
        self.dropout2 = nn.Dropout(dropout2)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = self.conv2(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return self.fc2(x)


class FlashlightCnn(nn.Module):
    """flashlight's MNIST CNN: 5x5 convolutions, 2 pixels of replicate padding, logits out."""

    def __init__(self, dropout=0.5):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2, padding_mode="replicate")
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2, padding_mode="replicate")
        self.fc1 = nn.Linear(7 * 7 * 64, 1024)
        self.dropout = nn.Dropout(dropout)
        self.fc2 = nn.Linear(1024, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout(x)
        return self.fc2(x)


class Projection(nn.Module):
    """A 1x1 convolution (stride 2) and batch norm on a block's shortcut (models/src/resnet.rs)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.bn(self.conv(x))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = Projection(cin, cout, stride) if stride != 1 or cin != cout else None

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.shortcut is None else self.shortcut(x)))


class ResNet(nn.Module):
    """CIFAR-style ResNet with projection shortcuts (models/src/resnet.rs), PyTorch's default init."""

    def __init__(self, widths, depths, in_channels=1, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        stages, cin = [], widths[0]
        for s, (width, depth) in enumerate(zip(widths, depths)):
            blocks = []
            for b in range(depth):
                blocks.append(BasicBlock(cin, width, 2 if s > 0 and b == 0 else 1))
                cin = width
            stages.append(nn.ModuleList(blocks))
        self.stages = nn.ModuleList(stages)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        for stage in self.stages:
            for block in stage:
                x = block(x)
        return self.fc(x.flatten(2).mean(2))


class ConvBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)


class SpeedrunNet(nn.Module):
    """The speedrun recipe's CNN (models/src/speedrun.rs): three conv-BN-ReLU-pool blocks, one linear."""

    def __init__(self, widths=(32, 64, 128), in_channels=1, num_classes=10):
        super().__init__()
        a, b, c = widths
        self.block1 = ConvBlock(in_channels, a)
        self.block2 = ConvBlock(a, b)
        self.block3 = ConvBlock(b, c)
        self.fc = nn.Linear(c * 3 * 3, num_classes)

    def forward(self, x):
        x = self.block3(self.block2(self.block1(x)))
        return self.fc(torch.flatten(x, 1))


class LeNet5(nn.Module):
    """LeNet-5 with ReLU and max pooling (models/src/lenet.rs); conv1 padded by 2 for 28x28."""

    def __init__(self, in_channels=1, num_classes=10, image_size=(28, 28)):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        h, w = ((s // 2 - 4) // 2 for s in image_size)
        self.fc1 = nn.Linear(16 * h * w, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def resnet20(**kw):
    return ResNet([16, 32, 64], [3, 3, 3], **kw)


def resnet18(**kw):
    return ResNet([64, 128, 256, 512], [2, 2, 2, 2], **kw)


# name -> (constructor, output is log-probabilities, recipe optimizer, recipe lr, normalisation)
MODELS = {
    "pytorch-example-net": (PytorchExampleNet, True, "adadelta", 1.0, (0.1307, 0.3081)),
    "tch-net": (TchNet, False, "adam", 1e-4, (0.0, 1.0)),
    "flashlight-cnn": (FlashlightCnn, False, "sgd", 1e-2, (0.0, 1.0)),
    "resnet20": (resnet20, False, "sgd-nesterov", 0.1, (0.2860, 0.3530)),
    "speedrun-net": (SpeedrunNet, False, "sgd-nesterov", 0.2, (0.1307, 0.3081)),
    # No recipe of its own: ember trains it with resnet-fashion's (Recipe::of_model).
    "lenet5": (LeNet5, False, "sgd-nesterov", 0.1, (0.2860, 0.3530)),
    # Recipe::of_model too: resnet-fashion's optimizer and normalisation.
    "resnet18": (resnet18, False, "sgd-nesterov", 0.1, (0.2860, 0.3530)),
}

# Dropout layers of each model: a model is built without dropout by passing this many zeros.
DROPOUTS = {"pytorch-example-net": 2, "tch-net": 2, "flashlight-cnn": 1, "resnet20": 0, "speedrun-net": 0, "lenet5": 0,
            "resnet18": 0}


def optimizer(name, params, lr):
    """The recipe optimizers with torch.optim's defaults (ember's OptimizerConfig::new), and the
    modern recipes' SGD: Nesterov momentum 0.9, weight decay 5e-4 on parameters of 2 or more
    dimensions only (ember's --no-decay-1d)."""
    params = list(params)
    return {
        "adadelta": lambda: torch.optim.Adadelta(params, lr=lr),
        "adam": lambda: torch.optim.Adam(params, lr=lr),
        "sgd": lambda: torch.optim.SGD(params, lr=lr),
        "sgd-nesterov": lambda: torch.optim.SGD(
            [{"params": [p for p in params if p.ndim > 1]},
             {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}],
            lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4),
    }[name]()


def read_idx(path):
    """An IDX file (gzip or raw) as a numpy array of uint8."""
    path = pathlib.Path(path)
    data = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    magic = int.from_bytes(data[:4], "big")
    rank = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def load_split(data_dir, split, mean, std):
    """(images [N,1,28,28] float32 normalised as ToTensor+Normalize, labels int64)."""
    prefix = "train" if split == "train" else "t10k"
    d = pathlib.Path(data_dir)
    images = read_idx(d / f"{prefix}-images-idx3-ubyte.gz")
    labels = read_idx(d / f"{prefix}-labels-idx1-ubyte.gz")
    x = torch.from_numpy(images.copy()).float().div(255).unsqueeze(1)
    x = x.sub(mean).div(std)
    return x, torch.from_numpy(labels.astype(np.int64))
