package manifests

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// cert-manager.io/v1 kinds the chart renders (scaler.tls.certManager), for strict
// decoding. cert-manager's own Go module is not a dependency: it would raise the
// Kubernetes libraries KEDA v2.21.0 builds with. These types hold the subset of
// cert-manager's API the chart uses, with the field names and JSON tags of
// pkg/apis/certmanager/v1/types_certificate.go and types_issuer.go in
// github.com/cert-manager/cert-manager; a field the chart writes that is not here fails
// decoding, so a new one must be checked against those files and added.
var certManagerV1 = schema.GroupVersion{Group: "cert-manager.io", Version: "v1"}

// Certificate is cert-manager's Certificate: a key pair and certificate kept in a Secret.
type Certificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              CertificateSpec `json:"spec"`
}

// CertificateSpec is the subset of cert-manager's CertificateSpec the chart uses.
type CertificateSpec struct {
	CommonName  string                 `json:"commonName,omitempty"`
	Duration    *metav1.Duration       `json:"duration,omitempty"`
	RenewBefore *metav1.Duration       `json:"renewBefore,omitempty"`
	DNSNames    []string               `json:"dnsNames,omitempty"`
	SecretName  string                 `json:"secretName"`
	IssuerRef   IssuerReference        `json:"issuerRef"`
	IsCA        bool                   `json:"isCA,omitempty"`
	Usages      []string               `json:"usages,omitempty"`
	PrivateKey  *CertificatePrivateKey `json:"privateKey,omitempty"`
}

// IssuerReference is cert-manager's ObjectReference (pkg/apis/meta/v1).
type IssuerReference struct {
	Name  string `json:"name"`
	Kind  string `json:"kind,omitempty"`
	Group string `json:"group,omitempty"`
}

// CertificatePrivateKey is cert-manager's CertificatePrivateKey.
type CertificatePrivateKey struct {
	RotationPolicy string `json:"rotationPolicy,omitempty"`
	Encoding       string `json:"encoding,omitempty"`
	Algorithm      string `json:"algorithm,omitempty"`
	Size           int    `json:"size,omitempty"`
}

// Issuer is cert-manager's Issuer; ClusterIssuer has the same spec.
type Issuer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              IssuerSpec `json:"spec"`
}

// ClusterIssuer is cert-manager's cluster-scoped Issuer.
type ClusterIssuer Issuer

// IssuerSpec is the subset of cert-manager's IssuerConfig the chart uses.
type IssuerSpec struct {
	SelfSigned *struct{}       `json:"selfSigned,omitempty"`
	CA         *CAIssuerConfig `json:"ca,omitempty"`
}

// CAIssuerConfig is cert-manager's CAIssuer: the Secret holding the CA's key pair.
type CAIssuerConfig struct {
	SecretName string `json:"secretName"`
}

func (c *Certificate) DeepCopyObject() runtime.Object   { return deepCopy(c, &Certificate{}) }
func (i *Issuer) DeepCopyObject() runtime.Object        { return deepCopy(i, &Issuer{}) }
func (i *ClusterIssuer) DeepCopyObject() runtime.Object { return deepCopy(i, &ClusterIssuer{}) }

// deepCopy copies in into out through JSON: these types are small and only decoded.
func deepCopy[T runtime.Object](in, out T) runtime.Object {
	b, err := json.Marshal(in)
	if err != nil {
		panic(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		panic(err)
	}
	return out
}

func addCertManagerToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(certManagerV1, &Certificate{}, &Issuer{}, &ClusterIssuer{})
	metav1.AddToGroupVersion(s, certManagerV1)
	return nil
}
