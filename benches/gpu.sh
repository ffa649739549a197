#!/usr/bin/env bash
# The ember vs PyTorch side by side on one CUDA GPU within a deadline, with nothing installed and
# no network: needs an `ember` built elsewhere with `--features cuda` (benches/gpu-bundle.sh
# packs one), this benches/ folder and the four MNIST files. Optional: a Python with torch
# (without it, ember's records only), torchvision and nvidia-ml-py (DataLoader scenario and
# utilisation sampling on the PyTorch side), the parity test binary (--parity).
#
#   benches/gpu.sh OUT_DIR [--device cuda|cuda:N|cpu] [--ember PATH] [--data-dir DIR] [--python PY]
#                  [--parity PATH] [--fixtures DIR] [--deadline SECONDS] [--timeout SECONDS] [--quick]
#
# Writes OUT_DIR/results.json, results.md, train_step.png, eval.png, log.txt, and parity.txt
# when it ran the parity tests. Every measurement is written as it finishes; one that fails or
# outlives --timeout (default 150 s) is listed in results.md and the others are kept. Nothing
# starts after --deadline (default 420 s from the start). --device cpu runs the same sequence on
# the CPU (the smoke test of this script); --quick measures less, not for publishing.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# -ge 1 ] || { usage >&2; exit 2; }
case "$1" in -h|--help) usage; exit 0 ;; -*) usage >&2; exit 2 ;; esac
out=$1; shift
device=cuda ember="$here/../target/release/ember" data="$here/../data/mnist" python=${EMBER_PYTHON:-python3}
parity= fixtures= deadline=420 timeout=150 quick=
while [ $# -gt 0 ]; do
    case "$1" in
        --device|--ember|--data-dir|--python|--parity|--fixtures|--deadline|--timeout)
            [ $# -ge 2 ] || { echo "gpu.sh: $1 needs a value" >&2; exit 2; } ;;
    esac
    case "$1" in
        --device) device=$2; shift 2 ;;
        --ember) ember=$2; shift 2 ;;
        --data-dir) data=$2; shift 2 ;;
        --python) python=$2; shift 2 ;;
        --parity) parity=$2; shift 2 ;;
        --fixtures) fixtures=$2; shift 2 ;;
        --deadline) deadline=$2; shift 2 ;;
        --timeout) timeout=$2; shift 2 ;;
        --quick) quick=1; shift ;;
        *) echo "gpu.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done
for n in "$deadline" "$timeout"; do
    case "$n" in ''|*[!0-9]*|0) echo "gpu.sh: --deadline and --timeout take whole seconds > 0, got '$n'" >&2; exit 2 ;; esac
done
[ -x "$ember" ] || { echo "gpu.sh: no ember binary at $ember (--ember PATH)" >&2; exit 2; }
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
    [ -f "$data/$f" ] || { echo "gpu.sh: missing $data/$f (--data-dir DIR)" >&2; exit 2; }
done
mkdir -p "$out" || exit 2
log="$out/log.txt"
start=$(date +%s)
left() { echo $((deadline - ($(date +%s) - start))); }
say() { echo "$*" | tee -a "$log"; }
: > "$log"
say "# gpu.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) device=$device deadline=${deadline}s timeout=${timeout}s"
{
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total --format=csv
    command -v lscpu >/dev/null && lscpu | grep -E '^(Model name|CPU\(s\)|Flags)' | cut -c1-200
} >> "$log" 2>&1
# The preflight: on a GPU it loads the driver, finds NVRTC and the headers and runs a
# convolution; its failure is one line in the log, and the measurements below say the rest.
timeout 120 "$ember" info --device "$device" 2>&1 | tee -a "$log"
info_status=${PIPESTATUS[0]}
[ "$info_status" -eq 0 ] || say "gpu.sh: ember info --device $device failed ($info_status)"

pytorch=(--python "$python" --pytorch-script "$here/pytorch/bench.py")
if why=$("$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1); then
    say "$why"
else
    say "gpu.sh: $python cannot import torch: ember's records only (${why##*$'\n'})"
    pytorch=(--without-pytorch)
fi

if [ -n "$parity" ]; then
    if [ -x "$parity" ] && [ "$(left)" -gt 60 ]; then
        fx=()
        [ -n "$fixtures" ] && fx=(EMBER_FIXTURES="$fixtures")
        say "parity tests ($parity), at most 120 s"
        env "${fx[@]}" timeout 120 "$parity" --test-threads 1 > "$out/parity.txt" 2>&1
        say "parity: exit $? ($(grep -E '^test result' "$out/parity.txt" | tail -1))"
    else
        say "gpu.sh: parity tests not run (no executable $parity, or under 60 s left)"
    fi
fi

if [ -n "$quick" ]; then
    measure=(--warmup 2 --steps 3 --repeats 2 --eval-repeats 1)
    scenarios=net64
elif [ "$device" = cpu ]; then
    measure=(--warmup 5 --steps 10 --repeats 3 --eval-repeats 2)
    scenarios=net64,net256,flash64
else
    # GPU steps take milliseconds: more of them, full epochs (the seed write-ups' figure), and
    # the batches that fill a GPU.
    measure=(--warmup 30 --steps 100 --repeats 5 --eval-repeats 5 --full-epoch)
    scenarios=net64,net256,net1024,net4096,tch256,flash64
fi
remaining=$(left)
if [ "$remaining" -le 10 ]; then
    say "gpu.sh: the deadline passed before any measurement"
    exit 1
fi
"$ember" compare --device "$device" --scenarios "$scenarios" "${measure[@]}" "${pytorch[@]}" \
    --timeout "$timeout" --deadline "$((remaining - 5))" --data-dir "$data" --offline --out "$out" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
say "gpu.sh: compare exit $status after $(( $(date +%s) - start )) s; results in $out"
exit "$status"
