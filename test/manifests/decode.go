// Package manifests checks what gpuscaler's Helm charts render (with deploy/render, the
// renderer deploy/render.sh runs) and what the repository ships beside them: it decodes
// every rendered object strictly into its Kubernetes type, the examples into KEDA's,
// checks the committed renderings against fresh ones, and the chart against the
// gpuscaler binary's flags, Dockerfile and images. README.md says what each test
// checks and how to run them.
//
// It is a module of its own so that KEDA's dependencies stay out of the main module; it
// reads the main module's files and runs its binary, and never imports it.
package manifests

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
)

// Scheme knows every kind the chart and the examples may hold: Kubernetes' built-in
// types (k8s.io/api as KEDA v2.21.0 builds on it), KEDA's keda.sh/v1alpha1, the
// Prometheus Operator's monitoring.coreos.com/v1 and cert-manager's cert-manager.io/v1
// (certmanager.go).
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	utilruntime.Must(kedav1alpha1.AddToScheme(Scheme))
	utilruntime.Must(monitoringv1.AddToScheme(Scheme))
	utilruntime.Must(addCertManagerToScheme(Scheme))
}

// strict decodes YAML into typed objects and fails on any field the type lacks, on a
// field spelt in the wrong case, and on a key given twice.
var strict = json.NewSerializerWithOptions(json.DefaultMetaFactory, Scheme, Scheme,
	json.SerializerOptions{Yaml: true, Strict: true})

// Object is one document of a YAML stream, decoded.
type Object struct {
	// Source names where it came from: a file and the document's index in it, plus the
	// chart template for rendered output.
	Source string
	// Obj is the typed object: *appsv1.Deployment, *kedav1alpha1.ScaledObject, ...
	Obj runtime.Object
	GVK schema.GroupVersionKind
}

// DecodeAll splits a YAML stream into documents and decodes each strictly into its
// registered type. Empty documents are skipped. An unknown kind, a missing apiVersion
// or kind, and any unknown field are errors.
func DecodeAll(name string, data []byte) ([]Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []Object
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		if isEmpty(doc) {
			continue
		}
		src := fmt.Sprintf("%s#%d", name, i)
		if tpl := sourceComment(doc); tpl != "" {
			src += " (" + tpl + ")"
		}
		obj, gvk, err := strict.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", src, err)
		}
		out = append(out, Object{Source: src, Obj: obj, GVK: *gvk})
	}
}

// isEmpty says a document holds only comments and white space.
func isEmpty(doc []byte) bool {
	for line := range strings.SplitSeq(string(doc), "\n") {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			return false
		}
	}
	return true
}

// sourceComment returns the template named by Helm's "# Source:" line, if any.
func sourceComment(doc []byte) string {
	for line := range strings.SplitSeq(string(doc), "\n") {
		if s, ok := strings.CutPrefix(line, "# Source: "); ok {
			return s
		}
	}
	return ""
}
