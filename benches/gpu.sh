#!/usr/bin/env bash
# The full ember vs PyTorch side by side on one CUDA GPU, in about 8 minutes, with nothing
# installed and no network: needs an `ember` built elsewhere with `--features cuda`, this
# repository's benches/ folder, the four MNIST files (data/mnist by default), and a Python with torch (torchvision and
# nvidia-ml-py for the DataLoader scenario and utilisation sampling, both in PyTorch's usual
# GPU images).
#
#   benches/gpu.sh OUT_DIR [--device cuda|cuda:N|cpu] [--ember PATH] [--data-dir DIR] [--python PY] [--quick]
#
# Writes OUT_DIR/results.json, results.md, train_step.png, eval.png and log.txt.
# --device cpu runs the same sequence on the CPU (CI-style smoke test of this script);
# --quick measures less (for a smoke test), not for publishing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# -ge 1 ] || { usage >&2; exit 2; }
case "$1" in -h|--help) usage; exit 0 ;; esac
out=$1; shift
device=cuda ember="$here/../target/release/ember" data="$here/../data/mnist" python=${EMBER_PYTHON:-python3}
quick=
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device=$2; shift 2 ;;
        --ember) ember=$2; shift 2 ;;
        --data-dir) data=$2; shift 2 ;;
        --python) python=$2; shift 2 ;;
        --quick) quick=1; shift ;;
        *) echo "gpu.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done
[ -x "$ember" ] || { echo "gpu.sh: no ember binary at $ember (--ember PATH)" >&2; exit 2; }
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
    [ -f "$data/$f" ] || { echo "gpu.sh: missing $data/$f (--data-dir DIR)" >&2; exit 2; }
done
"$python" -c 'import torch' || { echo "gpu.sh: $python cannot import torch (--python PY)" >&2; exit 2; }
mkdir -p "$out"
log="$out/log.txt"
{
    echo "# gpu.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) device=$device"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    "$ember" info --device "$device"
    "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
} 2>&1 | tee "$log"

if [ -n "$quick" ]; then
    measure=(--warmup 2 --steps 3 --repeats 2 --eval-repeats 1)
    scenarios=net64
elif [ "$device" = cpu ]; then
    measure=(--warmup 5 --steps 10 --repeats 3 --eval-repeats 2)
    scenarios=net64,net256,flash64
else
    # GPU steps take milliseconds: more of them, and full epochs (the seed write-ups' figure).
    measure=(--warmup 30 --steps 100 --repeats 5 --eval-repeats 5 --full-epoch)
    scenarios=net64,net256,tch256,flash64
fi
"$ember" compare --device "$device" --scenarios "$scenarios" "${measure[@]}" \
    --python "$python" --pytorch-script "$here/pytorch/bench.py" --data-dir "$data" --offline --out "$out" 2>&1 | tee -a "$log"
