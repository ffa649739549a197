#!/usr/bin/env python3
"""The PyTorch twin of an ember recipe: trains from ember's own config.json, so that both sides
run the same settings (model, optimizer and its parameter groups, schedule, label smoothing,
augmentation, batch sizes, epochs, normalisation) from one source.

    ember train --recipe speedrun --epochs 1 --limit-train 64 --run-dir /tmp/r   # writes /tmp/r/config.json
    python benches/pytorch/recipe.py --config /tmp/r/config.json --data-dir data/mnist

Like ember: the whole dataset is a tensor in memory (on the GPU with --device cuda), batches are
gathered by index, each epoch is evaluated on the test set, and with a target accuracy the run
stops after the first epoch that reaches it. Times count from this process's start, the import
of torch and the loading of the data included, as ember counts from its own start.

Prints one JSON object per epoch and a final one (with --json FILE, the list is also written).
"""
import time

PROCESS_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import models  # noqa: E402

MODELS = {
    "pytorch-example-net": models.PytorchExampleNet,
    "tch-net": models.TchNet,
    "flashlight-cnn": models.FlashlightCnn,
    "resnet20": models.resnet20,
    "resnet18": models.resnet18,
    "speedrun-net": models.SpeedrunNet,
}


def since_start():
    return time.perf_counter() - PROCESS_START


def build_optimizer(cfg, model):
    o = cfg["optimizer"]
    wd = o["weight_decay"]
    params = list(model.parameters())
    if o.get("no_decay_1d"):
        groups = [
            {"params": [p for p in params if p.ndim > 1]},
            {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0},
        ]
    else:
        groups = [{"params": params}]
    lr = cfg["lr"]
    kind = o["kind"]
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=o.get("momentum", 0.0), dampening=o.get("dampening", 0.0),
                               nesterov=o.get("nesterov", False), weight_decay=wd)
    if kind == "adam":
        return torch.optim.Adam(groups, lr=lr, betas=tuple(o["betas"]), eps=o["eps"] or 1e-8, weight_decay=wd)
    if kind == "adadelta":
        return torch.optim.Adadelta(groups, lr=lr, rho=o["rho"], eps=o["eps"] or 1e-6, weight_decay=wd)
    raise SystemExit(f"unknown optimizer {kind}")


def build_schedule(cfg, opt, steps_per_epoch):
    """(scheduler, stepped per optimizer step?)"""
    s = cfg.get("schedule", {"kind": "step"})
    total = cfg["epochs"] * steps_per_epoch
    if s["kind"] == "step":
        return torch.optim.lr_scheduler.StepLR(opt, step_size=cfg["step_size"], gamma=cfg["gamma"]), False
    if s["kind"] == "one-cycle":
        return torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=cfg["lr"], total_steps=total, pct_start=s["pct_start"], anneal_strategy=s["anneal"],
            cycle_momentum=s["cycle_momentum"], base_momentum=s["base_momentum"], max_momentum=s["max_momentum"],
            div_factor=s["div_factor"], final_div_factor=s["final_div_factor"], three_phase=s["three_phase"]), True
    if s["kind"] == "warmup-cosine":
        w = s["warmup_steps"]
        lam = lambda k: (k + 1) / w if k < w else 0.5 * (1 + math.cos(math.pi * (k - w) / (total - w)))  # noqa: E731
        return torch.optim.lr_scheduler.LambdaLR(opt, lam), True
    raise SystemExit(f"unknown schedule {s['kind']}")


def augment(images, dy, dx, flip, fill):
    """ember's src/augment.rs: out[y, x] = in[y + dy, x' + dx], x' = w - 1 - x when mirrored; fill outside."""
    b, c, h, w = images.shape
    pixel = torch.arange(h * w, device=images.device).reshape(1, h * w)
    ys, xs = pixel // w, pixel % w
    src_x = xs + flip[:, None] * (w - 1 - 2 * xs) + dx[:, None]
    src_y = ys + dy[:, None]
    outside = (src_y < 0) | (src_y >= h) | (src_x < 0) | (src_x >= w)
    index = src_y.clamp(0, h - 1) * w + src_x.clamp(0, w - 1)
    moved = images.reshape(b, c, h * w).gather(2, index[:, None, :].expand(b, c, h * w))
    moved = moved.masked_fill(outside[:, None, :].expand(b, c, h * w), fill)
    return moved.reshape(b, c, h, w)


