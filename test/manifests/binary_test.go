package manifests

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpuscaler/gpuscaler/deploy/render"
)

// TestMain removes the gpuscaler binary built for the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// gpuscalerBinary returns the gpuscaler binary: $GPUSCALER_BIN when set (make passes
// bin/gpuscaler), else one built once from the main module in this checkout. This module
// runs the binary rather than importing the main module, whose Kubernetes libraries are
// newer than the ones KEDA v2.21.0 builds with.
func gpuscalerBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if p := os.Getenv("GPUSCALER_BIN"); p != "" {
			binPath, binErr = filepath.Abs(p)
			return
		}
		r, err := render.RepoRoot(".")
		if err != nil {
			binErr = err
			return
		}
		if binDir, binErr = os.MkdirTemp("", "gpuscaler-manifests-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "gpuscaler")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/gpuscaler")
		cmd.Dir = r
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = &buildError{err: err, out: string(out)}
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return "build gpuscaler: " + e.err.Error() + "\n" + e.out }

// flagSpec is one flag of a gpuscaler command, as its --help lists it.
type flagSpec struct {
	takesValue bool
	env        string
}

var helpFlag = regexp.MustCompile(`(?m)^\s+--([a-z0-9-]+)( \S+)?\n\s+.*?(?:\[\$(GPUSCALER_[A-Z0-9_]+)\])?$`)

// commandFlags runs `gpuscaler <command> --help` (command may name a subcommand:
// "auth-callout issuer-key") and returns its flags and its help text.
func commandFlags(t *testing.T, command string) (map[string]flagSpec, string) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(gpuscalerBinary(t), append(strings.Fields(command), "--help")...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = cleanEnv()
	if err := cmd.Run(); err != nil {
		t.Fatalf("gpuscaler %s --help: %v\n%s", command, err, out.String())
	}
	flags := map[string]flagSpec{}
	for _, m := range helpFlag.FindAllStringSubmatch(out.String(), -1) {
		flags[m[1]] = flagSpec{takesValue: m[2] != "", env: m[3]}
	}
	// A command has its NATS, HTTP and log flags at least; a subcommand may have one.
	least := 5
	if strings.Contains(command, " ") {
		least = 1
	}
	if len(flags) < least {
		t.Fatalf("got %d flags from gpuscaler %s --help, want its flag list:\n%s", len(flags), command, out.String())
	}
	return flags, out.String()
}

// cleanEnv is this process's environment without GPUSCALER_ variables, which would
// change what the binary does.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GPUSCALER_") {
			env = append(env, kv)
		}
	}
	return env
}

// chartCommands are the gpuscaler commands the chart runs: the scaler, the collectors,
// the auth callout, and the NATS servers' init container deriving the issuer's key.
var chartCommands = []string{"scaler", "collector", "auth-callout", "auth-callout issuer-key"}

// splitCommand splits a container's args into the gpuscaler command (the words before
// the first flag) and its flags.
func splitCommand(args []string) (command string, flags []string) {
	i := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "-") })
	if i < 0 {
		i = len(args)
	}
	return strings.Join(args[:i], " "), args[i:]
}

// TestChartFlagsExist runs the gpuscaler binary's --help and checks every flag and
// GPUSCALER_ variable the chart gives the scaler, the collector, the auth callout and
// the init container: each must exist, a flag that takes a value must get one, and a
// boolean none but true or false.
func TestChartFlagsExist(t *testing.T) {
	known := map[string]map[string]flagSpec{}
	help := map[string]string{}
	for _, command := range chartCommands {
		known[command], help[command] = commandFlags(t, command)
	}
	// The collector reads its node and pod names from the downward API's variables.
	for _, v := range []string{"$NODE_NAME", "$POD_NAME"} {
		if !strings.Contains(help["collector"], v) {
			t.Errorf("got collector --help without %s, which the chart sets for it", v)
		}
	}
	for _, c := range render.Cases {
		t.Run(c.Name, func(t *testing.T) {
			for _, w := range workloads(caseObjects(t, c)) {
				for _, ctr := range append(slices.Clone(w.pod.Spec.InitContainers), w.pod.Spec.Containers...) {
					if !strings.Contains(ctr.Image, "gpuscaler") {
						continue
					}
					where := w.kind + " " + w.name + " container " + ctr.Name
					command, args := splitCommand(ctr.Args)
					flags := known[command]
					if flags == nil {
						t.Errorf("%s: got args %v, want a gpuscaler command first (%s)", where, ctr.Args, strings.Join(chartCommands, ", "))
						continue
					}
					for _, arg := range args {
						name, value, hasValue := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
						spec, ok := flags[name]
						switch {
						case !strings.HasPrefix(arg, "--"):
							t.Errorf("%s: got argument %q, want --flag=value", where, arg)
						case !ok:
							t.Errorf("%s: got %s, not a flag of gpuscaler %s", where, arg, command)
						case spec.takesValue && !hasValue:
							t.Errorf("%s: got %s without =value", where, arg)
						case !spec.takesValue && hasValue && value != "true" && value != "false":
							t.Errorf("%s: got boolean %s, want true or false", where, arg)
						}
					}
					envs := map[string]bool{}
					for _, s := range flags {
						envs[s.env] = true
					}
					for _, e := range ctr.Env {
						if strings.HasPrefix(e.Name, "GPUSCALER_") && !envs[e.Name] {
							t.Errorf("%s: got env %s, which no flag of gpuscaler %s reads", where, e.Name, command)
						}
					}
				}
			}
		})
	}
}
