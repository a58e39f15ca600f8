"""Spark's Python processes import the installed PySpark, not Spark's zip of it (no pyspark,
standard library only; `reorder_sys_path` changes this process's `sys.path`, nothing else does).

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on the PYTHONPATH of every Python process
it starts. With a pip-installed PySpark, SPARK_HOME is that package's own directory and the zip
holds the same release's sources; but Python keeps no bytecode for modules imported from a zip,
so each process that imports PySpark from it compiles ~1,300 modules again: ~0.9 s of this
machine's 2.9 s for sparkbeam's preloading daemon, and ~1 s of each process Spark starts to plan
a streaming query (one per `transformWithState` operator and one per Python data source, one
after the other, before the query's first micro-batch). Moved behind the package's site
directory, the same PySpark is imported from the installed files, whose bytecode is cached. A
zip of any other Spark installation (a SPARK_HOME that is not an installed `pyspark` package)
stays where Spark put it.

This is a top-level module, not part of the `sparkbeam` package, because `sparkbeam_site.pth`
(installed beside it in the site directory) runs it in every Python process Spark starts, where
no sparkbeam code runs before PySpark's own `-m` module imports PySpark: it must not import
sparkbeam's package (whose `__init__` sets up logging). The .pth imports this module only in a
process whose PYTHONPATH names `pyspark.zip`, and only if it is importable (an editable install
whose checkout moved prints nothing). It finds the installed PySpark only when pyspark's site
directory is already on the path as the .pth runs: both in one site directory (a virtualenv,
pip's usual layout), or pyspark's processed first; otherwise (sparkbeam in the user site,
pyspark in the system's) the zip stays first. The daemon (`sparkbeam.execute.daemon`) calls it
too, for a Python started without site processing.
"""
from __future__ import annotations

import os
import sys

_ZIP = os.path.join("python", "lib", "pyspark.zip")


def installed_pyspark_first(path: list[str]) -> list[str]:
    """`path` (a `sys.path`) with the zips of installed PySpark packages moved to its end."""
    on_path = {os.path.realpath(entry) for entry in path if entry}
    moved = [entry for entry in path if _zip_of_installed_package(entry, on_path)]
    return [entry for entry in path if entry not in moved] + moved


def reorder_sys_path() -> None:
    """`installed_pyspark_first` applied to this process's `sys.path` (the .pth's call)."""
    sys.path[:] = installed_pyspark_first(sys.path)


def _zip_of_installed_package(entry: str, on_path: set[str]) -> bool:
    if not entry.endswith(os.sep + _ZIP):
        return False
    package = entry[: -len(os.sep + _ZIP)]
    # The zip's SPARK_HOME is an importable `pyspark` package (pip's layout) in a site
    # directory this path holds, so the PySpark imported instead is that very package, the
    # release the JVM runs. A worker whose Python has another PySpark (another environment's)
    # keeps the zip first, as Spark put it.
    return (os.path.basename(package) == "pyspark"
            and os.path.isfile(os.path.join(package, "__init__.py"))
            and os.path.realpath(os.path.dirname(package)) in on_path)
