package natsconn

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTokenFileMistakes: a token file that cannot serve fails at Connect, naming it,
// rather than as an authorization error from the server. (The rotation itself is tested
// against the real auth callout: authcallout's TestTokenRotationLosesNothing.)
func TestTokenFileMistakes(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "token")
	if err := os.WriteFile(good, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		opts Options
		says string
	}{
		"missing":        {Options{TokenFile: filepath.Join(dir, "nope")}, "NATS token file: open " + filepath.Join(dir, "nope")},
		"empty":          {Options{TokenFile: empty}, "NATS token file " + empty + " is empty"},
		"and a token":    {Options{TokenFile: good, Token: "x"}, "choose one way, not token and token file"},
		"and a password": {Options{TokenFile: good, User: "u", Password: "p"}, "choose one way, not user/password and token file"},
	} {
		t.Run(name, func(t *testing.T) {
			tc.opts.URLs = "nats://127.0.0.1:1"
			_, err := Connect(context.Background(), tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v, want an error saying %q", err, tc.says)
			}
		})
	}
	tf, err := newTokenFile(good, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := tf.token(); got != "tok" {
		t.Fatalf("token %q, want the file's, trimmed", got)
	}
	if tf.changed() {
		t.Fatal("changed before the file did")
	}
	if err := os.WriteFile(good, []byte("tok2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !tf.changed() {
		t.Fatal("not changed after the file did")
	}
}
