#!/usr/bin/env bash
# Builds everything a GPU side by side needs and lays it out in one folder (default
# gpu-bundle/, git-ignored) of under 64 MiB, the most a run on a lent GPU machine can carry:
#
#   ember.gz    the release binary with --features cuda, stripped and compressed
#   parity.gz   the parity test binary (tests/parity.rs) with --features cuda, the same way
#   benches/    gpu.sh, schema.json, pytorch/*.py
#   data/mnist  the four MNIST files;  fixtures/  the parity fixtures
#   run.sh      the one command to run there: `bash gpu-bundle/run.sh [OUT]`
#
#   benches/gpu-bundle.sh [DIR] [--no-build]
#
# Build with CUDARC_CUDA_VERSION=13000 (the GPU machines' driver is CUDA 13.0; without nvcc here
# cudarc would assume the newest CUDA). --no-build packages binaries already built.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
dir="$root/gpu-bundle" build=1
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=; shift ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "gpu-bundle.sh: unknown argument $1" >&2; exit 2 ;;
        *) dir=$1; shift ;;
    esac
done
cd "$root"
export CUDARC_CUDA_VERSION=${CUDARC_CUDA_VERSION:-13000}
if [ -n "$build" ]; then
    cargo build --release --locked --features cuda --bin ember
    cargo test --release --locked --features cuda --test parity --no-run
fi
# The newest parity test binary cargo built with the cuda feature: cargo prints its path.
parity=$(cargo test --release --locked --features cuda --test parity --no-run --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*parity-[^"]*\)".*/\1/p' | tail -1)
[ -n "$parity" ] && [ -x "$parity" ] || { echo "gpu-bundle.sh: no parity test binary built with --features cuda" >&2; exit 1; }
ember=target/release/ember
info=$("$ember" info --device cpu)
grep -q "^compiled backends:.*cuda" <<< "$info" || { echo "gpu-bundle.sh: $ember was not built with --features cuda" >&2; exit 1; }

rm -rf "$dir"
mkdir -p "$dir/benches/pytorch" "$dir/data/mnist" "$dir/fixtures"
pack() { strip -o "$dir/$2" "$1" && gzip -9 "$dir/$2"; }
pack "$ember" ember
pack "$parity" parity
cp benches/gpu.sh benches/schema.json "$dir/benches/"
cp benches/pytorch/*.py "$dir/benches/pytorch/"
cp data/mnist/*-ubyte.gz "$dir/data/mnist/"
cp tests/fixtures/parity-*.safetensors tests/fixtures/pytorch-example-net.pt "$dir/fixtures/"
cat > "$dir/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the GPU machine: unpack the binaries and run the side by side; results go to $1, or $OUT.
set -uo pipefail
b=$(cd "$(dirname "$0")" && pwd)
out=${1:-${OUT:?give a results folder or set OUT}}
bin=$(mktemp -d)
gunzip -c "$b/ember.gz" > "$bin/ember" && gunzip -c "$b/parity.gz" > "$bin/parity" && chmod +x "$bin/ember" "$bin/parity"
exec bash "$b/benches/gpu.sh" "$out" --ember "$bin/ember" --parity "$bin/parity" --fixtures "$b/fixtures" \
    --data-dir "$b/data/mnist" "${@:2}"
RUN
chmod +x "$dir/run.sh"
size=$(du -sb "$dir" | cut -f1)
echo "gpu-bundle: $dir, $((size / 1048576)) MiB"
if [ "$size" -ge $((64 * 1048576)) ]; then
    echo "gpu-bundle.sh: $dir is $size bytes, over the 64 MiB a GPU run can carry" >&2
    exit 1
fi
