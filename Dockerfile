# Multi-stage image: build the wheel, install it with constraints.txt into a slim runtime,
# run it as a non-root user. From the repository root:
#
#   docker build -t bk-auditor:0.1.0 .
#   docker run -e BK_AUDITOR_DAEMON_ZK=zk1:2181 -p 9876:9876 -p 9877:9877 bk-auditor:0.1.0
#
# The tag is the project's version (pyproject.toml; deploy/k8s runs bk-auditor:0.1.0). A
# build whose VERSION differs from pyproject.toml's fails (tests/unit/test_version.py too).
#
# The base image is pinned to an exact Python release and Debian release. For builds that
# must be reproducible to the byte, pin its digest as well, resolved where you build:
#   docker buildx imagetools inspect python:3.11.14-slim-bookworm   (the "Digest:" line)
#   docker build --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest> ...
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md MANIFEST.in constraints.txt ./
COPY build_support ./build_support
COPY proto ./proto
COPY auditor ./auditor
# The wheel `make dist` builds (setuptools in an isolated build environment, through
# build_support/backend.py); this slim image has no C compiler, so it is the pure one.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="bk-auditor" \
      org.opencontainers.image.description="An auditor for Apache BookKeeper clusters" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PROMETHEUS_DISABLE_CREATED_SERIES=true \
    BK_AUDITOR_LOGGING_FORMAT=json
RUN groupadd --system --gid 10001 auditor \
    && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent \
        --shell /usr/sbin/nologin auditor
COPY --from=build /wheels /wheels
COPY constraints.txt /tmp/constraints.txt
# The wheel with its dependencies pinned by constraints.txt; then the installed version must
# be VERSION, and the detector self-test (no cluster needed) must pass.
RUN pip install --no-cache-dir -c /tmp/constraints.txt "/wheels/bookkeeper_auditor-${VERSION}-py3-none-any.whl" \
    && rm -rf /wheels /tmp/constraints.txt \
    && test "$(bk-auditor --version)" = "bk-auditor ${VERSION}" \
    && bk-auditor selftest >/dev/null
# The documented example config: set ZooKeeper by environment (BK_AUDITOR_DAEMON_ZK) or
# mount your own file over it.
COPY deploy/auditor.toml /etc/bk-auditor/auditor.toml
USER 10001:10001
# gRPC API (and grpc.health.v1), Prometheus metrics.
EXPOSE 9876 9877
# grpc.health.v1 "auditor-liveness": SERVING while the event loop turns. The port follows
# BK_AUDITOR_API_PORT. With TLS on the API, override it (docker run --health-cmd ...) to
# add --tls/--tls-ca (and --tls-cert/--tls-key for mTLS). The shell form expands the port.
# hadolint ignore=DL3025
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD bk-auditor health --target "127.0.0.1:${BK_AUDITOR_API_PORT:-9876}" \
        --service auditor-liveness --timeout 3 || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["bk-auditor"]
CMD ["run", "--config", "/etc/bk-auditor/auditor.toml"]
