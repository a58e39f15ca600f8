#!/usr/bin/env bash
# Install the benchmark's extra dependencies into the environment of the given
# Python interpreter (default: the project's .venv).
#
#   bash bench/install.sh [PYTHON]
#
# beam-pyspark-runner 0.0.3 pins old apache-beam / pyspark releases, so it is
# installed with --no-deps on top of the Beam and PySpark already present.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${1:-${here}/../.venv/bin/python}"
"$py" -m pip install --quiet --disable-pip-version-check -r "${here}/requirements.txt"
"$py" -m pip install --quiet --disable-pip-version-check --no-deps beam-pyspark-runner==0.0.3
