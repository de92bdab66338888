#!/usr/bin/env bash
# Install the precompiled kdbkit kernels for this machine's GPUs, as MIOpen's
# install_precompiled_kernels.sh does for its miopenkernels-<arch>-<cu> packages.
#
#   scripts/install_precompiled_kernels.sh DIR [kdb install options]
#
# DIR is a folder of kernel wheels and bundles (what `kdb package` writes), or a local package
# index; KDB_KERNEL_PACKAGES names it when no DIR is given. Each local GPU gets the best fit
# (exact <arch>_<cu>, else arch-wide, never another arch), verified before anything is
# installed, into the Python environment of $PYTHON (default: the python3 on PATH).
# Options pass through to `kdb install`: --dry-run, --explain, --target sm_90_132, --json.
set -euo pipefail

python="${PYTHON:-python3}"
if [[ $# -gt 0 && $1 != -* ]]; then
    from="$1"
    shift
else
    from="${KDB_KERNEL_PACKAGES:-}"
fi
if [[ -z $from ]]; then
    echo "error: no package folder; give it as the first argument or set KDB_KERNEL_PACKAGES" >&2
    echo "usage: $0 DIR [--dry-run] [--explain] [--target TARGET]..." >&2
    exit 2
fi
if [[ ! -d $from ]]; then
    echo "error: $from is not a folder; give the folder that holds the kernel wheels or bundles" >&2
    exit 2
fi
if ! "$python" -c "import kdbkit" 2>/dev/null; then
    echo "error: kdbkit is not installed for $python; install it first (pip install kdbkit), or set PYTHON" >&2
    exit 2
fi
exec "$python" -c "import sys; from kdbkit.runtime.cli.app import main; sys.argv[0] = 'kdb'; sys.exit(main())" \
    install --from "$from" "$@"
