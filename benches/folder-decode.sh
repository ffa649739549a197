#!/usr/bin/env bash
# Reading 10,000 images from a folder into memory: ember (`ember data --dataset folder:...`,
# which lists, reads every header, and decodes in parallel into one buffer) next to
# torchvision.datasets.ImageFolder + DataLoader iterating the same folder once
# (benches/pytorch/imagefolder.py), on the same machine, the same number of threads/workers.
#
#   benches/folder-decode.sh OUT_DIR [PYTHON]     (PYTHON: one with torch and torchvision)
#
# Two folders built from Fashion-MNIST's 10,000 test images (benches/pytorch/make_image_folder.py):
# png28 (grey 28x28 PNG, read as 1 channel) and jpeg256 (colour 256x256 JPEG, read as RGB and
# resized to 64x64). Each side: one untimed pass (page cache), then REPEAT timed passes; the
# medians and spreads go to OUT_DIR/decode.md and decode.json (not results.json, the name benchmark records of benches/schema.json take), with lscpu.txt.
set -euo pipefail
out=${1:?usage: benches/folder-decode.sh OUT_DIR [PYTHON]}
py=${2:-python3}
ember=${EMBER:-target/release/ember}
repeat=${REPEAT:-5}
threads=${THREADS:-2}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
lscpu > "$out/lscpu.txt"
"$py" benches/pytorch/make_image_folder.py data/fashion-mnist "$work/png28" --format png
"$py" benches/pytorch/make_image_folder.py data/fashion-mnist "$work/jpeg256" --format jpeg --size 256 --colour
echo "[" > "$out/decode.json"
first=1
for set in "png28 1 -" "jpeg256 3 64"; do
  read -r name channels size <<< "$set"
  size_args=(); py_size=()
  if [ "$size" != "-" ]; then size_args=(--image-size "$size"); py_size=(--size "$size"); fi
  ember_secs=()
  for i in $(seq 0 "$repeat"); do
    RAYON_NUM_THREADS=$threads "$ember" data --json --dataset "folder:$work/$name" --channels "$channels" \
      "${size_args[@]}" > "$work/ember.json"
    s=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["decode_seconds"])' "$work/ember.json")
    [ "$i" = 0 ] || ember_secs+=("$s")
  done
  "$py" benches/pytorch/imagefolder.py "$work/$name" --channels "$channels" "${py_size[@]}" \
    --workers "$threads" --threads "$threads" --repeat "$repeat" --json "$work/torch.json"
  "$py" - "$name" "$work/torch.json" "$out/decode.json" "$first" "${ember_secs[@]}" <<'PY'
import json, statistics, sys
name, torch_json, out, first = sys.argv[1:5]
ember = [float(s) for s in sys.argv[5:]]
torch = json.load(open(torch_json))
n = torch["images"]
rec = {
    "folder": name, "images": n, "channels": torch["channels"], "size": torch["size"],
    "ember_seconds": ember, "ember_median": statistics.median(ember),
    "ember_images_per_second": n / statistics.median(ember),
    "torch": torch,
    "speedup": torch["median_seconds"] / statistics.median(ember),
}
with open(out, "a") as f:
    f.write(("" if first == "1" else ",\n") + json.dumps(rec, indent=2))
print(f"{name}: ember {rec['ember_median']:.3f} s ({rec['ember_images_per_second']:.0f} images/s, "
      f"min {min(ember):.3f} max {max(ember):.3f}); torchvision {torch['median_seconds']:.3f} s "
      f"({torch['images_per_second']:.0f} images/s); ember {rec['speedup']:.2f}x faster")
PY
  first=0
done
echo "]" >> "$out/decode.json"
"$py" - "$out/decode.json" "$threads" > "$out/decode.md" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
print(f"# Reading 10,000 images from a folder ({sys.argv[2]} threads / DataLoader workers each side)\n")
print("| folder | read as | ember s (median, min-max) | ember images/s | torchvision s (median, min-max) | torchvision images/s | ember speed-up |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    t = r["torch"]
    shape = f"{r['channels']}x{r['size'] or 28}"
    print(f"| {r['folder']} | {shape} | {r['ember_median']:.3f} ({min(r['ember_seconds']):.3f}-{max(r['ember_seconds']):.3f}) "
          f"| {r['ember_images_per_second']:.0f} | {t['median_seconds']:.3f} ({min(t['seconds']):.3f}-{max(t['seconds']):.3f}) "
          f"| {t['images_per_second']:.0f} | {r['speedup']:.2f}x |")
print(f"\ntorch {rows[0]['torch']['torch']}, torchvision {rows[0]['torch']['torchvision']}; CPU: lscpu.txt")
PY
cat "$out/decode.md"
