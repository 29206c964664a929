#!/usr/bin/env bash
# Prints the path of a Python that has submitit (a workflow client from PyPI that drives Slurm
# through its commands), making a virtual environment for it on first use. The tests run
# submitit, unmodified, against Quorum's Slurm commands (cli/tests/slurm_commands.rs).
set -euo pipefail
version=1.5.4
dir="${QUORUM_SUBMITIT_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/quorum/submitit-$version}"
if ! "$dir/bin/python" -c 'import submitit' >/dev/null 2>&1; then
  rm -rf "$dir"
  mkdir -p "$(dirname "$dir")"
  python3 -m venv "$dir" >&2
  "$dir/bin/pip" install --quiet --disable-pip-version-check "submitit==$version" >&2
fi
echo "$dir/bin/python"
