# syntax=docker/dockerfile:1
# gpuscaler's two images, with a Docker engine (`make image` builds the same two without
# one: deploy/image):
#
#   scaler     the static binary (CGO_ENABLED=0): the scaler, the NATS auth callout and
#              the CLI need no C library.
#   collector  the cgo binary: the collector's DCGM source (go-dcgm) loads libdcgm at run
#              time, and NVML comes from the NVIDIA container toolkit, so the image needs
#              glibc but carries no NVIDIA library of its own.
#
#   args="--build-arg VERSION=$(git describe --tags --match 'v[0-9]*' --always --dirty) --build-arg COMMIT=$(git rev-parse --short HEAD)"
#   docker build $args --target scaler -t gpuscaler:TAG .
#   docker build $args --target collector -t gpuscaler-collector:TAG .
#
# The binaries are built by `make build-static` and `make build`, so the images and a
# local build use the same flags (-trimpath, the version stamped with -X).

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
# test/testkit is a module of the main module's tests, required through a replace.
COPY test/testkit/go.mod test/testkit/
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    make build-static VERSION="${VERSION}" COMMIT="${COMMIT}" \
    && CGO_ENABLED=1 make build VERSION="${VERSION}" COMMIT="${COMMIT}" \
    && ./bin/gpuscaler-static version && ./bin/gpuscaler version

# Distroless static: CA certificates, /etc/passwd and /tmp, no C library, no shell.
FROM gcr.io/distroless/static-debian12:nonroot AS scaler
ARG VERSION=dev
ARG COMMIT=unknown
LABEL org.opencontainers.image.title="gpuscaler" \
      org.opencontainers.image.description="KEDA external scaler for GPU workloads: the scaler, the NATS auth callout and the CLI (static, no cgo)" \
      org.opencontainers.image.source="https://github.com/gpuscaler/gpuscaler" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}"
COPY --from=build /src/bin/gpuscaler-static /usr/local/bin/gpuscaler
USER 65532:65532
# 9090 gRPC for KEDA, 8080 HTTP.
EXPOSE 9090 8080
ENTRYPOINT ["/usr/local/bin/gpuscaler"]
CMD ["scaler"]

# Distroless base: glibc (Debian 12, as the build stage) and CA certificates, no shell.
FROM gcr.io/distroless/base-debian12:nonroot AS collector
ARG VERSION=dev
ARG COMMIT=unknown
LABEL org.opencontainers.image.title="gpuscaler-collector" \
      org.opencontainers.image.description="gpuscaler's GPU node collector (cgo: DCGM and NVML load the NVIDIA libraries at run time)" \
      org.opencontainers.image.source="https://github.com/gpuscaler/gpuscaler" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}"
COPY --from=build /src/bin/gpuscaler /usr/local/bin/gpuscaler
# The image's user; the collector's pod runs as root for the kubelet's socket.
USER 65532:65532
# 8081 collector HTTP.
EXPOSE 8081
ENTRYPOINT ["/usr/local/bin/gpuscaler"]
CMD ["collector"]
