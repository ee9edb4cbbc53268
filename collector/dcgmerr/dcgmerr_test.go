//go:build cgo

package dcgmerr

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-dcgm/pkg/dcgm"
)

// FuzzClassify: Classify reads the text of errors from a library it does not control;
// on any text it must not panic, must give a kind and a name together, and must read a
// text holding the connection message as a lost connection whatever surrounds it.
// (collector/dcgm's TestClassify checks every code and text against DCGM's own.)
func FuzzClassify(f *testing.F) {
	for _, c := range dcgmErrorClasses {
		f.Add(c.text, "", "")
		f.Add(c.text, "error watching fields: ", " (extra)")
	}
	// Texts of codes the source does not treat apart (dcgm_errors.c errorString).
	for _, text := range []string{"Bad parameter passed to function", "Generic unspecified error", "No data is available", "Insufficient permission"} {
		f.Add(text, "error retrieving DCGM MIG hierarchy: ", "")
	}
	f.Add("", "", "")
	f.Add("GPU is lost", "Profiling is not supported for this group of GPUs or ", "")
	var connection string
	for _, c := range dcgmErrorClasses {
		if c.code == dcgm.DCGM_ST_CONNECTION_NOT_VALID {
			connection = c.text
		}
	}
	f.Fuzz(func(t *testing.T, text, prefix, suffix string) {
		kind, name := Classify(0, false, prefix+text+suffix)
		if (kind == nil) != (name == "") {
			t.Fatalf("got kind %v with name %q: want both or neither", kind, name)
		}
		if kind != nil && !strings.HasPrefix(name, "DCGM_ST_") {
			t.Fatalf("got name %q, want a DCGM_ST_ name", name)
		}
		if strings.Contains(prefix+text+suffix, connection) && kind != ErrConnection {
			t.Fatalf("text %q: got %v, want a lost connection", prefix+text+suffix, kind)
		}
	})
}
