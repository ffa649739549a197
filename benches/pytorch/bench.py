#!/usr/bin/env python3
"""PyTorch side of `ember compare`: the seed scenarios, timed as `ember bench` times them, written
as the same JSON record (benches/schema.json, checked before writing).

    python3 benches/pytorch/bench.py --scenario net64 --mode preloaded --device cpu --threads 2 --json out.json

Modes:
  dataloader   how the seed runs fed PyTorch. net*/tch*: PyTorch's MNIST example exactly:
               torchvision.datasets.MNIST with ToTensor+Normalize per item, DataLoader with
               shuffle, and on CUDA num_workers=1, pin_memory=True. flash*: flashlight's
               example, a batch loader over a pre-normalised tensor, no shuffle.
  preloaded    the whole split on the device, each batch index-selected there (what ember does).
  preloaded-tf32   preloaded with TF32 allowed for matmuls and convolutions, ember's precision
               on CUDA (PyTorch's default allows it for convolutions only) (CUDA only).
  preloaded-cudnn-benchmark   the same with torch.backends.cudnn.benchmark = True (CUDA only).

Training steps: warm-up, then `repeats` runs of `steps` steps, each ended by a device sync;
a run's figure is its mean time per step. Evaluation: 10,000 test images in batches of 1,000,
one untimed pass, then timed passes, with the initial and with the trained weights.
Needs torch and numpy; torchvision for the net*/tch* dataloader mode; nvidia-ml-py (pynvml)
for GPU utilisation, which is then recorded as null if missing. Device memory: NVML's peak
"used" over the whole run minus its reading before CUDA starts (the device found by PCI bus id),
and torch's max_memory_reserved.
"""
import argparse
import datetime
import gzip
import json
import pathlib
import resource
import shutil
import socket
import sys
import tempfile
import threading
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from models import MODELS, load_split, optimizer  # noqa: E402
from schema_check import validate  # noqa: E402
import recipe  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]

# scenario -> (model, batch size); same table as ember's bench::Scenario.
SCENARIOS = {
    "net64": ("pytorch-example-net", 64),
    "net256": ("pytorch-example-net", 256),
    "net1024": ("pytorch-example-net", 1024),
    "net4096": ("pytorch-example-net", 4096),
    "tch256": ("tch-net", 256),
    "flash64": ("flashlight-cnn", 64),
}
# The modern scenarios train with a recipe of their own (parameter groups, one-cycle schedule,
# label smoothing, augmentation): ember compare passes the scenario's config.json (--config),
# read with recipe.py's functions, so both sides take the settings from ember's one source.
MODERN = {"resnet20-128", "resnet18-128", "speedrun-256"}
# Forward multiply-accumulates per image (ember's ModelKind::layers, checked against forward
# hooks by layer_counts.py) at the scenario's input shape.
FORWARD_MACS = {"pytorch-example-net": 11_992_448, "tch-net": 11_992_448, "flashlight-cnn": 13_883_904}


def stats(samples):
    s = sorted(samples)
    n = len(s)
    median = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    return {"median": median, "min": s[0], "max": s[-1], "samples": list(samples)}


