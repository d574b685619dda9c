"""format("shoal") without registering it: PySpark 4 imports every top-level
module whose name starts with `pyspark_` (pkgutil.iter_modules(), in a Python
worker, the first time a session looks a data source up) and registers its
`DefaultSource` under `DefaultSource.name()`. Installed as the top-level
package `pyspark_shoal`. Its folder spark/discovery holds nothing else,
because an editable install puts that folder on sys.path
(spark/build_backend). spark/README.md."""

from shoal.spark.datasource import ShoalDataSource as DefaultSource

__all__ = ["DefaultSource"]
