"""The daemon's gRPC admin API (`bookkeeper.auditor.v1.AuditorService`) and its client.

`auditor.api.server.start_api_server` serves it; `auditor.api.client.ApiClient`
is what the CLI dials it with. The names below are shared by both ends.
"""

#: Health-service names for Kubernetes' `grpc:` probes (`service:` field).
LIVENESS = "auditor-liveness"
READINESS = "auditor-readiness"

#: The metadata key and scheme a client sends the API token with.
AUTH_METADATA_KEY = "authorization"
AUTH_SCHEME = "bearer"

#: The environment variables the CLI reads when --token / --target are not given.
TOKEN_ENV = "BK_AUDITOR_API_TOKEN"
TARGET_ENV = "BK_AUDITOR_API_TARGET"
