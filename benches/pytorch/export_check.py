#!/usr/bin/env python3
"""Loads weights written by `ember export` into the PyTorch twin (models.py) with
load_state_dict(strict=True) and evaluates it on the run's test set, normalised as the run's
config.json says: the other half of the round trip whose first half is `ember import`.

    ember export --checkpoint RUN --out RUN/weights.safetensors
    python3 benches/pytorch/export_check.py RUN RUN/weights.safetensors [--data-dir data/fashion-mnist]

Prints one JSON line: the model, test_correct / test_total and the mean test loss, in
eval mode (batch norm's running statistics), to compare with `ember eval --checkpoint RUN`.
The safetensors file is read here (8-byte header length, JSON header, little-endian data), so
nothing beyond torch and numpy is needed.
"""
import argparse
import json
import pathlib

import numpy as np
import torch

from models import MODELS, load_split

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64}


def read_safetensors(path):
    data = pathlib.Path(path).read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[base + begin:base + end], dtype=DTYPES[info["dtype"]])
        tensors[name] = torch.from_numpy(array.reshape(info["shape"]).copy())
    return tensors, meta


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="the run directory (its config.json)")
    ap.add_argument("weights", help="the file `ember export` wrote")
    ap.add_argument("--data-dir", help="the dataset's IDX files [default: the run's data_dir]")
    args = ap.parse_args()
    config = json.loads((pathlib.Path(args.run) / "config.json").read_text())
    name = config["model"]
    state, meta = read_safetensors(args.weights)
    assert meta.get("model") == name, (meta, name)
    make = MODELS[name][0]
    model = make()
    model.load_state_dict(state, strict=True)  # every key, no more, no fewer
    model.eval()
    norm = config["normalization"]
    mean, std = (v if isinstance(v, (int, float)) else v[0] for v in (norm["mean"], norm["std"]))
    data_dir = args.data_dir or config.get("data_dir")
    x, y = load_split(data_dir, "test", mean, std)
    if config.get("limit_test"):
        x, y = x[:config["limit_test"]], y[:config["limit_test"]]
    log_probs = MODELS[name][1]
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y), 1000):
            out = model(x[i:i + 1000])
            lp = out if log_probs else torch.log_softmax(out, 1)
            correct += (out.argmax(1) == y[i:i + 1000]).sum().item()
            loss += torch.nn.functional.nll_loss(lp, y[i:i + 1000], reduction="sum").item()
    print(json.dumps({"torch": torch.__version__, "model": name, "test_correct": correct,
                      "test_total": len(y), "test_loss": loss / len(y)}))


if __name__ == "__main__":
    main()
