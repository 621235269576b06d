# syntax=docker/dockerfile:1
#
# draind image: one static binary on a distroless base.
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=$(git describe --tags --always) -t ghcr.io/draind/draind:dev .
#
# test/cluster/deploycheck (TestStaticBuild) runs this file's `go build` line
# and checks that the result is a static ELF carrying the version.

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
# No cgo: no libc to match on the node, and the BPF objects are embedded
# (bpf2go output is committed, so no clang here either). -buildvcs=false:
# .git is not in the build context; the version comes from VERSION.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=${VERSION}" -o /out/draind ./cmd/draind

# The root variant of distroless static (not :nonroot): draind runs as uid 0
# (the DaemonSet sets runAsUser: 0 with only CAP_BPF and CAP_NET_ADMIN),
# because the bpffs pin directory and the status socket are root-only.
# `draind status` through kubectl exec must run as the same user.
FROM gcr.io/distroless/static-debian12:latest
COPY --from=build /out/draind /usr/local/bin/draind
# On PATH, so `kubectl -n draind-system exec ds/draind -- draind status` works.
ENTRYPOINT ["/usr/local/bin/draind"]
