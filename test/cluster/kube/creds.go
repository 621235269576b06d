package kube

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// UserConfig returns a client config that authenticates as user in groups
// with a certificate signed by the cluster CA. It has exactly the rights RBAC
// grants that user and those groups (plus system:authenticated).
func (c *Cluster) UserConfig(user string, groups ...string) (*rest.Config, error) {
	kp, err := c.CA.ClientCert(user, groups...)
	if err != nil {
		return nil, fmt.Errorf("minting client certificate for %q: %w", user, err)
	}
	return c.certConfig(kp), nil
}

// ServiceAccountConfig returns a client config that authenticates as the
// ServiceAccount namespace/name with a bound token from the TokenRequest API,
// valid for ttl (the apiserver enforces at least 10 minutes). The
// ServiceAccount must exist.
func (c *Cluster) ServiceAccountConfig(ctx context.Context, namespace, name string, ttl time.Duration) (*rest.Config, error) {
	secs := int64(ttl / time.Second)
	tr, err := c.Admin.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("requesting a token for serviceaccount %s/%s: %w", namespace, name, err)
	}
	return &rest.Config{
		Host:            c.Host(),
		BearerToken:     tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CA.CertPEM},
	}, nil
}

// WriteKubeconfig writes cfg as a self-contained kubeconfig file (all
// certificates and tokens inline), for a component or draind to read with
// --kubeconfig. Only certificate and bearer-token credentials are supported.
func WriteKubeconfig(path string, cfg *rest.Config) error {
	if len(cfg.CAData) == 0 {
		return fmt.Errorf("writing kubeconfig %s: config has no inline CA", path)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["bed"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["bed"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData,
		ClientKeyData:         cfg.KeyData,
		Token:                 cfg.BearerToken,
	}
	kc.Contexts["bed"] = &clientcmdapi.Context{Cluster: "bed", AuthInfo: "bed"}
	kc.CurrentContext = "bed"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}
