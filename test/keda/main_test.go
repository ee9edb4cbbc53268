package keda

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// gpuscalerBin is the gpuscaler binary every test runs: $GPUSCALER_BIN, or one TestMain
// builds from this repository's working tree.
var gpuscalerBin string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	// KEDA's scalers log through controller-runtime's logger, as in the operator. Its
	// errors ("error calling IsActive on external scaler") say little the tests do not
	// check, so they are shown only on request.
	if os.Getenv("KEDA_CLIENT_LOG") != "" {
		logf.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, nil)))
	} else {
		logf.SetLogger(logr.Discard())
	}

	gpuscalerBin = os.Getenv("GPUSCALER_BIN")
	if gpuscalerBin == "" {
		dir, err := os.MkdirTemp("", "gpuscaler-keda-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		gpuscalerBin = filepath.Join(dir, "gpuscaler")
		build := exec.Command("go", "build", "-o", gpuscalerBin, "./cmd/gpuscaler")
		build.Dir = filepath.Join("..", "..") // the main module, from test/keda
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "build gpuscaler: %v\n", err)
			return 1
		}
	}
	return m.Run()
}
