package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/natstest"

	"github.com/gpuscaler/gpuscaler/scaler/scalertest"
	"github.com/gpuscaler/gpuscaler/test/testkit"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	"github.com/gpuscaler/gpuscaler/internal/version"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler"
)

// mapEnv is an environment holding exactly m.
func mapEnv(m map[string]string) envFunc {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// result is what one run of the command line gave.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
}

// runCLI runs the command line args with environment env until it returns or ctx ends.
func runCLI(ctx context.Context, env map[string]string, args ...string) result {
	var stdout, stderr testkit.SyncBuffer
	code := run(ctx, args, mapEnv(env), &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

// startScaler starts embedded NATS and a scaler on it, which creates the GPUSCALER
// stream, and waits until the scaler is ready. It returns the NATS URL and a connection.
func startScaler(t *testing.T) (string, *natsconn.Conn) {
	t.Helper()
	ns := natstest.Start(t, "", "")
	scalertest.Start(t, ns.ClientURL())
	return ns.ClientURL(), natstest.Connect(t, ns.ClientURL())
}

// storedEvent decodes the last message the stream of subject (GPUSCALER_QUEUES for a
// queue's, GPUSCALER for a node's) holds on subject.
func storedEvent(t *testing.T, nc *natsconn.Conn, subject string) gpuscalerv1.Event {
	t.Helper()
	js, err := jetstream.New(nc.Conn)
	if err != nil {
		t.Fatal(err)
	}
	name := streamOf(subject)
	stream, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	msg, err := stream.GetLastMsgForSubject(t.Context(), subject)
	if err != nil {
		t.Fatalf("last message on %s: %v", subject, err)
	}
	ev, err := gpuscalerv1.Decode(msg.Subject, msg.Data)
	if err != nil {
		t.Fatalf("decode the message on %s: %v", subject, err)
	}
	return ev
}

// streamOf names the stream that keeps subject's reports.
func streamOf(subject string) string {
	if strings.HasPrefix(subject, gpuscalerv1.QueueSubjectPrefix) {
		return gpuscalerv1.QueueStreamName
	}
	return gpuscalerv1.StreamName
}

// publishedLine matches what publish prints on success.
func publishedLine(subject string) *regexp.Regexp {
	return regexp.MustCompile(`^published to ` + regexp.QuoteMeta(subject) + ` \(stream ` + streamOf(subject) + `, sequence [1-9][0-9]*\)\n$`)
}

func TestMainUsage(t *testing.T) {
	tests := map[string]struct {
		args       []string
		wantCode   int
		wantStdout bool // usage on stdout, else on stderr
		wantMsg    string
	}{
		"--help":          {args: []string{"--help"}, wantCode: 0, wantStdout: true},
		"-h":              {args: []string{"-h"}, wantCode: 0, wantStdout: true},
		"help":            {args: []string{"help"}, wantCode: 0, wantStdout: true},
		"no arguments":    {args: nil, wantCode: 2},
		"unknown command": {args: []string{"frobnicate"}, wantCode: 2, wantMsg: `unknown command "frobnicate"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := runCLI(t.Context(), nil, tc.args...)
			if r.code != tc.wantCode {
				t.Fatalf("got %v, want exit %d", r, tc.wantCode)
			}
			usage, other := r.stderr, r.stdout
			if tc.wantStdout {
				usage, other = r.stdout, r.stderr
			}
			if other != "" {
				t.Errorf("got %v, want usage on one stream and nothing on the other", r)
			}
			if !strings.Contains(usage, "Usage: gpuscaler <command>") {
				t.Errorf("got usage %q, want \"Usage: gpuscaler <command>\"", usage)
			}
			if !strings.Contains(usage, "GPUSCALER_GRPC_ADDR") {
				t.Errorf("got usage %q, want it to explain the GPUSCALER_<FLAG> environment variables", usage)
			}
			names := []string{"scaler", "publish", "version"}
			for _, c := range commands() {
				names = append(names, c.name)
			}
			for _, n := range names {
				if !regexp.MustCompile(`(?m)^  ` + n + ` +\S`).MatchString(usage) {
					t.Errorf("got usage %q, want command %q listed with its summary", usage, n)
				}
			}
			if !strings.Contains(r.stderr, tc.wantMsg) {
				t.Errorf("got stderr %q, want %q", r.stderr, tc.wantMsg)
			}
		})
	}
}

// helpFlags returns the flags a command's --help lists: each flag's name and its entry,
// the "  --name type" line and the description line below it.
func helpFlags(t *testing.T, help string) map[string]string {
	t.Helper()
	flags := map[string]string{}
	lines := strings.Split(help, "\n")
	for i, l := range lines {
		rest, ok := strings.CutPrefix(l, "  --")
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(rest, " ")
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "      ") {
			t.Errorf("flag --%s has no description line in %q", name, help)
			continue
		}
		flags[name] = l + "\n" + lines[i+1]
	}
	return flags
}

// wantEnv is the environment variable of a flag, spelled out independently of envName.
func wantEnv(flagName string) string {
	return "GPUSCALER_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func TestEveryCommandHelp(t *testing.T) {
	for _, c := range commands() {
		for _, h := range []string{"--help", "-h"} {
			t.Run(c.name+" "+h, func(t *testing.T) {
				args := []string{c.name, h}
				if c.name == "publish" {
					args = []string{c.name, "queue", h}
				}
				r := runCLI(t.Context(), nil, args...)
				if r.code != 0 || r.stderr != "" {
					t.Fatalf("got %v, want exit 0 and nothing on stderr", r)
				}
				if !strings.HasPrefix(r.stdout, "Usage: gpuscaler "+c.name) {
					t.Errorf("got stdout %q, want it to begin \"Usage: gpuscaler %s\"", r.stdout, c.name)
				}
				for name, entry := range helpFlags(t, r.stdout) {
					if !strings.HasSuffix(entry, " [$"+wantEnv(name)+"]") {
						t.Errorf("--%s: got %q, want it to end with [$%s]", name, entry, wantEnv(name))
					}
				}
			})
		}
	}
}

// natsFlagsWant are the flags natsFlags adds, all without a default except --nats-url.
var natsFlagsWant = []string{"nats-user", "nats-password", "nats-token", "nats-token-file", "nats-nkey-seed", "nats-creds", "nats-tls-ca", "nats-tls-cert", "nats-tls-key"}

func TestCommandHelpListsEveryFlag(t *testing.T) {
	// Each command's flags and the "(default …)" its help shows; "" means none shown.
	scalerFlags := map[string]string{
		"grpc-addr":                `(default ":9090")`,
		"http-addr":                `(default ":8080")`,
		"status-page":              "",
		"kubeconfig":               `(default "none")`,
		"tls-cert":                 "",
		"tls-key":                  "",
		"tls-client-ca":            "",
		"stale-after":              "(default 30s)",
		"stream-max-age":           "(default " + scaler.DefaultStreamMaxAge.String() + ")",
		"node-tombstone-ttl":       "(default " + scaler.DefaultNodeTombstoneTTL.String() + ")",
		"stream-max-bytes":         "(default 1073741824)",
		"queue-stream-max-bytes":   "(default 1073741824)",
		"consumer-refresh":         "(default 1s)",
		"max-followed-consumers":   "(default 500)",
		"jetstream-namespaces":     "",
		"max-queues-per-namespace": "(default 1000)",
		"max-producers-per-queue":  "(default 64)",
		"max-connection-age":       "(default 5m0s)",
		"stream-replicas":          "(default 1)",
		"stream-memory":            "",
		"nats-url":                 "",
		"embedded-nats-addr":       `(default "127.0.0.1:4222")`,
		"data-dir":                 "",
		"log-format":               `(default "text")`,
		"log-level":                `(default "info")`,
	}
	publishFlags := map[string]string{
		"nats-url": `(default "nats://127.0.0.1:4222")`,
		"timeout":  "(default 5s)",
	}
	queueFlags := map[string]string{
		"namespace":   "",
		"queue":       "",
		"waiting":     "",
		"in-flight":   "",
		"arrivals":    "",
		"dropped":     "",
		"stopped":     "",
		"producer-id": `(default "gpuscaler-publish")`,
	}
	nodeFlags := map[string]string{"file": ""}
	demoFlags := map[string]string{
		"duration":         "(default 1m0s)",
		"nodes":            "(default 4)",
		"gpus-per-node":    "(default 8)",
		"seed":             "(default 1)",
		"grpc-addr":        `(default "127.0.0.1:9090")`,
		"http-addr":        `(default "127.0.0.1:8080")`,
		"nats-addr":        `(default "127.0.0.1:4222")`,
		"polling-interval": "(default 5s)",
		"cooldown":         "(default 15s)",
		"hpa-sync":         "(default 5s)",
		"chart":            "",
		"json":             "",
		"log-format":       `(default "text")`,
		"log-level":        `(default "warn")`,
	}
	calloutFlags := map[string]string{
		"issuer-seed-file":     "",
		"issuer-key-configmap": "",
		"scaler-account":       `(default "GPUSCALER")`,
		"collector-account":    `(default "GPUSCALER_COLLECTORS")`,
		"producer-account":     `(default "GPUSCALER_PRODUCERS")`,
		"audience":             `(default "gpuscaler-nats")`,
		"scaler-identities":    "",
		"collector-identities": "",
		"producer-identities":  `(default "*/*")`,
		"jetstream-namespaces": "",
		"static-users":         "",
		"user-max-ttl":         "(default 1h0m0s)",
		"pod-lookup":           "",
		"kubeconfig":           "",
		"http-addr":            `(default ":8082")`,
		"nats-url":             `(default "nats://127.0.0.1:4222")`,
		"log-format":           `(default "text")`,
		"log-level":            `(default "info")`,
	}
	collectorFlags := map[string]string{
		"node":                 "",
		"interval":             "(default 1s)",
		"collector-id":         "",
		"read-pods":            "(default true)",
		"source":               `(default "auto")`,
		"dcgm-addr":            "",
		"proc-root":            `(default "/proc")`,
		"exporter-url":         `(default "http://localhost:9400/metrics")`,
		"sim-gpus":             "(default 8)",
		"sim-config":           "",
		"sim-seed":             "(default 1)",
		"sim-from-cluster":     "",
		"pod-resources-socket": `(default "/var/lib/kubelet/pod-resources/kubelet.sock")`,
		"resources":            "(default ",
		"kubeconfig":           "",
		"http-addr":            `(default ":8081")`,
		"nats-url":             `(default "nats://127.0.0.1:4222")`,
		"log-format":           `(default "text")`,
		"log-level":            `(default "info")`,
	}
	benchFlags := map[string]string{
		"scale":              `(default "default")`,
		"nodes":              "(default 1000)",
		"gpus-per-node":      "(default 8)",
		"node-interval":      "(default 1s)",
		"big-namespace-gpus": "",
		"activations":        "(default 1000)",
		"triggers":           "(default 1000)",
		"calls":              "(default 20000)",
		"polling-interval":   "(default 30s)",
		"hpa-sync-period":    "(default 15s)",
		"rates":              `(default "10000,20000,30000,40000,50000,60000,80000")`,
		"step":               "(default 3s)",
		"absorb-fixed-nodes": "",
		"memory-nodes":       "(default 10000)",
		"scaler-rss":         "(default true)",
		"out":                `(default "bench.json")`,
		"check":              "",
		"cpu-profile":        "",
		"stream-memory":      "",
		"nats-auth":          `(default "open")`,
		"log-format":         `(default "text")`,
		"log-level":          `(default "info")`,
	}
	explainFlags := map[string]string{
		"file":                     "",
		"namespace":                "",
		"name":                     "",
		"metadata":                 "",
		"scaler-address":           "",
		"tls":                      "",
		"tls-ca":                   "",
		"tls-cert":                 "",
		"tls-key":                  "",
		"tls-server-name":          "",
		"tls-insecure-skip-verify": "",
		"output":                   `(default "table")`,
		"timeout":                  "(default 10s)",
	}
	gatewayFlags := map[string]string{
		"routes":             "",
		"listen":             `(default ":8080")`,
		"http-addr":          `(default ":9091")`,
		"namespace":          "",
		"kubeconfig":         "",
		"max-held":           "(default 1000)",
		"max-held-bytes":     "(default 67108864)",
		"max-body-bytes":     "(default 16777216)",
		"max-header-bytes":   "(default 65536)",
		"first-byte-timeout": "(default 10m0s)",
		"idle-timeout":       "(default 5m0s)",
		"shutdown-grace":     "(default 30s)",
		"report-interval":    "(default 1s)",
		"producer-id":        "",
		"service-address":    "",
		"nats-url":           `(default "nats://127.0.0.1:4222")`,
		"log-format":         `(default "text")`,
		"log-level":          `(default "info")`,
	}
	for _, m := range []map[string]string{scalerFlags, publishFlags, calloutFlags, collectorFlags, gatewayFlags} {
		for _, f := range natsFlagsWant {
			m[f] = ""
		}
	}
	tests := map[string]struct {
		args  []string
		usage string
		flags []map[string]string
	}{
		"scaler":        {[]string{"scaler", "--help"}, "Usage: gpuscaler scaler [flags]", []map[string]string{scalerFlags}},
		"publish queue": {[]string{"publish", "queue", "--help"}, "Usage: gpuscaler publish queue [flags]", []map[string]string{publishFlags, queueFlags}},
		"publish node":  {[]string{"publish", "node", "--help"}, "Usage: gpuscaler publish node [flags]", []map[string]string{publishFlags, nodeFlags}},
		// Every publish error points to 'gpuscaler publish --help': it lists both kinds' flags.
		"publish":      {[]string{"publish", "--help"}, "Usage: gpuscaler publish queue|node [flags]", []map[string]string{publishFlags, queueFlags, nodeFlags}},
		"collector":    {[]string{"collector", "--help"}, "Usage: gpuscaler collector [flags]", []map[string]string{collectorFlags}},
		"gateway":      {[]string{"gateway", "--help"}, "Usage: gpuscaler gateway --routes FILE [flags]", []map[string]string{gatewayFlags}},
		"version":      {[]string{"version", "--help"}, "Usage: gpuscaler version", nil},
		"auth-callout": {[]string{"auth-callout", "--help"}, "Usage: gpuscaler auth-callout [flags] | issuer-key | hash-password", []map[string]string{calloutFlags}},
		"auth-callout issuer-key": {[]string{"auth-callout", "issuer-key", "--help"}, "Usage: gpuscaler auth-callout issuer-key --issuer-seed-file FILE [--out FILE]",
			[]map[string]string{{"issuer-seed-file": "", "out": ""}}},
		"demo":    {[]string{"demo", "--help"}, "Usage: gpuscaler demo [flags]", []map[string]string{demoFlags}},
		"explain": {[]string{"explain", "--help"}, "Usage: gpuscaler explain (--metadata KEY=VALUE... | --file FILE) [flags]", []map[string]string{explainFlags}},
		"bench":   {[]string{"bench", "--help"}, "Usage: gpuscaler bench [flags]", []map[string]string{benchFlags}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := runCLI(t.Context(), nil, tc.args...)
			if r.code != 0 || r.stderr != "" {
				t.Fatalf("got %v, want exit 0 and nothing on stderr", r)
			}
			if !strings.HasPrefix(r.stdout, tc.usage+"\n") {
				t.Errorf("got stdout %q, want it to begin %q", r.stdout, tc.usage)
			}
			want := map[string]string{}
			for _, m := range tc.flags {
				for k, v := range m {
					want[k] = v
				}
			}
			got := helpFlags(t, r.stdout)
			for f, def := range want {
				entry, ok := got[f]
				if !ok {
					t.Errorf("--%s missing from the help:\n%s", f, r.stdout)
					continue
				}
				if !strings.HasSuffix(entry, " [$"+wantEnv(f)+"]") {
					t.Errorf("--%s: got %q, want it to end with [$%s]", f, entry, wantEnv(f))
				}
				if def == "" && strings.Contains(entry, "(default") {
					t.Errorf("--%s: got %q, want no default shown", f, entry)
				}
				if def != "" && !strings.Contains(entry, def) {
					t.Errorf("--%s: got %q, want %s", f, entry, def)
				}
			}
			for f := range got {
				if _, ok := want[f]; !ok {
					t.Errorf("help lists --%s, which this test does not know: add it to the test's list", f)
				}
			}
		})
	}
}

func TestPublishHelp(t *testing.T) {
	for _, h := range []string{"--help", "-h"} {
		t.Run(h, func(t *testing.T) {
			r := runCLI(t.Context(), nil, "publish", h)
			if r.code != 0 || r.stderr != "" {
				t.Fatalf("got %v, want exit 0 and nothing on stderr", r)
			}
			for _, w := range []string{"Usage: gpuscaler publish queue|node", "publish queue --namespace", "publish node --file"} {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("got stdout %q, want %q", r.stdout, w)
				}
			}
		})
	}
}

func TestVersion(t *testing.T) {
	r := runCLI(t.Context(), nil, "version")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("got %v, want exit 0 and nothing on stderr", r)
	}
	if !strings.HasPrefix(r.stdout, "gpuscaler ") || strings.Count(r.stdout, "\n") != 1 || !strings.HasSuffix(r.stdout, "\n") {
		t.Errorf("got stdout %q, want one line starting \"gpuscaler \"", r.stdout)
	}
	if want := version.String() + "\n"; r.stdout != want {
		t.Errorf("got stdout %q, want %q", r.stdout, want)
	}
}

func TestEnvName(t *testing.T) {
	tests := map[string]string{
		"grpc-addr":          "GPUSCALER_GRPC_ADDR",
		"embedded-nats-addr": "GPUSCALER_EMBEDDED_NATS_ADDR",
		"timeout":            "GPUSCALER_TIMEOUT",
	}
	for flagName, want := range tests {
		if got := envName(flagName); got != want {
			t.Errorf("envName(%q): got %q, want %q", flagName, got, want)
		}
	}
}

func TestParseFlags(t *testing.T) {
	type values struct {
		name  string
		count int
		wait  time.Duration
		on    bool
	}
	defaults := values{name: "d", count: 1, wait: time.Second}
	tests := map[string]struct {
		args    []string
		env     map[string]string
		want    values
		wantErr []string // substrings of a usageError; nil means success
	}{
		"defaults": {want: defaults},
		"flags": {
			args: []string{"--name", "n", "--count", "3", "--wait", "2m", "--on"},
			want: values{name: "n", count: 3, wait: 2 * time.Minute, on: true},
		},
		"environment": {
			env:  map[string]string{"GPUSCALER_NAME": "e", "GPUSCALER_COUNT": "7", "GPUSCALER_WAIT": "5s", "GPUSCALER_ON": "true"},
			want: values{name: "e", count: 7, wait: 5 * time.Second, on: true},
		},
		"flags win over the environment": {
			args: []string{"--name", "n", "--on=false"},
			env:  map[string]string{"GPUSCALER_NAME": "e", "GPUSCALER_COUNT": "7", "GPUSCALER_ON": "true"},
			want: values{name: "n", count: 7, wait: time.Second, on: false},
		},
		"a flag given as its default still wins": {
			args: []string{"--count", "1"},
			env:  map[string]string{"GPUSCALER_COUNT": "7"},
			want: defaults,
		},
		"other variables are ignored": {
			env:  map[string]string{"NAME": "x", "GPUSCALER_OTHER": "y", "gpuscaler_name": "z"},
			want: defaults,
		},
		"invalid environment value": {
			env:     map[string]string{"GPUSCALER_WAIT": "banana"},
			wantErr: []string{"GPUSCALER_WAIT", `"banana"`},
		},
		"every invalid environment value is named": {
			env:     map[string]string{"GPUSCALER_WAIT": "banana", "GPUSCALER_COUNT": "many"},
			wantErr: []string{"GPUSCALER_WAIT", "GPUSCALER_COUNT"},
		},
		"invalid environment value of a flag given is not read": {
			args: []string{"--wait", "3s"},
			env:  map[string]string{"GPUSCALER_WAIT": "banana"},
			want: values{name: "d", count: 1, wait: 3 * time.Second},
		},
		"invalid flag value": {
			args:    []string{"--count", "x"},
			wantErr: []string{"-count"},
		},
		"unknown flag": {
			args:    []string{"--nope"},
			wantErr: []string{"flag provided but not defined", "-nope"},
		},
		"unexpected argument": {
			args:    []string{"--count", "2", "extra"},
			wantErr: []string{`unexpected argument "extra"`},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var got values
			var help bytes.Buffer
			fs := newFlagSet("test", "test [flags]", "Tests.", &help)
			fs.StringVar(&got.name, "name", defaults.name, "a name")
			fs.IntVar(&got.count, "count", defaults.count, "a count")
			fs.DurationVar(&got.wait, "wait", defaults.wait, "a wait")
			fs.BoolVar(&got.on, "on", defaults.on, "a switch")
			err := parseFlags(fs, tc.args, mapEnv(tc.env))
			// Usage is printed for --help only; run reports errors, once, on stderr.
			if help.Len() != 0 {
				t.Errorf("got output %q, want none", help.String())
			}
			if tc.wantErr != nil {
				if !errors.As(err, new(usageError)) {
					t.Fatalf("got error %v, want a usageError", err)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("got error %q, want it to contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("got error %v, want none", err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseFlagsHelp(t *testing.T) {
	var out bytes.Buffer
	fs := newFlagSet("test", "test [flags]", "\nTests things.\n", &out)
	fs.Duration("wait", time.Second, "how long to `wait`")
	fs.String("name", "", "a name")
	fs.Bool("on", false, "a switch")
	err := parseFlags(fs, []string{"--help"}, mapEnv(map[string]string{"GPUSCALER_WAIT": "banana"}))
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("got error %v, want flag.ErrHelp", err)
	}
	want := `Usage: gpuscaler test [flags]

Tests things.

Flags (each also read from its environment variable; a flag given on the command line wins):
  --name string
      a name [$GPUSCALER_NAME]
  --on
      a switch [$GPUSCALER_ON]
  --wait wait
      how long to wait (default 1s) [$GPUSCALER_WAIT]
`
	if got := out.String(); got != want {
		t.Errorf("got usage\n%s\nwant\n%s", got, want)
	}
}

// TestCommandLineUsageErrors checks mistakes in the command line exit with 2 and say what
// is wrong, before anything starts. NATS and the scaler's listeners point where nothing
// listens, so a mistake that slipped through fails differently.
func TestCommandLineUsageErrors(t *testing.T) {
	base := map[string]string{
		"GPUSCALER_NATS_URL":           "nats://" + testkit.FreeAddr(t),
		"GPUSCALER_GRPC_ADDR":          "127.0.0.1:0",
		"GPUSCALER_HTTP_ADDR":          "-",
		"GPUSCALER_EMBEDDED_NATS_ADDR": "127.0.0.1:0",
		"GPUSCALER_DATA_DIR":           t.TempDir(),
		"GPUSCALER_TIMEOUT":            "2s",
	}
	queue := []string{"publish", "queue", "--namespace", "ml", "--queue", "jobs"}
	tests := map[string]struct {
		args []string
		env  map[string]string
		want []string
	}{
		"scaler unknown flag":                 {args: []string{"scaler", "--bogus"}, want: []string{"flag provided but not defined: -bogus"}},
		"scaler unexpected argument":          {args: []string{"scaler", "now"}, want: []string{`unexpected argument "now"`}},
		"scaler log level":                    {args: []string{"scaler", "--log-level", "banana"}, want: []string{`--log-level "banana"`}},
		"scaler log format":                   {args: []string{"scaler", "--log-format", "xml"}, want: []string{`--log-format "xml"`}},
		"scaler stale-after from env":         {args: []string{"scaler"}, env: map[string]string{"GPUSCALER_STALE_AFTER": "banana"}, want: []string{"GPUSCALER_STALE_AFTER", "banana"}},
		"scaler log level from env":           {args: []string{"scaler"}, env: map[string]string{"GPUSCALER_LOG_LEVEL": "loud"}, want: []string{"--log-level", "loud"}},
		"scaler stream-replicas":              {args: []string{"scaler", "--stream-replicas", "two"}, want: []string{"-stream-replicas"}},
		"scaler negative consumer cap":        {args: []string{"scaler", "--max-followed-consumers", "-1"}, want: []string{"--max-followed-consumers -1", "0 to follow none"}},
		"scaler negative queue cap":           {args: []string{"scaler", "--max-queues-per-namespace", "-5"}, want: []string{"--max-queues-per-namespace -5", "0 for no limit"}},
		"scaler bad JetStream namespace":      {args: []string{"scaler", "--jetstream-namespaces", "training,Team_B"}, want: []string{"-jetstream-namespaces", `namespace "Team_B" is not a DNS-1123 label`}},
		"nats-config bad JetStream namespace": {args: []string{"auth-callout", "nats-config", "--jetstream-namespaces", "a.b"}, want: []string{"-jetstream-namespaces", `namespace "a.b" is not a DNS-1123 label`}},
		"version unexpected argument":         {args: []string{"version", "now"}, want: []string{`unexpected argument "now"`}},
		"demo one node":                       {args: []string{"demo", "--nodes", "1"}, want: []string{"nodes 1: want 2 to 64"}},
		"demo too short":                      {args: []string{"demo", "--duration", "1s"}, want: []string{"duration 1s: want at least 5s"}},
		"bench unknown scale":                 {args: []string{"bench", "--scale", "huge"}, want: []string{`--scale "huge"`, "want default or large"}},
		"bench namespace too big":             {args: []string{"bench", "--nodes", "10", "--big-namespace-gpus", "71"}, want: []string{"--big-namespace-gpus 71: want 0 to 70"}},
		// --scale large sets --big-namespace-gpus 7000, more than 10 nodes hold: the
		// error shows --nodes 10, given, won over the scale's 10000.
		"bench large scale, nodes given": {args: []string{"bench", "--scale", "large", "--nodes", "10"}, want: []string{"--big-namespace-gpus 7000: want 0 to 70"}},
		"bench large scale, nodes from env": {
			args: []string{"bench", "--scale", "large"},
			env:  map[string]string{"GPUSCALER_NODES": "10"},
			want: []string{"--big-namespace-gpus 7000: want 0 to 70"},
		},
		"publish without kind":          {args: []string{"publish"}, want: []string{"want 'publish queue' or 'publish node'"}},
		"publish unknown kind":          {args: []string{"publish", "job"}, want: []string{"want 'publish queue' or 'publish node'"}},
		"publish queue without waiting": {args: queue, want: []string{"--waiting"}},
		"publish queue without queue":   {args: []string{"publish", "queue", "--namespace", "ml", "--waiting", "1"}, want: []string{"--queue"}},
		"publish queue without namespace": {
			args: []string{"publish", "queue", "--queue", "jobs", "--waiting", "1"},
			want: []string{"--namespace"},
		},
		"publish queue name with a dot": {
			args: []string{"publish", "queue", "--namespace", "ml", "--queue", "a.b", "--waiting", "1"},
			want: []string{`queue name "a.b"`, "'.'", "not allowed"},
		},
		"publish queue name with a space": {
			args: []string{"publish", "queue", "--namespace", "ml", "--queue", "a b", "--waiting", "1"},
			want: []string{`queue name "a b"`, "not allowed"},
		},
		"publish queue upper-case namespace": {
			args: []string{"publish", "queue", "--namespace", "ML", "--queue", "jobs", "--waiting", "1"},
			want: []string{`namespace "ML"`, "DNS-1123"},
		},
		"publish queue negative waiting":  {args: append(queue, "--waiting", "-1"), want: []string{"-waiting", "whole number"}},
		"publish queue waiting not a num": {args: append(queue, "--waiting", "banana"), want: []string{"-waiting", "whole number"}},
		"publish queue fractional waiting": {
			args: append(queue, "--waiting", "1.5"),
			want: []string{"-waiting", "whole number"},
		},
		"publish queue waiting with trailing text": {
			args: append(queue, "--waiting", "3abc"),
			want: []string{"-waiting", "whole number"},
		},
		"publish queue waiting from env": {
			args: queue,
			env:  map[string]string{"GPUSCALER_WAITING": "lots"},
			want: []string{"GPUSCALER_WAITING", "whole number"},
		},
		"publish queue in-flight not a num": {args: append(queue, "--waiting", "1", "--in-flight", "x"), want: []string{"-in-flight", `"x"`, "want a whole number, 0 or more"}},
		"publish queue negative in-flight":  {args: append(queue, "--waiting", "1", "--in-flight", "-1"), want: []string{"-in-flight", `"-1"`, "want a whole number, 0 or more"}},
		"publish queue negative arrivals":   {args: append(queue, "--waiting", "1", "--arrivals", "-3"), want: []string{"-arrivals", `"-3"`, "want a whole number, 0 or more"}},
		"publish queue in-flight from env": {
			args: append(queue, "--waiting", "1"),
			env:  map[string]string{"GPUSCALER_IN_FLIGHT": "-1"},
			want: []string{`GPUSCALER_IN_FLIGHT="-1"`, "want a whole number, 0 or more"},
		},
		"publish zero timeout":               {args: append(queue, "--waiting", "1", "--timeout", "0s"), want: []string{"--timeout 0s", "want a positive duration"}},
		"publish timeout not a duration":     {args: append(queue, "--waiting", "1", "--timeout", "5"), want: []string{"-timeout", `"5"`, "want a duration such as"}},
		"scaler zero replicas":               {args: []string{"scaler", "--stream-replicas", "0"}, want: []string{"--stream-replicas 0", "1 or more"}},
		"scaler negative stream bytes":       {args: []string{"scaler", "--stream-max-bytes", "-1"}, want: []string{"--stream-max-bytes -1", "size in bytes"}},
		"scaler negative queue stream bytes": {args: []string{"scaler", "--queue-stream-max-bytes", "0"}, want: []string{"--queue-stream-max-bytes 0", "size in bytes"}},
		"scaler zero stale-after":            {args: []string{"scaler", "--stale-after", "0s"}, want: []string{"--stale-after 0s", "from 1s to 24h"}},
		"scaler negative stream max age":     {args: []string{"scaler", "--stream-max-age", "-1m"}, want: []string{"--stream-max-age -1m0s", "longer than --stale-after"}},
		"scaler zero consumer refresh":       {args: []string{"scaler", "--consumer-refresh", "0s"}, want: []string{"--consumer-refresh 0s", "positive duration"}},
		"scaler zero max connection age":     {args: []string{"scaler", "--max-connection-age", "0s"}, want: []string{"--max-connection-age 0s", "positive duration"}},
		"collector zero interval":            {args: []string{"collector", "--interval", "0s"}, want: []string{"--interval 0s", "positive duration"}},
		"collector negative sim GPUs":        {args: []string{"collector", "--sim-gpus", "-2"}, want: []string{"--sim-gpus -2", "1 or more"}},
		"collector from-cluster not sim":     {args: []string{"collector", "--source", "nvml", "--sim-from-cluster"}, want: []string{"--sim-from-cluster", "only with --source sim"}},
		"collector from-cluster without API": {args: []string{"collector", "--source", "sim", "--sim-from-cluster", "--kubeconfig", "none"}, want: []string{"--sim-from-cluster", "--kubeconfig none"}},
		"collector interval not a number":    {args: []string{"collector", "--interval", "often"}, want: []string{"-interval", `"often"`, "want a duration such as"}},
		"bench zero nodes":                   {args: []string{"bench", "--nodes", "0"}, want: []string{"--nodes 0", "1 or more"}},
		"bench negative step":                {args: []string{"bench", "--step", "-1s"}, want: []string{"--step -1s", "positive duration"}},
		"publish queue given a node flag":    {args: append(queue, "--waiting", "1", "--file", "r.json"), want: []string{"flag provided but not defined: -file"}},
		"publish queue unexpected argument":  {args: append(queue, "--waiting", "1", "now"), want: []string{`unexpected argument "now"`}},
		"publish node without file":          {args: []string{"publish", "node"}, want: []string{"--file is required"}},
		"publish node given a queue flag":    {args: []string{"publish", "node", "--queue", "jobs"}, want: []string{"flag provided but not defined: -queue"}},
		"publish timeout from env": {
			args: append(queue, "--waiting", "1"),
			env:  map[string]string{"GPUSCALER_TIMEOUT": "soon"},
			want: []string{"GPUSCALER_TIMEOUT", "soon"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			env := maps.Clone(base)
			maps.Copy(env, tc.env)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			r := runCLI(ctx, env, tc.args...)
			if r.code != 2 {
				t.Fatalf("got %v, want exit 2", r)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("got stderr %q, want it to contain %q", r.stderr, w)
				}
			}
			cmd := tc.args[0]
			if want := "Run 'gpuscaler " + cmd + " --help' for usage."; !strings.Contains(r.stderr, want) {
				t.Errorf("got stderr %q, want it to point to %q", r.stderr, want)
			}
			if r.stdout != "" {
				t.Errorf("got stdout %q, want nothing", r.stdout)
			}
		})
	}
}

func TestPublishQueue(t *testing.T) {
	url, nc := startScaler(t)
	tests := map[string]struct {
		args []string
		env  map[string]string
		want *gpuscalerv1.QueueReport
	}{
		"flags": {
			args: []string{"--nats-url", url, "--namespace", "ml", "--queue", "jobs", "--waiting", "3", "--in-flight", "2"},
			want: &gpuscalerv1.QueueReport{Namespace: "ml", Queue: "jobs", Waiting: 3, InFlight: 2, ProducerId: "gpuscaler-publish"},
		},
		"environment": {
			env: map[string]string{
				"GPUSCALER_NATS_URL": url, "GPUSCALER_NAMESPACE": "ml", "GPUSCALER_QUEUE": "env-jobs", "GPUSCALER_WAITING": "7",
				"GPUSCALER_IN_FLIGHT": "4", "GPUSCALER_ARRIVALS": "5", "GPUSCALER_PRODUCER_ID": "p1",
			},
			want: &gpuscalerv1.QueueReport{Namespace: "ml", Queue: "env-jobs", Waiting: 7, InFlight: 4, Arrivals: 5, ProducerId: "p1"},
		},
		"flags win over the environment": {
			args: []string{"--queue", "flag-jobs", "--waiting", "1", "--in-flight", "0"},
			env: map[string]string{
				"GPUSCALER_NATS_URL": url, "GPUSCALER_NAMESPACE": "ml", "GPUSCALER_QUEUE": "env-jobs", "GPUSCALER_WAITING": "7",
				"GPUSCALER_IN_FLIGHT": "4",
			},
			want: &gpuscalerv1.QueueReport{Namespace: "ml", Queue: "flag-jobs", Waiting: 1, InFlight: 0, ProducerId: "gpuscaler-publish"},
		},
		"waiting zero": {
			args: []string{"--nats-url", url, "--namespace", "ml", "--queue", "empty", "--waiting", "0"},
			want: &gpuscalerv1.QueueReport{Namespace: "ml", Queue: "empty", ProducerId: "gpuscaler-publish"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := time.Now()
			r := runCLI(t.Context(), tc.env, append([]string{"publish", "queue"}, tc.args...)...)
			if r.code != 0 {
				t.Fatalf("got %v, want exit 0", r)
			}
			subject := "gpuscaler.v1.queue." + tc.want.Namespace + "." + tc.want.Queue + "." + tc.want.ProducerId
			if !publishedLine(subject).MatchString(r.stdout) {
				t.Errorf("got stdout %q, want %q", r.stdout, publishedLine(subject))
			}
			ev := storedEvent(t, nc, subject)
			got := ev.Queue
			if got == nil {
				t.Fatalf("got event %+v on %s, want a QueueReport", ev, subject)
			}
			if got.GetNamespace() != tc.want.Namespace || got.GetQueue() != tc.want.Queue || got.GetWaiting() != tc.want.Waiting ||
				got.GetInFlight() != tc.want.InFlight || got.GetArrivals() != tc.want.Arrivals || got.GetProducerId() != tc.want.ProducerId {
				t.Errorf("got stored %v, want %v", got, tc.want)
			}
			if got.GetSequence() != 1 {
				t.Errorf("sequence: got %d, want 1", got.GetSequence())
			}
			if at := got.GetObservedAt().AsTime(); at.Before(before.Add(-time.Second)) || at.After(time.Now().Add(time.Second)) {
				t.Errorf("observed_at: got %s, want about now (%s)", at, before)
			}
		})
	}
}

func TestPublishNode(t *testing.T) {
	url, nc := startScaler(t)
	tests := map[string]struct {
		json       string
		node       string
		subject    string
		observedAt time.Time // zero: publish sets it to now
	}{
		"with a dotted name": {
			json: `{
				"node": "gpu-1.example",
				"sequence": "9",
				"source": "sim",
				"allocatable": [{"id": "GPU-a", "resource": "nvidia.com/gpu"}, {"id": "GPU-b", "resource": "nvidia.com/gpu"}],
				"allocated": [{"id": "GPU-a", "resource": "nvidia.com/gpu"}],
				"gpus": [
					{"uuid": "GPU-a", "index": 0, "model": "H100", "gpu_util": 42.5, "fb_used_bytes": "100", "fb_total_bytes": "1000",
					 "pod": {"namespace": "ml", "name": "trainer-0"}},
					{"uuid": "GPU-b", "index": 1, "gpuUtil": 0}
				]
			}`,
			node:    "gpu-1.example",
			subject: "gpuscaler.v1.node.gpu-1_example",
		},
		"with observed_at": {
			json:       `{"node": "gpu-2", "observed_at": "2026-01-02T03:04:05Z", "gpus": [{"uuid": "GPU-c", "gpu_util": 100}]}`,
			node:       "gpu-2",
			subject:    "gpuscaler.v1.node.gpu-2",
			observedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "report.json")
			if err := os.WriteFile(file, []byte(tc.json), 0o600); err != nil {
				t.Fatal(err)
			}
			before := time.Now()
			r := runCLI(t.Context(), nil, "publish", "node", "--nats-url", url, "--file", file)
			if r.code != 0 {
				t.Fatalf("got %v, want exit 0", r)
			}
			if !publishedLine(tc.subject).MatchString(r.stdout) {
				t.Errorf("got stdout %q, want %q", r.stdout, publishedLine(tc.subject))
			}
			ev := storedEvent(t, nc, tc.subject)
			got := ev.Node
			if got == nil {
				t.Fatalf("got event %+v on %s, want a NodeReport", ev, tc.subject)
			}
			if got.GetNode() != tc.node {
				t.Errorf("node: got %q, want %q", got.GetNode(), tc.node)
			}
			at := got.GetObservedAt().AsTime()
			if tc.observedAt.IsZero() {
				if at.Before(before.Add(-time.Second)) || at.After(time.Now().Add(time.Second)) {
					t.Errorf("observed_at: got %s, want about now (%s)", at, before)
				}
			} else if !at.Equal(tc.observedAt) {
				t.Errorf("observed_at: got %s, want %s as the file gave", at, tc.observedAt)
			}
		})
	}

	// Every field of the first report arrives.
	got := storedEvent(t, nc, "gpuscaler.v1.node.gpu-1_example").Node
	if got.GetSequence() != 9 || got.GetSource() != "sim" || len(got.GetAllocatable()) != 2 || len(got.GetAllocated()) != 1 || len(got.GetGpus()) != 2 {
		t.Fatalf("got stored %v, want sequence 9, source sim, 2 allocatable, 1 allocated, 2 GPUs", got)
	}
	g := got.GetGpus()[0]
	if g.GetUuid() != "GPU-a" || g.GetModel() != "H100" || g.GetGpuUtil() != 42.5 || g.GetFbUsedBytes() != 100 || g.GetFbTotalBytes() != 1000 ||
		g.GetPod().GetNamespace() != "ml" || g.GetPod().GetName() != "trainer-0" {
		t.Errorf("got stored GPU %v, want GPU-a, H100, util 42.5, fb 100/1000, pod ml/trainer-0", g)
	}
	if g1 := got.GetGpus()[1]; g1.GpuUtil == nil || g1.GetGpuUtil() != 0 {
		t.Errorf("got stored GPU %v, want gpu_util present and 0", g1)
	}
}

// TestPublishNodeRejectsBadReports checks a report that breaks the contract exits with 1
// and names the file and the fault, without reaching NATS (nothing listens there).
func TestPublishNodeRejectsBadReports(t *testing.T) {
	dir := t.TempDir()
	url := "nats://" + testkit.FreeAddr(t)
	tests := map[string]struct {
		json string // "" means no file
		want []string
	}{
		"unknown field":      {json: `{"node": "n1", "bogus": 1}`, want: []string{"not a NodeReport in protobuf JSON", "bogus"}},
		"not JSON":           {json: `node: n1`, want: []string{"not a NodeReport in protobuf JSON"}},
		"wrong type":         {json: `{"node": 7}`, want: []string{"not a NodeReport in protobuf JSON"}},
		"gpu_util over 100":  {json: `{"node": "n1", "gpus": [{"uuid": "GPU-a", "gpu_util": 150}]}`, want: []string{"gpus[0]", "gpu_util 150", "outside 0–100"}},
		"gpu without uuid":   {json: `{"node": "n1", "gpus": [{"gpu_util": 10}]}`, want: []string{"gpus[0]", "uuid is required"}},
		"fb used over total": {json: `{"node": "n1", "gpus": [{"uuid": "GPU-a", "fb_used_bytes": "9", "fb_total_bytes": "8"}]}`, want: []string{"fb_used_bytes 9 exceeds fb_total_bytes 8"}},
		"duplicate GPU":      {json: `{"node": "n1", "gpus": [{"uuid": "GPU-a"}, {"uuid": "GPU-a"}]}`, want: []string{"gpus[1]", "appears twice"}},
		"pod without name":   {json: `{"node": "n1", "gpus": [{"uuid": "GPU-a", "pod": {"namespace": "ml"}}]}`, want: []string{"pod: name is required"}},
		"invalid node name":  {json: `{"node": "Node_1"}`, want: []string{`node name "Node_1"`, "DNS-1123"}},
		"no node name":       {json: `{}`, want: []string{"node name is empty"}},
		"missing file":       {want: []string{"no such file"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".json")
			if tc.json != "" {
				if err := os.WriteFile(file, []byte(tc.json), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			r := runCLI(t.Context(), nil, "publish", "node", "--nats-url", url, "--file", file)
			if r.code != 1 {
				t.Fatalf("got %v, want exit 1", r)
			}
			want := append([]string{"gpuscaler publish: ", file}, tc.want...)
			for _, w := range want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("got stderr %q, want it to contain %q", r.stderr, w)
				}
			}
			if r.stdout != "" {
				t.Errorf("got stdout %q, want nothing", r.stdout)
			}
		})
	}
}

func TestPublishWithoutStream(t *testing.T) {
	ns := natstest.Start(t, "", "") // no scaler, so no GPUSCALER_QUEUES stream
	r := runCLI(t.Context(), nil, "publish", "queue", "--nats-url", ns.ClientURL(), "--namespace", "ml", "--queue", "jobs", "--waiting", "1", "--timeout", "500ms")
	if r.code != 1 {
		t.Fatalf("got %v, want exit 1", r)
	}
	for _, w := range []string{"gpuscaler.v1.queue.ml.jobs", "within --timeout 500ms", "start 'gpuscaler scaler'", "stream GPUSCALER_QUEUES", "has not elected another"} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("got stderr %q, want it to contain %q", r.stderr, w)
		}
	}
	if r.stdout != "" {
		t.Errorf("got stdout %q, want nothing", r.stdout)
	}
}

// TestPublishWaitsForTheStream: a stream that answers nobody for a while, as a NATS
// cluster's stream does between losing its leader and electing another (the e2e suite's
// TestLoopNATSLosesANode kills one), does not lose the report: publish tries again until
// the stream stores it, within --timeout.
func TestPublishWaitsForTheStream(t *testing.T) {
	ns := natstest.Start(t, "", "")
	nc := natstest.Connect(t, ns.ClientURL())
	created := make(chan struct{})
	go func() {
		defer close(created)
		time.Sleep(500 * time.Millisecond) // the outage under test: no stream for half a second
		js, err := jetstream.New(nc.Conn)
		if err == nil {
			_, err = js.CreateStream(context.Background(), jetstream.StreamConfig{Name: gpuscalerv1.QueueStreamName, Subjects: []string{gpuscalerv1.QueueSubjects}})
		}
		if err != nil {
			t.Errorf("create the stream: %v", err)
		}
	}()
	start := time.Now()
	r := runCLI(t.Context(), nil, "publish", "queue", "--nats-url", ns.ClientURL(), "--namespace", "ml", "--queue", "jobs", "--waiting", "3", "--timeout", "10s")
	if r.code != 0 {
		t.Fatalf("got %v, want the report stored once the stream exists", r)
	}
	if waited := time.Since(start); waited < 400*time.Millisecond {
		t.Errorf("published after %s, before the stream existed", waited)
	}
	// A new stream takes messages before it can be looked up by name: nats-server's
	// addStreamWithAssignment subscribes it to its subjects (setLeader) and registers it
	// with the account last (server/stream.go, v2.15.2), and answers the create after
	// that. So the publish can be acknowledged while a STREAM.INFO still says "stream not
	// found" (seen once under -race in CI); read it back once the create has returned.
	<-created
	if got := storedEvent(t, nc, "gpuscaler.v1.queue.ml.jobs.gpuscaler-publish").Queue.GetWaiting(); got != 3 {
		t.Errorf("stored waiting %d, want 3", got)
	}
}

func TestPublishUnreachableNATSHidesPassword(t *testing.T) {
	addr := testkit.FreeAddr(t)
	r := runCLI(t.Context(), nil, "publish", "queue", "--nats-url", "nats://user:secret@"+addr, "--namespace", "ml", "--queue", "jobs", "--waiting", "1")
	if r.code != 1 {
		t.Fatalf("got %v, want exit 1", r)
	}
	if want := "connect to NATS at nats://[redacted]@" + addr; !strings.Contains(r.stderr, want) {
		t.Errorf("got stderr %q, want it to contain %q", r.stderr, want)
	}
	if strings.Contains(r.stderr, "secret") {
		t.Errorf("got stderr %q, want the password hidden", r.stderr)
	}
}

// logValue returns the value of key in the first text-format log line with msg.
func logValue(log, msg, key string) (string, bool) {
	for line := range strings.SplitSeq(log, "\n") {
		if !strings.Contains(line, " msg="+msg+" ") && !strings.Contains(line, ` msg="`+msg+`" `) {
			continue
		}
		m := regexp.MustCompile(` ` + regexp.QuoteMeta(key) + `=("(?:[^"\\]|\\.)*"|\S+)`).FindStringSubmatch(line)
		if m == nil {
			return "", false
		}
		return strings.Trim(m[1], `"`), true
	}
	return "", false
}

func TestScalerCommandRunsAndStops(t *testing.T) {
	dataDir := t.TempDir()
	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr testkit.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"scaler", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
			"--embedded-nats-addr", "127.0.0.1:0", "--data-dir", dataDir}, mapEnv(nil), &stdout, &stderr)
	}()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			<-done
		}
	})

	testkit.Eventually(t, 15*time.Second, func() bool {
		select {
		case code := <-done:
			stopped = true
			t.Fatalf("scaler exited with %d before it was ready; stderr:\n%s", code, stderr.String())
		default:
		}
		// Ready, and serving: other goroutines log the two, in either order.
		log := stderr.String()
		return strings.Contains(log, " msg=ready ") && strings.Contains(log, "serving metrics and probes")
	})
	log := stderr.String()

	// The open bus is announced once, as a warning.
	if n := testkit.CountLines(log, "level=WARN msg=\""+openBusWarning+"\""); n != 1 {
		t.Errorf("got %d open-bus warnings in log:\n%s\nwant 1", n, log)
	}

	// The embedded NATS server listens on a random port, and the ready line says how to reach it.
	url, ok := logValue(log, "started embedded NATS with JetStream", "url")
	if !ok || !strings.HasPrefix(url, "nats://127.0.0.1:") || strings.HasSuffix(url, ":4222") {
		t.Fatalf("got embedded NATS url %q in log:\n%s\nwant nats://127.0.0.1:<random port>", url, log)
	}
	try, ok := logValue(log, "ready", "try")
	if !ok || !strings.HasSuffix(try, " --nats-url "+url) {
		t.Fatalf("got try hint %q in log:\n%s\nwant one ending --nats-url %s", try, log, url)
	}
	// The hint works as printed.
	args := strings.Fields(strings.TrimPrefix(try, "gpuscaler "))
	if r := runCLI(t.Context(), nil, args...); r.code != 0 || !publishedLine("gpuscaler.v1.queue.default.demo.gpuscaler-publish").MatchString(r.stdout) {
		t.Errorf("running the hint %q: got %v, want exit 0 and a published line", try, r)
	}

	httpAddr, ok := logValue(log, "serving metrics and probes", "httpAddr")
	if !ok {
		t.Fatalf("no httpAddr in log:\n%s", log)
	}
	testkit.Eventually(t, 5*time.Second, func() bool {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if entries, err := os.ReadDir(dataDir); err != nil || len(entries) == 0 {
		t.Errorf("--data-dir %s holds %v (%v), want the JetStream store", dataDir, entries, err)
	}

	cancel()
	select {
	case code := <-done:
		stopped = true
		if code != 0 {
			t.Errorf("exit code after the context ended: got %d, want 0; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("scaler still running 10s after its context ended; stderr:\n%s", stderr.String())
	}
	if stdout.String() != "" {
		t.Errorf("got stdout %q, want nothing (logs go to stderr)", stdout.String())
	}
}

// TestScalerCommandOnOwnNATS: given --nats-url, the scaler starts no embedded server
// and does not warn of an open bus.
func TestScalerCommandOnOwnNATS(t *testing.T) {
	ns := natstest.Start(t, "", "")
	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr testkit.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"scaler", "--grpc-addr", "127.0.0.1:0", "--http-addr", "-", "--nats-url", ns.ClientURL()},
			mapEnv(nil), &stdout, &stderr)
	}()
	testkit.Eventually(t, 15*time.Second, func() bool {
		select {
		case code := <-done:
			t.Fatalf("scaler exited with %d before it was ready; stderr:\n%s", code, stderr.String())
		default:
		}
		return strings.Contains(stderr.String(), " msg=ready ")
	})
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit code after the context ended: got %d, want 0; stderr:\n%s", code, stderr.String())
	}
	if log := stderr.String(); strings.Contains(log, "embedded NATS") || strings.Contains(log, "open bus") {
		t.Errorf("scaler on its own NATS logged of an embedded server or an open bus:\n%s", log)
	}
}

