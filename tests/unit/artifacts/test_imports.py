"""sparkbeam.artifacts stays light: no pyspark, no executor, and fsspec only when asked for."""
from __future__ import annotations

import subprocess
import sys


def test_importing_the_package_loads_neither_spark_nor_fsspec() -> None:
    code = (
        "import sys\n"
        "import sparkbeam.artifacts\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'fsspec')\n"
        "       or m.startswith('sparkbeam.execute')]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == ""
