"""Ships the ``kindling_client`` package to a Spark session's executors as one
zip, as a user of the package does: ``spark.addArtifacts(zip, pyfile=True)``."""

import os
import shutil
import tempfile


def ship_package(spark, package_dir):
    """Zips ``package_dir`` (a package folder) and adds it to ``spark``'s
    session; its modules are then importable in the session's tasks."""
    package_dir = os.path.abspath(package_dir)
    out = tempfile.mkdtemp(prefix="kindling-ship-")
    base = os.path.join(out, os.path.basename(package_dir))
    archive = shutil.make_archive(base, "zip", root_dir=os.path.dirname(package_dir),
                                  base_dir=os.path.basename(package_dir))
    spark.addArtifacts(archive, pyfile=True)
    return archive
