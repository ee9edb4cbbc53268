# syntax=docker/dockerfile:1
# gpuscaler: one image for the scaler and the node collector (gpuscaler scaler|collector).
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg COMMIT=$(git rev-parse --short HEAD) -t gpuscaler .
#
# The binary is built by `make build`, so the image and a local build use the same flags
# (-trimpath, the version stamped with -X). cgo stays on: the collector's DCGM source
# (go-dcgm) loads libdcgm at run time, and NVML comes from the NVIDIA container toolkit,
# so the runtime image needs glibc but carries no NVIDIA library of its own.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=1 make build VERSION="${VERSION}" COMMIT="${COMMIT}" \
    && ./bin/gpuscaler version

# Distroless base: glibc (Debian 12, as the build stage) and CA certificates, no shell.
FROM gcr.io/distroless/base-debian12:nonroot
ARG VERSION=dev
ARG COMMIT=unknown
LABEL org.opencontainers.image.title="gpuscaler" \
      org.opencontainers.image.description="KEDA external scaler for GPU workloads" \
      org.opencontainers.image.source="https://github.com/gpuscaler/gpuscaler" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}"
COPY --from=build /src/bin/gpuscaler /usr/local/bin/gpuscaler
# The scaler runs as this user; the collector's pod runs as root for the kubelet's socket.
USER 65532:65532
# 9090 gRPC for KEDA, 8080 scaler HTTP, 8081 collector HTTP.
EXPOSE 9090 8080 8081
ENTRYPOINT ["/usr/local/bin/gpuscaler"]
CMD ["scaler"]
