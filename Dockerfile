# syntax=docker/dockerfile:1
#
# draind image: one static binary on a distroless base.
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=v0.2.0 --build-arg COMMIT=$(git rev-parse HEAD) \
#     --build-arg DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ) -t ghcr.io/draind/draind:v0.2.0 .
#
# VERSION defaults to the release (deploy/release.Version, the tag the
# kustomize base deploys); the -X flags are release.LDFlags' (one stamping
# for every builder). test/cluster/deploycheck (TestStaticBuild) runs this
# file's `go build` line and checks that the result is a static ELF carrying
# the version; deploy/release's tests keep VERSION, the flags and the
# digest pins in order.
#
# Base images are pinned by digest (a tag moves; a node must get the image
# that was tested). Where the digests come from:
# - golang:1.26: the multi-arch index digest Renovate moved golang:1.26 to on
#   2026-09-18 (vtmocanu/uzi pull request 1435), the same pin in Dockerfiles of
#   several other public repositories; not checked against the registry from
#   here (no registry access).
# - gcr.io/distroless/static-debian12 (:latest, the root variant): the digest
#   `crane digest gcr.io/distroless/static-debian12:latest` printed on
#   2026-09-16 (cybozu/neco-containers pull request 2113); not checked against
#   the registry from here.
# Update both with `crane digest <image:tag>` (or Renovate) when rebuilding.

FROM --platform=$BUILDPLATFORM golang:1.26@sha256:3c3e25a4da13fd0478eed2df1eb35a0e667094a7124d3993a6a1d30f71c17e79 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=v0.2.0
ARG COMMIT=unknown
ARG DATE=unknown
# No cgo: no libc to match on the node, and the BPF objects are embedded
# (bpf2go output is committed, so no clang here either). -buildvcs=false:
# .git is not in the build context; version, commit and date come from the
# build arguments.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT} -X main.date=${DATE}" -o /out/draind ./cmd/draind

# The root variant of distroless static (not :nonroot): draind runs as uid 0
# (the DaemonSet sets runAsUser: 0 with only CAP_BPF and CAP_NET_ADMIN),
# because the bpffs pin directory and the status socket are root-only.
# `draind status` through kubectl exec must run as the same user.
FROM gcr.io/distroless/static-debian12:latest@sha256:d75cdd72874d4790092fcb1b058493ecf6bb5bf2b2b897045b00ff01d91843f2
COPY --from=build /out/draind /usr/local/bin/draind
# On PATH, so `kubectl -n draind-system exec ds/draind -- draind status` works.
ENTRYPOINT ["/usr/local/bin/draind"]
