//go:build tools

// Package tools pins the Kubernetes components the cluster bed builds and
// what package e2ebin builds for the upstream e2e suite (its test servers
// and the ginkgo runner that runs the suite in parallel), so that
// go.mod and go.sum carry everything `go build` of them needs.
//
// Words are defined in the repository's docs/glossary.md.
package tools

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/images/agnhost"
	_ "k8s.io/kubernetes/test/images/regression-issue-74839"
)
