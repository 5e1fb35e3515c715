#!/usr/bin/env bash
# `pip install --no-build-isolation ./python` installs a working atoll package from the build tree
# (into a temporary folder; a copy of python/ so the source tree stays clean).
# Usage: pip_install_test.sh PYTHON SOURCE_DIR BUILD_DIR
set -euo pipefail
py=$1 src=$2 build=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$src/python" "$tmp/src"
ATOLL_BUILD_DIR=$build "$py" -m pip install --quiet --root-user-action=ignore --no-build-isolation --no-deps --no-cache-dir \
  --target "$tmp/site" "$tmp/src"
test -f "$tmp/site/atoll/py.typed"
test -f "$tmp/site/atoll/__init__.pyi"
cd "$tmp"
PYTHONPATH="$tmp/site" "$py" - <<'PY'
import atoll, numpy as np
assert atoll.__file__.startswith(__import__("os").getcwd()), atoll.__file__
try:
    atoll.Learner("", {"w": np.zeros(4, dtype=np.float32)})
except ValueError as e:
    assert "syncer" in str(e), e
else:
    raise SystemExit("no error for an empty syncer address")
print("pip install: ok,", atoll.__file__)
PY
