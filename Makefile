# sparkbeam: two commands set everything up on a fresh machine (Python 3.11 + Java 17).
#   make run    creates .venv, installs, runs the word-count example on embedded local[*] Spark
#   make test   installs and runs every test tier, Beam's conformance suite included

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Apache Kafka's jars for the tests' broker (tests/support/kafka.py), fetched once by Maven.
KAFKA_JARS  := build/kafka/jars
KAFKA_STAMP := build/kafka/.fetched
OUT    ?= out/wordcount

.PHONY: run kafka class-archive test test-slow test-fast test-unit test-integration test-conformance test-conformance-streaming lint typecheck bench bench-quick clean

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python 3.11) on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml setup.py sparkbeam_site.pth | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]" --config-settings editable_mode=compat
	@touch $(STAMP)

install: $(STAMP)

$(KAFKA_STAMP): tests/support/kafka-broker.pom.xml
	@command -v mvn >/dev/null 2>&1 || { echo "need mvn (Maven) on PATH for the tests' Kafka broker"; exit 1; }
	mvn -q -B -f tests/support/kafka-broker.pom.xml dependency:copy-dependencies \
		-DoutputDirectory=$(CURDIR)/$(KAFKA_JARS) -DincludeScope=runtime
	@touch $(KAFKA_STAMP)

kafka: $(KAFKA_STAMP)

# Spark's Kafka connector for bench/kafka.py's reference query (not needed by the tests).
SPARK_KAFKA_STAMP := build/spark-kafka/.fetched
$(SPARK_KAFKA_STAMP): bench/spark-kafka.pom.xml
	mvn -q -B -f bench/spark-kafka.pom.xml dependency:copy-dependencies \
		-DoutputDirectory=$(CURDIR)/build/spark-kafka/jars -DincludeScope=runtime
	@touch $(SPARK_KAFKA_STAMP)

# The JVM class archive the Spark drivers sparkbeam launches map (a ~2 s faster start:
# sparkbeam/execute/class_archive.py), made once a machine for its Java and Spark (~45 s) and
# kept in ~/.cache/sparkbeam; a no-op when made. `make run` uses one if made, never waits for it.
class-archive: $(STAMP)
	$(PY) -m sparkbeam.cli class-archive

run: $(STAMP)
	$(PY) examples/wordcount.py --output $(OUT)

# Two pytest workers, each with its own local[2] session, one test file at a time each (a
# module's Kafka broker and cluster start once): most of a test is steps that wait on each
# other, so two share the two cores (~28 % less time; bench/ANALYSIS.md). TEST_WORKERS=0 runs
# the tests in this one process.
TEST_WORKERS ?= 2
# The checks and what the tests need made first do not depend on each other: side by side
# (the class archive's ~50 s on a fresh machine covers ruff and mypy), each one's output kept
# together.
test: $(STAMP)
	$(MAKE) --no-print-directory -j4 --output-sync=target kafka class-archive lint typecheck
	$(PY) -m pytest -q -p no:cacheprovider $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) -m "not streaming_full and not slow" --durations=0 --durations-min=3 tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/unit tests/component

test-integration: $(STAMP) $(KAFKA_STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/integration

test-conformance: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not streaming_full" tests/conformance

# The kill -9 restart test, the portable suite's wall-clock timer tests and the job server's
# full load tests (20 concurrent first jobs x3, 100 sequential jobs' memory), partitions added to a
# Kafka topic while a read runs, a Kafka broker restarted under a read, the lost-executor
# cluster run, and a killed SDK worker's retried task (~19 min).
test-slow: $(STAMP) $(KAFKA_STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow tests

# Beam's trigger transcripts, userstate and TestStream side-input tests on --streaming (~25 min on 2 cores).
test-conformance-streaming: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m streaming_full tests/conformance

lint: $(STAMP)
	$(VENV)/bin/ruff check sparkbeam sparkbeam_site.py setup.py tests

typecheck: $(STAMP)
	$(VENV)/bin/mypy sparkbeam sparkbeam_site.py

bench: $(STAMP) $(KAFKA_STAMP) $(SPARK_KAFKA_STAMP) class-archive
	bash bench/install.sh $(PY)
	$(PY) -m bench.splits
	$(PY) -m bench.modes
	$(PY) -m bench.streaming
	$(PY) -m bench.spark_io
	$(PY) -m bench.kafka
	$(PY) -m bench.run --scale full

bench-quick: $(STAMP) class-archive
	bash bench/install.sh $(PY)
	$(PY) -m bench.run --scale quick

clean:
	rm -rf $(VENV) out build *.egg-info