def quantile(samples, q):
    s = sorted(samples)
    rank = min(max(int(-(-q * len(s) // 1)), 1), len(s))
    return s[rank - 1]


class GpuSampler:
    """NVML every 100 ms from before CUDA starts to the end, like ember's GpuMonitor: peak used
    memory minus the first reading, and utilisation while `timing` is set."""

    def __init__(self, index):
        import pynvml
        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle, self.matched_by = self.find(index)
        self.start_used = pynvml.nvmlDeviceGetMemoryInfo(self.handle).used
        self.util, self.used_max = [], self.start_used
        self.timing = threading.Event()
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def find(self, index):
        # CUDA orders devices by speed unless CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML by PCI bus: match
        # by bus id. Reading it needs CUDA's device properties, which do not create a context.
        try:
            p = torch.cuda.get_device_properties(index)
            bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
            return self.nvml.nvmlDeviceGetHandleByPciBusId_v2(bus.encode()), f"pci-bus-id {bus}"
        except Exception:
            return self.nvml.nvmlDeviceGetHandleByIndex(index), f"index {index}"

    def run(self):
        while not self.stop_flag.is_set():
            if self.timing.is_set():
                self.util.append(float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))
            self.used_max = max(self.used_max, self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)
            time.sleep(0.1)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.stop_flag.set()
        self.thread.join()

    @property
    def used_peak(self):
        return self.used_max - self.start_used


def precision(device):
    """The schema's name for the matmul/conv arithmetic in effect."""
    if device.type != "cuda":
        return "f32"
    matmul, conv = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    return "tf32" if matmul and conv else "tf32-conv" if conv else "f32"


def forward_macs(model, image):
    """Multiply-accumulates of the convolutions and linear layers for one image, by forward hooks
    (as layer_counts.py checks ember's ModelKind::layers)."""
    total = 0

    def hook(m, inp, out):
        nonlocal total
        if isinstance(m, torch.nn.Conv2d):
            total += out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
        elif isinstance(m, torch.nn.Linear):
            total += out.numel() * m.in_features

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        model(image)
    model.train(was_training)
    for h in handles:
        h.remove()
    return total


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def official_loader(data_dir, batch, device, mean, std):
    """pytorch/examples mnist/main.py's training loader over the IDX files in data_dir."""
    from torchvision import datasets, transforms
    root = pathlib.Path(tempfile.mkdtemp(prefix="ember-bench-mnist-"))
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]:
        src = pathlib.Path(data_dir) / f"{name}.gz"
        with gzip.open(src) as f, open(raw / name, "wb") as out:
            shutil.copyfileobj(f, out)
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((mean,), (std,))])
    dataset = datasets.MNIST(str(root), train=True, download=False, transform=transform)
    kwargs = {"batch_size": batch, "shuffle": True}
    if device.type == "cuda":
        kwargs.update({"num_workers": 1, "pin_memory": True})
    return torch.utils.data.DataLoader(dataset, **kwargs), root


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", required=True, choices=[*SCENARIOS, *sorted(MODERN)])
    ap.add_argument("--config", help="the scenario's config.json (ember compare writes it); the modern scenarios need it")
    ap.add_argument("--mode", required=True, choices=["dataloader", "preloaded", "preloaded-tf32", "preloaded-cudnn-benchmark"])
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (pin to ember's)")
    ap.add_argument("--data-dir", default=str(ROOT / "data/mnist"))
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--eval-repeats", type=int, default=3)
    ap.add_argument("--full-epoch", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the record here")
    args = ap.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"error: --device {args.device}: PyTorch sees no CUDA device")
    if args.mode == "preloaded-tf32":
        if device.type != "cuda":
            sys.exit("error: --mode preloaded-tf32 needs a CUDA device")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    sampler = None
    if device.type == "cuda":
        try:
            sampler = GpuSampler(device.index or 0).start()
        except Exception as e:  # pynvml missing or NVML failing: recorded as null
            print(f"note: no GPU utilisation sampling ({e})", file=sys.stderr)
    if args.mode == "preloaded-cudnn-benchmark":
        if device.type != "cuda":
            sys.exit("error: --mode preloaded-cudnn-benchmark needs a CUDA device")
        torch.backends.cudnn.benchmark = True
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    augment = None
    if args.scenario in MODERN:
        if not args.config:
            sys.exit(f"error: --scenario {args.scenario} needs --config (ember compare writes the scenario's config.json)")
        if args.mode not in ("preloaded", "preloaded-tf32", "preloaded-cudnn-benchmark"):
            sys.exit(f"error: --scenario {args.scenario} runs preloaded modes only (its twin's input pipeline is ember's)")
        cfg = json.loads(pathlib.Path(args.config).read_text())
        model_name, batch = cfg["model"], cfg["batch_size"]
        shape = cfg["input"]
        mean, std = cfg["normalization"]["mean"], cfg["normalization"]["std"]
        x_train, y_train = load_split(args.data_dir, "train", mean, std)
        x_test, y_test = load_split(args.data_dir, "test", mean, std)
        if cfg.get("limit_train"):
            x_train, y_train = x_train[:cfg["limit_train"]], y_train[:cfg["limit_train"]]
        if cfg.get("limit_test"):
            x_test, y_test = x_test[:cfg["limit_test"]], y_test[:cfg["limit_test"]]
        if shape["channels"] == 3:
            # ember's Scenario::images: each digit centred on a 32x32 canvas of background
            # (raw 0, normalised), repeated in three channels.
            pad = ((shape["width"] - 28) // 2, (shape["width"] - 28 + 1) // 2,
                   (shape["height"] - 28) // 2, (shape["height"] - 28 + 1) // 2)
            x_train, x_test = (F.pad(x, pad, value=(0.0 - mean) / std).expand(-1, 3, -1, -1).contiguous()
                               for x in (x_train, x_test))
        model = recipe.MODELS[model_name](in_channels=shape["channels"]).to(device)
        opt = recipe.build_optimizer(cfg, model)
        sched, per_step = recipe.build_schedule(cfg, opt, -(-len(y_train) // batch))
        smoothing = cfg.get("label_smoothing", 0.0)
        loss_fn = lambda out, y: F.cross_entropy(out, y, label_smoothing=smoothing)  # noqa: E731
        aug = cfg.get("augment", {"translate": 0, "flip": False})
        if aug["translate"] or aug["flip"]:
            augment = (aug, (0.0 - mean) / std)
        opt_name = cfg["optimizer"]["kind"]
    else:
        model_name, batch = SCENARIOS[args.scenario]
        make, log_probs, opt_name, lr, (mean, std) = MODELS[model_name]
        x_train, y_train = load_split(args.data_dir, "train", mean, std)
        x_test, y_test = load_split(args.data_dir, "test", mean, std)
        model = make().to(device)
        opt = optimizer(opt_name, model.parameters(), lr)
        sched, per_step = None, False
        loss_fn = (lambda out, y: F.nll_loss(out, y)) if log_probs else (lambda out, y: F.cross_entropy(out, y))
    x_test, y_test = x_test.to(device), y_test.to(device)

    def evaluate():
        model.eval()
        with torch.no_grad():
            correct = torch.zeros((), dtype=torch.int64, device=device)
            for i in range(0, len(y_test), 1000):
                out = model(x_test[i:i + 1000])
                correct += (out.argmax(1) == y_test[i:i + 1000]).sum()
            correct.item()
        model.train()

    def eval_throughput():
        evaluate()
        samples = []
        for _ in range(max(args.eval_repeats, 1)):
            sync(device)
            t = time.perf_counter()
            evaluate()
            sync(device)
            samples.append(len(y_test) / (time.perf_counter() - t))
        return stats(samples)

    untrained = eval_throughput()

    tmp_root = None
    if args.mode == "dataloader":
        if model_name == "flashlight-cnn":
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_train, y_train), batch_size=batch, shuffle=False)
        else:
            loader, tmp_root = official_loader(args.data_dir, batch, device, mean, std)

        def batches():
            while True:
                for x, y in loader:
                    yield x.to(device), y.to(device)
    else:
        x_dev, y_dev = x_train.to(device), y_train.to(device)

        def batches():
            while True:
                perm = torch.randperm(len(y_dev), device=device)
                if augment:
                    # As recipe.py (and ember's src/augment.rs): shifts and flips drawn per
                    # epoch, applied to each gathered batch on the device.
                    (aug, fill), n, t = augment, len(y_dev), augment[0]["translate"]
                    dy = torch.randint(-t, t + 1, (n,), device=device)
                    dx = torch.randint(-t, t + 1, (n,), device=device)
                    flip = ((torch.rand(n, device=device) < 0.5).long() if aug["flip"]
                            else torch.zeros(n, dtype=torch.long, device=device))
                for i in range(0, len(perm), batch):
                    idx = perm[i:i + batch]
                    x = x_dev.index_select(0, idx)
                    if augment:
                        x = recipe.augment(x, dy[i:i + batch], dx[i:i + batch], flip[i:i + batch], fill)
                    yield x, y_dev.index_select(0, idx)

    stream = batches()

    def step():
        x, y = next(stream)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if per_step:
            sched.step()
        return loss

    model.train()
    for _ in range(args.warmup):
        step()
    sync(device)
    if sampler:
        sampler.timing.set()
    step_ms = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync(device)
        step_ms.append((time.perf_counter() - t) * 1e3 / args.steps)
    train_ms = stats(step_ms)
    steps_per_epoch = -(-len(y_train) // batch)
    if args.full_epoch:
        t = time.perf_counter()
        for _ in range(steps_per_epoch):
            step()
        sync(device)
        epoch_seconds, measured = time.perf_counter() - t, True
    else:
        epoch_seconds, measured = train_ms["median"] * steps_per_epoch / 1e3, False
    if sampler:
        sampler.timing.clear()
    trained = eval_throughput()
    if sampler:
        sampler.stop()
        print(f"NVML device matched by {sampler.matched_by}", file=sys.stderr)
    if tmp_root:
        shutil.rmtree(tmp_root, ignore_errors=True)

    images_per_sec = batch / (train_ms["median"] / 1e3)
    flops = 6.0 * (forward_macs(model, x_test[:1]) if args.scenario in MODERN else FORWARD_MACS[model_name])
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        dev = f"cuda:{device.index or 0} ({name})"
    else:
        dev = f"cpu ({torch.get_num_threads()} threads)"
    record = {
        "schema": "ember-bench/1",
        "framework": "pytorch",
        "framework_version": torch.__version__,
        "scenario": args.scenario,
        "mode": args.mode,
        "model": model_name,
        "optimizer": opt_name,
        "backend": f"pytorch-{device.type}",
        "device": dev,
        "threads": torch.get_num_threads(),
        "batch_size": batch,
        "dtype": "f32",
        "precision": precision(device),
        "warmup_steps": args.warmup,
        "timed_steps": args.steps,
        "repeats": args.repeats,
        "train_step_ms": train_ms,
        "train_images_per_sec": images_per_sec,
        "epoch_seconds": epoch_seconds,
        "epoch_measured": measured,
        "eval": {
            "batch_size": 1000,
            "images": len(y_test),
            "untrained_images_per_sec": untrained,
            "trained_images_per_sec": trained,
        },
        "memory": {
            # ru_maxrss is in KiB on Linux.
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "device_pool_bytes": torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None,
            "device_used_bytes": sampler.used_peak if sampler else None,
        },
        "gpu_utilization": None if not sampler or not sampler.util else {
            "interval_ms": 100,
            "samples": len(sampler.util),
            "mean_percent": sum(sampler.util) / len(sampler.util),
            "p10_percent": quantile(sampler.util, 0.1),
        },
        "train_flops_per_image": flops,
        "achieved_tflops": flops * images_per_sec / 1e12,
        "host": socket.gethostname(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S"),
    }
    validate(record)
    line = (f"{args.scenario:<8} pytorch {args.mode:<26} step {train_ms['median']:8.2f} ms "
            f"(min {train_ms['min']:.2f}, max {train_ms['max']:.2f})  {images_per_sec:7.0f} img/s  "
            f"eval {untrained['median']:6.0f}/{trained['median']:6.0f} img/s  "
            f"rss {record['memory']['peak_rss_bytes'] / 2**20:5.0f} MiB")
    print(line)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
