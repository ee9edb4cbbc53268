package scaler

import (
	"os"
	"strings"
	"testing"

	"github.com/gpuscaler/gpuscaler/scaler/metadata"
)

// TestReadmeDocumentsEveryKey keeps the README's trigger-metadata table and metric table
// in step with the code.
func TestReadmeDocumentsEveryKey(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	for _, k := range metadata.Keys() {
		if !strings.Contains(readme, "`"+k+"`") {
			t.Errorf("README.md does not document trigger key %q", k)
		}
	}
	for _, m := range []string{MetricQueueBacklog, MetricGPUUtil, MetricGPUMemory} {
		if !strings.Contains(readme, "`"+m+"`") {
			t.Errorf("README.md does not document metric %q", m)
		}
	}
}
