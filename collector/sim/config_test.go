package sim

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// The users' documentation of the sim source's configuration, and its example.
const (
	configExample = "../../examples/simulated-node/sim-config.yaml"
	configDoc     = "../../examples/simulated-node/README.md"
)

// jsonKeys are the configuration keys of a struct's fields, as LoadConfig reads them.
func jsonKeys(t *testing.T, v any) []string {
	t.Helper()
	var keys []string
	typ := reflect.TypeOf(v)
	for i := range typ.NumField() {
		if !typ.Field(i).IsExported() {
			continue // the parser never sets it
		}
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if name == "" || name == "-" {
			t.Fatalf("%s.%s has no json key", typ.Name(), typ.Field(i).Name)
		}
		keys = append(keys, name)
	}
	return keys
}

// TestConfigExampleIsDocumented loads the example through the collector's own parser
// and builds a node from it, and checks every key the parser reads is in the example and
// in the table of examples/simulated-node/README.md: a key added to Config or Pod
// must be documented for users, who had only a Go comment before.
func TestConfigExampleIsDocumented(t *testing.T) {
	cfg, err := LoadConfig(configExample)
	if err != nil {
		t.Fatalf("load %s: %v", configExample, err)
	}
	sim, err := New("gpu-node-1", cfg)
	if err != nil {
		t.Fatalf("%s: %v", configExample, err)
	}
	samples, err := sim.Collect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// GPUs 0 to 6 whole, GPU 7 in three MIG slices.
	if got, want := len(samples), 7+3; got != want {
		t.Errorf("samples of the example node: got %d, want %d", got, want)
	}
	alloc, err := sim.Allocation(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// Each of the 7 whole GPUs offered twice (replicas: 2), and the 3 slices once.
	if got, want := len(alloc.Allocatable), 7*2+3; got != want {
		t.Errorf("allocatable devices of the example node: got %d, want %d", got, want)
	}

	example, err := os.ReadFile(configExample)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(configDoc)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range append(jsonKeys(t, Config{}), jsonKeys(t, Pod{})...) {
		if !strings.Contains(string(example), key+":") {
			t.Errorf("%s does not show key %q", configExample, key)
		}
		if !strings.Contains(string(doc), "`"+key+"`") {
			t.Errorf("%s does not document key %q", configDoc, key)
		}
	}
}
