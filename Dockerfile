# gpuscaler: one image for the scaler and (later) the node collector.
# Built with the same flags as 'make build'. cgo stays on: the collector's DCGM source
# (go-dcgm) loads libdcgm at run time from the host or the NVIDIA driver image, so the
# runtime image needs glibc but no NVIDIA library of its own.
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t gpuscaler .

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=1 make build VERSION=${VERSION} COMMIT=${COMMIT}

# distroless base: glibc and CA certificates, no shell; runs as uid 65532.
FROM gcr.io/distroless/base-debian12:nonroot
COPY --from=build /src/bin/gpuscaler /usr/local/bin/gpuscaler
USER 65532:65532
EXPOSE 9090 8080 4222
ENTRYPOINT ["/usr/local/bin/gpuscaler"]
CMD ["scaler"]
