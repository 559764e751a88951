# syntax=docker/dockerfile:1
# A Riverbed broker: `riverbed broker`, configured by RIVERBED_* environment variables
# (docs/deploy.md). No Java: only ZooKeeper and Spark need it, and both run elsewhere (the
# `spark` target below adds it for the Spark job runner).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Wheels of Riverbed and of every dependency: the compilers (the record codec is Cython;
# riverbed_spark's column pruning jar is Java) and the network are needed here only.
FROM ${PYTHON_IMAGE} AS builder
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev openjdk-17-jdk-headless \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY platform platform
COPY spark spark
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/riverbed --create-home riverbed
# --no-index: only the builder's wheels, so the image has exactly what was built and tested.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels riverbed
ENV PYTHONUNBUFFERED=1

# The Spark job runner (compose profile `spark`): Spark's JVM needs Java 17.
FROM runtime AS spark
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
# The job's output directory, owned by the user so a volume mounted there is writable.
RUN mkdir /var/lib/riverbed/out && chown riverbed:riverbed /var/lib/riverbed/out
USER riverbed
WORKDIR /var/lib/riverbed
ENTRYPOINT ["python", "-m", "riverbed_spark.jobs.key_counts"]

# The broker (the default target: the last one).
FROM runtime AS broker
# The broker's default listener is 127.0.0.1, which nothing outside the container can reach.
ENV RIVERBED_LISTENERS=PLAINTEXT://0.0.0.0:9092 \
    RIVERBED_LOG_DIRS=/var/lib/riverbed/data
RUN mkdir /var/lib/riverbed/data && chown riverbed:riverbed /var/lib/riverbed/data
VOLUME /var/lib/riverbed/data
USER riverbed
WORKDIR /var/lib/riverbed
# 9092: the Kafka listener; 9308: Prometheus metrics (`metrics.port`, not served yet).
EXPOSE 9092 9308
# The broker binds its listener only once it has registered in ZooKeeper and loaded its logs,
# so a TCP connect to the first listener (from RIVERBED_LISTENERS) means it is serving.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD python -c "import os, socket; listener = os.environ['RIVERBED_LISTENERS'].split(',')[0]; host, port = listener.split('://')[1].rsplit(':', 1); socket.create_connection((host if host not in ('', '0.0.0.0') else '127.0.0.1', int(port)), timeout=3).close()"
ENTRYPOINT ["riverbed", "broker"]
