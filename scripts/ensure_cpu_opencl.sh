#!/usr/bin/env bash
# Make sure this machine has a CPU OpenCL device that compiles (kdbkit's embedded default
# when there is no GPU). PyPI's pocl-binary-distribution 3.0 ships LLVM 14, which rejects
# CPUs newer than it knows ("unknown target CPU", seen on AMD Zen 5); Debian's
# pocl-opencl-icd (PoCL 3.1, LLVM 15) works there. This installs it only when needed.
set -euo pipefail

probe() {
    python - <<'PY'
import sys
try:
    import pyopencl as cl
except ImportError:
    sys.exit("pyopencl is not installed: pip install 'kdbkit[opencl]'")
for platform in cl.get_platforms():
    for device in platform.get_devices():
        try:
            cl.Program(cl.Context([device]), "__kernel void k(__global float* x) { x[0] = 1.0f; }").build()
            print(f"OpenCL device that compiles: {device.name} ({platform.version})")
            sys.exit(0)
        except Exception:
            pass
sys.exit(1)
PY
}

probe && exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "no OpenCL device here compiles; installing Debian's PoCL (pocl-opencl-icd)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pocl-opencl-icd >/dev/null
    probe && exit 0
fi
echo "error: no OpenCL device that compiles; install your distribution's PoCL" \
     "(Debian/Ubuntu: sudo apt-get install pocl-opencl-icd)" >&2
exit 1
