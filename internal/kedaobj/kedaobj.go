// Package kedaobj reads the triggers of KEDA ScaledObjects and ScaledJobs from YAML or
// JSON, for commands that act on one as KEDA would: `gpuscaler explain --file`.
//
// It reads only what those commands need, under the field names KEDA's types give them
// (github.com/kedacore/keda/v2/apis/keda/v1alpha1: ObjectMeta, spec.triggers of
// ScaleTriggers). Decoding with KEDA's own Go types would pull controller-runtime, KEDA's
// webhooks and an expression engine into the binary: 16 MB more, measured on a
// client-go program, for four fields. test/manifests checks this reading against KEDA's
// types on every example the project ships.
package kedaobj

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Trigger is one trigger of a ScaledObject or ScaledJob.
type Trigger struct {
	Kind      string            `json:"kind"`
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	Index     int               `json:"trigger"` // its place in spec.triggers
	Type      string            `json:"type"`
	TrigName  string            `json:"triggerName,omitempty"`
	Metadata  map[string]string `json:"metadata"`
}

// object is what is read of one document.
type object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		Triggers []struct {
			Type     string            `json:"type"`
			Name     string            `json:"name"`
			Metadata map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

// External returns the external and external-push triggers (the ones an external scaler
// answers) of every keda.sh ScaledObject and ScaledJob in data, a YAML stream of one or
// more documents, or JSON. Documents of other kinds are skipped, so a file holding a
// Deployment beside its ScaledObject reads as the ScaledObject; namespace fills in
// objects without one ("default" when it is empty too). It fails when data holds no
// ScaledObject or ScaledJob, or one without an external trigger.
func External(data []byte, namespace string) ([]Trigger, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var (
		out    []Trigger
		others []string
	)
	for doc := 1; ; doc++ {
		var o object
		if err := dec.Decode(&o); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if o.Kind == "" && o.APIVersion == "" {
			continue // an empty document, or a comment
		}
		group, _, _ := strings.Cut(o.APIVersion, "/")
		if group != "keda.sh" || (o.Kind != "ScaledObject" && o.Kind != "ScaledJob") {
			others = append(others, o.Kind+" ("+o.APIVersion+")")
			continue
		}
		ns := o.Metadata.Namespace
		if ns == "" {
			ns = namespace
		}
		if ns == "" {
			ns = "default"
		}
		found := false
		for i, tr := range o.Spec.Triggers {
			if tr.Type != "external" && tr.Type != "external-push" {
				continue
			}
			found = true
			out = append(out, Trigger{
				Kind: o.Kind, Namespace: ns, Name: o.Metadata.Name, Index: i, Type: tr.Type, TrigName: tr.Name, Metadata: tr.Metadata,
			})
		}
		if !found {
			return nil, fmt.Errorf("document %d: %s %s/%s has no external or external-push trigger; an external scaler answers only those", doc, o.Kind, ns, o.Metadata.Name)
		}
	}
	if len(out) == 0 {
		found := "no document"
		if len(others) > 0 {
			found = strings.Join(others, ", ")
		}
		return nil, fmt.Errorf("no keda.sh/v1alpha1 ScaledObject or ScaledJob in it (found %s)", found)
	}
	return out, nil
}
