package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// envFunc looks up an environment variable (os.LookupEnv; a map in tests).
type envFunc func(string) (string, bool)

// envPrefix begins the environment variable of every flag.
const envPrefix = "GPUSCALER_"

// usageError is a mistake in the command line; the exit code is 2.
type usageError struct{ error }

// envName returns the environment variable for a flag: --grpc-addr → GPUSCALER_GRPC_ADDR.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// newFlagSet returns a flag set whose --help prints usage, what the command does, and
// every flag with its default and environment variable.
func newFlagSet(name, synopsis, about string, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse errors are reported once, by run
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: gpuscaler %s\n\n%s\n\n%s:\n", synopsis, strings.TrimSpace(about), flagsHeading)
		printFlags(out, fs)
	}
	return fs
}

// flagsHeading introduces a command's flags in its help.
const flagsHeading = "Flags (each also read from its environment variable; a flag given on the command line wins)"

// printFlags prints every flag of fs with its default and environment variable.
func printFlags(out io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		if isShort(f) {
			return // named in its long flag's description
		}
		typ, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(out, "  --%s", f.Name)
		if typ != "" {
			fmt.Fprintf(out, " %s", typ)
		}
		fmt.Fprintf(out, "\n      %s", usage)
		switch {
		case f.DefValue == "" || f.DefValue == "0" || f.DefValue == "false" || f.DefValue == "0s":
		case typ == "string":
			fmt.Fprintf(out, " (default %q)", f.DefValue)
		default:
			fmt.Fprintf(out, " (default %s)", f.DefValue)
		}
		fmt.Fprintf(out, " [$%s]\n", envName(f.Name))
	})
}

// parseFlags parses args, then sets each flag not given on the command line from its
// environment variable. --help prints usage and returns flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string, env envFunc) error {
	// The flag package prints the usage on every parse error; only --help should.
	usage := fs.Usage
	fs.Usage = func() {}
	restore := describeNumbers(fs)
	err := fs.Parse(args)
	restore()
	fs.Usage = usage
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage()
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || isShort(f) {
			return
		}
		if v, ok := env(envName(f.Name)); ok {
			if err := f.Value.Set(v); err != nil {
				if want := numberWant(f.Value); want != "" {
					err = errors.New("want " + want)
				}
				errs = append(errs, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
			}
		}
	})
	if len(errs) > 0 {
		return usageError{errors.Join(errs...)}
	}
	return nil
}

// shortFlag adds -short as another name of the flag long, already defined.
func shortFlag(fs *flag.FlagSet, short, long string) {
	fs.Var(fs.Lookup(long).Value, short, "short for --"+long)
}

// isShort reports whether f is another name of a long flag (shortFlag): help lists it in
// the long flag's description, and it reads no environment variable of its own.
func isShort(f *flag.Flag) bool {
	return len(f.Name) == 1 && strings.HasPrefix(f.Usage, "short for --")
}

// numberWant says what the value of a numeric flag must look like, or "" for a flag
// that is not a number: the flag package's own error, "parse error", says neither.
func numberWant(v flag.Value) string {
	g, ok := v.(flag.Getter)
	if !ok {
		return ""
	}
	switch g.Get().(type) {
	case int, int64:
		return "a whole number"
	case uint, uint64:
		return "a whole number, 0 or more"
	case float64:
		return "a number"
	case time.Duration:
		return "a duration such as 500ms, 30s, 5m or 1h30m"
	}
	return ""
}

// wantNumber is a numeric flag's value whose parse error says what was wanted; the flag
// package puts the flag's name and the value given in front.
type wantNumber struct {
	flag.Value
	want string
}

func (w wantNumber) Set(s string) error {
	if err := w.Value.Set(s); err != nil {
		return errors.New("want " + w.want)
	}
	return nil
}

