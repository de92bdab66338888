#!/usr/bin/env bash
# Install every hip-python release line the stand-in HIP tests run against, side by side,
# into ~/.cache/kdbkit-tests/hip-python/<line>/ (or $KDB_TEST_HIP_PYTHON_DIR/<line>; pip
# --target, so nothing enters the venv; about 700 MB in all).
# The lines are listed in tests/hip_standin/hip_python_lines.txt. Usage:
#   scripts/install_hip_python_lines.sh      # then: python -m pytest tests/runtime/backends/test_hip_standin.py
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${KDB_TEST_HIP_PYTHON_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kdbkit-tests/hip-python}"
python="${PYTHON:-python}"
while read -r line specs; do
    [[ -z "$line" || "$line" == \#* ]] && continue
    [[ -f "$dest/$line/.installed" ]] && continue
    echo "installing hip-python $line into $dest/$line" >&2
    rm -rf "${dest:?}/$line"
    # shellcheck disable=SC2086  # specs is a list of requirements
    "$python" -m pip install -q --disable-pip-version-check --no-deps --target "$dest/$line" $specs
    touch "$dest/$line/.installed"
done < tests/hip_standin/hip_python_lines.txt
