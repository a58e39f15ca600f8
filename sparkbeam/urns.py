"""URN constants sparkbeam dispatches on (Beam's own, gathered in one place)."""
from __future__ import annotations

from apache_beam.portability import common_urns, python_urns
from apache_beam.runners.worker import bundle_processor

IMPULSE = common_urns.primitives.IMPULSE.urn
PAR_DO = common_urns.primitives.PAR_DO.urn
GROUP_BY_KEY = common_urns.primitives.GROUP_BY_KEY.urn
FLATTEN = common_urns.primitives.FLATTEN.urn
ASSIGN_WINDOWS = common_urns.primitives.ASSIGN_WINDOWS.urn
TEST_STREAM = common_urns.primitives.TEST_STREAM.urn
READ = common_urns.deprecated_primitives.READ.urn
DATA_INPUT = bundle_processor.DATA_INPUT_URN
DATA_OUTPUT = bundle_processor.DATA_OUTPUT_URN

SIDE_ITERABLE = common_urns.side_inputs.ITERABLE.urn
SIDE_MULTIMAP = common_urns.side_inputs.MULTIMAP.urn

# A WriteToSpark composite (`io/spark.py`): sparkbeam writes its input with Spark itself.
WRITE_TO_SPARK = "sparkbeam:transform:write_to_spark:v1"
# Spark's file data sources, named here because three layers ask of a format whether it is
# one: a stream of one reads with the schema the pipeline was built with (`io/spark.py`), a
# streaming write to one is exactly once (`plan/native_spark.py`), a byte budget limits one
# (`streaming/spark_streams.py`).
SPARK_FILE_FORMATS = frozenset(("parquet", "json", "csv", "orc", "text", "avro", "xml"))
# An exactly-once WriteToKafka composite (`io/kafka_write.py`): in streaming, sparkbeam stages
# its input per micro-batch and writes each committed batch in Kafka transactions.
WRITE_TO_KAFKA = "sparkbeam:transform:write_to_kafka:v1"
# A WindowInto(GlobalWindows) in a stage run by the embedded SDK worker: sparkbeam's own
# operation re-windows each element (`plan/global_window.py`, `control/window_into.py`).
INTO_GLOBAL_WINDOW = "sparkbeam:transform:into_global_window:v1"
SPLITTABLE_PROCESS = common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn

# Requirements a pipeline may declare and that we honour.
SUPPORTED_REQUIREMENTS = frozenset(
    [
        common_urns.requirements.REQUIRES_STATEFUL_PROCESSING.urn,
        common_urns.requirements.REQUIRES_BUNDLE_FINALIZATION.urn,
        common_urns.requirements.REQUIRES_SPLITTABLE_DOFN.urn,
        common_urns.requirements.REQUIRES_STABLE_INPUT.urn,
        common_urns.requirements.REQUIRES_TIME_SORTED_INPUT.urn,
    ]
)

PYTHON_ENVIRONMENT_URNS = frozenset(
    [
        python_urns.EMBEDDED_PYTHON,
        common_urns.environments.DOCKER.urn,
        common_urns.environments.PROCESS.urn,
        common_urns.environments.EXTERNAL.urn,
        python_urns.EMBEDDED_PYTHON_GRPC,
        python_urns.SUBPROCESS_SDK,
        "beam:env:default:v1",
        "beam:env:anyof:v1",
        "",
    ]
)
