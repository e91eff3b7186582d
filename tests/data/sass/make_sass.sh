#!/bin/sh
# Regenerate the SASS listings next to each .cu file: `cuobjdump -sass` of an -O3 cubin for
# sm_80 and sm_90, and one `nvdisasm` listing (labels instead of addresses in branches).
# Needs nvcc and cuobjdump/nvdisasm (a CUDA toolkit, or pip install nvidia-cuda-cuobjdump
# nvidia-cuda-nvdisasm); CUOBJDUMP and NVDISASM name other binaries.
set -eu
cd "$(dirname "$0")"
CUOBJDUMP=${CUOBJDUMP:-cuobjdump}
NVDISASM=${NVDISASM:-nvdisasm}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for src in *.cu; do
  name=${src%.cu}
  for arch in sm_80 sm_90; do
    nvcc -cubin -arch=$arch -O3 -o "$tmp/$name.$arch.cubin" "$src"
    "$CUOBJDUMP" -sass "$tmp/$name.$arch.cubin" > "$name.$arch.sass"
  done
done
"$NVDISASM" "$tmp/reduction.sm_90.cubin" > reduction.sm_90.nvdisasm
