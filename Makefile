# `make run` and `make test` work on a fresh machine: they create .venv and install
# everything they need (Python packages from PyPI, Debian packages with apt-get).

VENV      := .venv
PYTHON    := $(VENV)/bin/python
# Everything (the broker, the client, Spark and the test tools), and what `make run` needs.
INSTALLED := $(VENV)/.installed
BROKER_INSTALLED := $(VENV)/.installed-broker
# The record scanner is a C extension (setup.py): the editable install compiles it in place
# (gcc and the Python headers), again whenever its source changes.
BUILD_INPUTS := pyproject.toml setup.py src/strom/records/_scanner.c
APT_PACKAGES := kcat e2fsprogs zookeeper chromium  # e2fsprogs: mkfs.ext4 for the full-disk test; zookeeper: cluster tests; chromium: the console's browser tests

.PHONY: run cluster test lint bench demo system-deps clean

$(PYTHON):
	python3 -m venv $(VENV)

$(BROKER_INSTALLED): $(BUILD_INPUTS) | $(PYTHON)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e .
	touch $@

$(INSTALLED): $(BUILD_INPUTS) | $(PYTHON)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[test,spark]'
	touch $@ $(BROKER_INSTALLED)

run: $(BROKER_INSTALLED)
	$(VENV)/bin/strom serve config/server.properties

# A local cluster: ZooKeeper and three brokers on 127.0.0.11-13:9092, data in ./cluster-data; Ctrl-C stops it.
cluster: $(BROKER_INSTALLED) system-deps
	$(VENV)/bin/strom cluster up --brokers 3

# The web-log demo: broker, log generator, Spark pipeline and a live chart on http://127.0.0.1:8000/
demo: $(INSTALLED)
	$(PYTHON) examples/weblog/run_demo.py

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

lint: $(INSTALLED)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/mypy

test: $(INSTALLED) system-deps lint
	bash tests/conformance/build_librdkafka.sh
	$(VENV)/bin/pytest -q -ra --durations=25  # the slowest tests, to keep CI fast

bench: $(INSTALLED)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[test,spark,bench]'  # py-spy profiles the clients
	bash bench/setup.sh
	$(PYTHON) bench/broker_bench.py --write-results
	$(PYTHON) bench/cluster_bench.py --write-results
	$(PYTHON) bench/idle_connections.py --write-results
	$(PYTHON) bench/loop_lag.py --write-results
	$(PYTHON) bench/cleaner_bench.py --write-results
	$(PYTHON) bench/client_bench.py --write-results
	$(PYTHON) bench/spark_bench.py --write-results

clean:
	rm -rf $(VENV) .cache data strom-checkpoints cluster-data build src/strom/records/*.so