func TestScalerCommandFailsToStart(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() })
	tests := map[string]struct {
		args []string
		want []string
	}{
		"tls cert without key":   {args: []string{"--tls-cert", "x"}, want: []string{"TLS", "certificate and the key"}},
		"tls key without cert":   {args: []string{"--tls-key", "x"}, want: []string{"TLS", "certificate and the key"}},
		"tls client CA only":     {args: []string{"--tls-client-ca", "ca.pem"}, want: []string{"TLS", "client CA"}},
		"tls files missing":      {args: []string{"--tls-cert", "/nonexistent/c.pem", "--tls-key", "/nonexistent/k.pem"}, want: []string{"/nonexistent/"}},
		"gRPC address in use":    {args: []string{"--grpc-addr", busy.Addr().String()}, want: []string{"gRPC listener", busy.Addr().String()}},
		"HTTP address in use":    {args: []string{"--http-addr", busy.Addr().String()}, want: []string{"HTTP listener", busy.Addr().String()}},
		"bad embedded NATS addr": {args: []string{"--embedded-nats-addr", "nonsense"}, want: []string{"embedded NATS address", "nonsense"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"scaler", "--grpc-addr", "127.0.0.1:0", "--http-addr", "-",
				"--embedded-nats-addr", "127.0.0.1:0", "--data-dir", t.TempDir()}, tc.args...)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			r := runCLI(ctx, nil, args...)
			if r.code != 1 {
				t.Fatalf("got %v, want exit 1", r)
			}
			for _, w := range append([]string{"gpuscaler scaler: "}, tc.want...) {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("got stderr %q, want it to contain %q", r.stderr, w)
				}
			}
		})
	}
}

// TestCommandsAreListedOnce guards the dispatch table: a name listed twice would hide a command.
func TestCommandsAreListedOnce(t *testing.T) {
	var names []string
	for _, c := range commands() {
		if c.run == nil || c.summary == "" {
			t.Errorf("command %q: got run %v and summary %q, want both set", c.name, c.run != nil, c.summary)
		}
		if slices.Contains(names, c.name) {
			t.Errorf("command %q listed twice", c.name)
		}
		names = append(names, c.name)
	}
}
