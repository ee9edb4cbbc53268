//go:build hardware

package collectortest

import (
	"bytes"
	"encoding/csv"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// The hardware tests' helpers (build tag hardware: collector/hardware_test.go and
// collector/nvml/hardware_test.go), for a machine with an NVIDIA GPU.

// SMIGPU is one GPU as nvidia-smi reads it.
type SMIGPU struct {
	Index                   int
	UUID, Name, MIGMode     string
	MemTotalMiB, MemUsedMiB float64
	Util                    float64
	UtilKnown, MemUsedSet   bool
}

// NvidiaSMI reads every GPU through nvidia-smi, the driver's own tool, which the
// checks take as the truth; the test is skipped without it.
func NvidiaSMI(t *testing.T) []SMIGPU {
	t.Helper()
	path, err := exec.LookPath("nvidia-smi")
	if err != nil {
		t.Skip("no nvidia-smi on the PATH: not a GPU machine")
	}
	out, err := exec.Command(path, "--query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,mig.mode.current",
		"--format=csv,noheader,nounits").Output()
	if err != nil {
		t.Fatalf("nvidia-smi: %v", err)
	}
	r := csv.NewReader(bytes.NewReader(out))
	r.TrimLeadingSpace = true
	rows, err := r.ReadAll()
	if err != nil {
		t.Fatalf("nvidia-smi output %q: %v", out, err)
	}
	var gpus []SMIGPU
	for _, row := range rows {
		if len(row) != 7 {
			t.Fatalf("nvidia-smi row %q: want 7 fields", row)
		}
		g := SMIGPU{UUID: row[1], Name: row[2], MIGMode: row[6]}
		g.Index, _ = strconv.Atoi(row[0])
		g.MemTotalMiB, _ = strconv.ParseFloat(row[3], 64)
		var uerr, merr error
		g.MemUsedMiB, merr = strconv.ParseFloat(row[4], 64)
		g.MemUsedSet = merr == nil
		g.Util, uerr = strconv.ParseFloat(row[5], 64)
		g.UtilKnown = uerr == nil // "[N/A]" in MIG mode
		gpus = append(gpus, g)
	}
	t.Logf("nvidia-smi: %s", bytes.TrimSpace(out))
	return gpus
}

// LoadPID is the PID of the CUDA load the check script started, 0 without one.
func LoadPID(t *testing.T) (pid uint32, heldMiB float64) {
	t.Helper()
	v := os.Getenv("GPUSCALER_HW_LOAD_PID")
	if v == "" {
		return 0, 0
	}
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		t.Fatalf("GPUSCALER_HW_LOAD_PID=%q: %v", v, err)
	}
	mib, _ := strconv.ParseFloat(os.Getenv("GPUSCALER_HW_LOAD_MIB"), 64)
	return uint32(n), mib
}

// LogSamples logs each sample, as JSON.
func LogSamples(t *testing.T, what string, samples []*gpuscalerv1.GPUSample) {
	t.Helper()
	for _, s := range samples {
		t.Logf("%s: %s", what, protojson.Format(s))
	}
}