// describeNumbers gives fs's numeric flags parse errors that say what was wanted, until
// the returned function puts the flags' own values back (the help reads their types).
func describeNumbers(fs *flag.FlagSet) (restore func()) {
	var wrapped []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if want := numberWant(f.Value); want != "" {
			f.Value = wantNumber{Value: f.Value, want: want}
			wrapped = append(wrapped, f)
		}
	})
	return func() {
		for _, f := range wrapped {
			f.Value = f.Value.(wantNumber).Value
		}
	}
}

// positive is a usage error unless a count or duration flag's value is above zero:
// the parts would otherwise take a zero or negative value for their default, silently.
func positive[T int | int64 | time.Duration](name string, v T, want string) error {
	if v > 0 {
		return nil
	}
	return usageError{fmt.Errorf("--%s %v: want %s", name, v, want)}
}

// firstErr returns the first of errs that is not nil: the first of a command's flag
// checks that failed.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// natsFlags adds the flags that say how to reach NATS.
func natsFlags(fs *flag.FlagSet, o *natsconn.Options, urlHelp string) {
	fs.StringVar(&o.URLs, "nats-url", o.URLs, urlHelp)
	fs.StringVar(&o.User, "nats-user", "", "NATS user name (with --nats-password)")
	fs.StringVar(&o.Password, "nats-password", "", "NATS password")
	fs.StringVar(&o.Token, "nats-token", "", "NATS authentication token")
	fs.StringVar(&o.TokenFile, "nats-token-file", "", "file holding the NATS token, read at every connect: a projected ServiceAccount token for gpuscaler's auth callout; when the kubelet rotates it, the connection re-authenticates")
	fs.StringVar(&o.NKeySeedFile, "nats-nkey-seed", "", "file holding an NKey seed to authenticate with")
	fs.StringVar(&o.CredsFile, "nats-creds", "", "NATS .creds file (JWT and NKey seed) to authenticate with")
	fs.StringVar(&o.TLSCAFile, "nats-tls-ca", "", "PEM CA bundle that verifies the NATS server's certificate")
	fs.StringVar(&o.TLSCertFile, "nats-tls-cert", "", "PEM client certificate for mutual TLS with NATS")
	fs.StringVar(&o.TLSKeyFile, "nats-tls-key", "", "PEM key of --nats-tls-cert")
}

// logFlags adds --log-format and --log-level (defaultLevel unless set) and returns a
// function that builds the logger.
func logFlags(fs *flag.FlagSet, stderr io.Writer, defaultLevel string) func() (*slog.Logger, error) {
	format := fs.String("log-format", "text", "log format: text or json")
	level := fs.String("log-level", defaultLevel, "log level: debug, info, warn or error")
	return func() (*slog.Logger, error) {
		var lvl slog.Level
		if err := lvl.UnmarshalText([]byte(*level)); err != nil {
			return nil, usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", *level)}
		}
		opts := &slog.HandlerOptions{Level: lvl}
		switch *format {
		case "text":
			return slog.New(slog.NewTextHandler(stderr, opts)), nil
		case "json":
			return slog.New(slog.NewJSONHandler(stderr, opts)), nil
		default:
			return nil, usageError{fmt.Errorf("--log-format %q: want text or json", *format)}
		}
	}
}

// jetStreamNamespacesHelp is --jetstream-namespaces' help, the same for the scaler, the
// auth callout and nats-config: the three must be given the same list.
const jetStreamNamespacesHelp = "comma-separated namespaces that keep their JetStream work queues in a NATS account of their own (GPUSCALER_NS_<namespace>), which the scaler reads their consumers' info from; give the scaler, the auth callout and the NATS server (auth-callout nats-config) the same list"

// namespaceList is a flag of comma-separated namespaces, each a DNS-1123 label.
type namespaceList []string

func (l *namespaceList) String() string { return strings.Join(*l, ",") }

func (l *namespaceList) Set(s string) error {
	var out []string
	for ns := range strings.SplitSeq(s, ",") {
		ns = strings.TrimSpace(ns)
		if ns == "" {
			continue
		}
		if err := gpuscalerv1.ValidateNamespace(ns); err != nil {
			return err
		}
		if !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	*l = out
	return nil
}
