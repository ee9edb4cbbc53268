package traces

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sharedTraces is shared/testdata/traces seen from this package's directory.
const sharedTraces = "../../../../../shared/testdata/traces"

// readTrace returns a file of shared/testdata/traces. A missing file fails the test: the
// facts checked against it are the point.
func readTrace(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(sharedTraces, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// wantErrNaming fails unless err is an error whose text holds every one of parts.
func wantErrNaming(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one naming %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("got error %q, want it to name %q", err, p)
		}
	}
}
