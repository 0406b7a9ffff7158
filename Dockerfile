# Multi-stage image: build a wheel, install it into a slim runtime as a non-root user.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY auditor ./auditor
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin auditor
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001
ENTRYPOINT ["bk-auditor"]
CMD ["--help"]
