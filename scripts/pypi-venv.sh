#!/usr/bin/env bash
# scripts/pypi-venv.sh PACKAGE VERSION MODULE [REQUIREMENT...]: prints the path of a Python that
# has PACKAGE at VERSION from PyPI, with the further REQUIREMENTs (`name==version`) beside it
# (MODULE imports), making a virtual environment for it under ~/.cache/quorum on first use. The tests run real Python clients this way: submitit, which
# drives Slurm through its commands (cli/tests/it/slurm_commands.rs), and Prometheus's own client,
# whose strict OpenMetrics parser reads the controllers' /metrics (cli/tests/it/observe.rs).
set -euo pipefail
package=$1 version=$2 module=$3
shift 3
extra=("$@")
suffix=""
for r in "${extra[@]}"; do suffix+="+${r//[^A-Za-z0-9._=-]/}"; done
dir="${XDG_CACHE_HOME:-$HOME/.cache}/quorum/$package-$version$suffix"
mkdir -p "$(dirname "$dir")"
# Tests running side by side may ask for the same package at once: one makes it, the others
# wait for it (two making one environment together break each other's pip).
exec 9>"$dir.lock"
flock 9
if ! "$dir/bin/python" -c "import $module" >/dev/null 2>&1; then
  rm -rf "$dir"
  python3 -m venv "$dir" >&2
  "$dir/bin/pip" install --quiet --disable-pip-version-check "$package==$version" "${extra[@]}" >&2
fi
echo "$dir/bin/python"
