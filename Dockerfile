# Multi-stage image: build a wheel, install it into a slim runtime as a non-root user.
#   docker build -t bk-auditor .
#   docker run -e BK_AUDITOR_DAEMON_ZK=zk1:2181 -p 9876:9876 -p 9877:9877 bk-auditor
# Pin the base images by digest in your own builds (FROM python:3.11-slim@sha256:...).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY auditor ./auditor
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PROMETHEUS_DISABLE_CREATED_SERIES=true \
    BK_AUDITOR_LOGGING_FORMAT=json
RUN useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin auditor
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# The documented example config: set ZooKeeper by environment (BK_AUDITOR_DAEMON_ZK) or
# mount your own file over it.
COPY deploy/auditor.toml /etc/bk-auditor/auditor.toml
USER 10001
# gRPC API (and grpc.health.v1), Prometheus metrics.
EXPOSE 9876 9877
# grpc.health.v1 "auditor-liveness": SERVING while the event loop turns. The port follows
# BK_AUDITOR_API_PORT. With TLS on the API, override it (docker run --health-cmd ...) to
# add --tls/--tls-ca (and --tls-cert/--tls-key for mTLS).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD bk-auditor health --target "127.0.0.1:${BK_AUDITOR_API_PORT:-9876}" \
        --service auditor-liveness --timeout 3 || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["bk-auditor"]
CMD ["run", "--config", "/etc/bk-auditor/auditor.toml"]