def evaluate(model, x, y, batch):
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y), batch):
            out = model(x[i:i + batch])
            loss += F.cross_entropy(out, y[i:i + batch], reduction="sum").item()
            correct += (out.argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return correct / len(y), loss / len(y)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="ember's config.json of the run to mirror")
    ap.add_argument("--data-dir", required=True, help="the dataset's four IDX .gz files")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    ap.add_argument("--epochs", type=int, help="override the config's epochs")
    ap.add_argument("--seed", type=int, help="override the config's seed")
    ap.add_argument("--json", help="write the epoch records here too")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = json.loads(pathlib.Path(args.config).read_text())
    if args.epochs:
        cfg["epochs"] = args.epochs
    if args.seed is not None:
        cfg["seed"] = args.seed
    torch.manual_seed(cfg["seed"])
    device = torch.device(args.device)
    mean, std = cfg["normalization"]["mean"], cfg["normalization"]["std"]
    x_train, y_train = models.load_split(args.data_dir, "train", mean, std)
    x_test, y_test = models.load_split(args.data_dir, "test", mean, std)
    valid = cfg.get("valid_size", 0)
    x_train, y_train = x_train[valid:], y_train[valid:]
    if cfg.get("limit_train"):
        x_train, y_train = x_train[:cfg["limit_train"]], y_train[:cfg["limit_train"]]
    if cfg.get("limit_test"):
        x_test, y_test = x_test[:cfg["limit_test"]], y_test[:cfg["limit_test"]]
    x_train, y_train, x_test, y_test = (t.to(device) for t in (x_train, y_train, x_test, y_test))

    model = MODELS[cfg["model"]]().to(device)
    opt = build_optimizer(cfg, model)
    batch = cfg["batch_size"]
    n = len(y_train)
    steps = (n + batch - 1) // batch
    sched, per_step = build_schedule(cfg, opt, steps)
    aug = cfg.get("augment", {"translate": 0, "flip": False})
    fill = (0.0 - mean) / std
    smoothing = cfg.get("label_smoothing", 0.0)
    target = cfg.get("target_accuracy")
    gen = torch.Generator(device="cpu").manual_seed(cfg["seed"])
    records = []
    model.train()
    for epoch in range(cfg["epochs"]):
        start = time.perf_counter()
        order = torch.randperm(n, generator=gen).to(device)
        t = aug["translate"]
        dy = torch.randint(-t, t + 1, (n,), generator=gen).to(device)
        dx = torch.randint(-t, t + 1, (n,), generator=gen).to(device)
        flip = (torch.rand(n, generator=gen) < 0.5).long().to(device) if aug["flip"] else torch.zeros(n, dtype=torch.long, device=device)
        loss_sum = torch.zeros((), device=device)
        for i in range(steps):
            idx = order[i * batch:(i + 1) * batch]
            images = x_train[idx]
            if t or aug["flip"]:
                images = augment(images, dy[i * batch:(i + 1) * batch], dx[i * batch:(i + 1) * batch],
                                 flip[i * batch:(i + 1) * batch], fill)
            out = model(images)
            if cfg["model"] == "pytorch-example-net":
                loss = F.nll_loss(out, y_train[idx])
            else:
                loss = F.cross_entropy(out, y_train[idx], label_smoothing=smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if per_step:
                sched.step()
            loss_sum += loss.detach()
        if not per_step:
            sched.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        train_seconds = time.perf_counter() - start
        acc, test_loss = evaluate(model, x_test, y_test, cfg["test_batch_size"])
        record = {"framework": "pytorch", "torch": torch.__version__, "threads": torch.get_num_threads(),
                  "recipe": cfg["recipe"], "epoch": epoch + 1, "train_loss": loss_sum.item() / steps,
                  "test_accuracy": 100.0 * acc, "test_loss": test_loss, "epoch_train_seconds": train_seconds,
                  "since_process_start": since_start()}
        records.append(record)
        print(json.dumps(record), flush=True)
        if target is not None and 100.0 * acc >= target:
            break
    final = dict(records[-1], final=True, target_accuracy=target,
                 reached=target is not None and records[-1]["test_accuracy"] >= target)
    print(json.dumps(final), flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(records + [final], indent=1) + "\n")


if __name__ == "__main__":
    main()
