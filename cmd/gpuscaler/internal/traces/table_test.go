package traces

import (
	"io"
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

// badInputs maps a case's name to a trace and the parts its reader's error must name.
type badInputs map[string]struct {
	in   string
	want []string
}

// wantReadErrors reads each bad input and wants an error naming its parts, and no records.
func wantReadErrors[T any](t *testing.T, read func(io.Reader) ([]T, error), cases badInputs) {
	t.Helper()
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			recs, err := read(strings.NewReader(tc.in))
			wantErrNaming(t, err, tc.want...)
			if recs != nil {
				t.Errorf("got %d records with the error, want none", len(recs))
			}
		})
	}
}

// fuzzRead fuzzes a trace reader: any input gives records or an error that names the
// format, never both, and the records pass check.
func fuzzRead[T any](f *testing.F, format string, read func(io.Reader) ([]T, error), check func(*testing.T, []T)) {
	f.Fuzz(func(t *testing.T, in string) {
		recs, err := read(strings.NewReader(in))
		if err != nil {
			if recs != nil || !strings.HasPrefix(err.Error(), format+": ") {
				t.Fatalf("got %d records and error %q, want none and an error naming the format", len(recs), err)
			}
			return
		}
		check(t, recs)
	})
}
