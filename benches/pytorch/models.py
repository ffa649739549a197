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


# name -> (constructor, output is log-probabilities, recipe optimizer, recipe lr, normalisation)
MODELS = {
    "pytorch-example-net": (PytorchExampleNet, True, "adadelta", 1.0, (0.1307, 0.3081)),
    "tch-net": (TchNet, False, "adam", 1e-4, (0.0, 1.0)),
    "flashlight-cnn": (FlashlightCnn, False, "sgd", 1e-2, (0.0, 1.0)),
}


def optimizer(name, params, lr):
    """The recipe optimizers with torch.optim's defaults (ember's OptimizerConfig::new)."""
    return {
        "adadelta": lambda: torch.optim.Adadelta(params, lr=lr),
        "adam": lambda: torch.optim.Adam(params, lr=lr),
        "sgd": lambda: torch.optim.SGD(params, lr=lr),
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
