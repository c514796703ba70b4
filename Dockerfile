# Multi-stage build: a static binary on distroless, running as non-root.
# The configuration file is expected at /etc/coder-k8s/config.yaml (the Helm
# chart mounts it there from a ConfigMap).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/
ARG VERSION=v0.0.0-dev
ARG COMMIT=unknown
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/coder/coder-k8s/internal/version.version=${VERSION} -X github.com/coder/coder-k8s/internal/version.commit=${COMMIT}" \
      -o /out/coder-k8s ./cmd/coder-k8s

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/coder-k8s /coder-k8s
USER 65532:65532
EXPOSE 6443 8080 8081 8090
ENTRYPOINT ["/coder-k8s"]
CMD ["--config", "/etc/coder-k8s/config.yaml"]
