package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/kedaobj"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

const explainAbout = `
Asks a running scaler what it answers KEDA for a trigger, and why: IsActive and each
metric's value against its target (or the error KEDA gets), the queue report behind them,
the nodes, pods and GPUs the podSelector's figures come from and how old each report is,
and, for capacityAware, the free GPUs each node gives. It only reads.

Name the trigger by its metadata:

  gpuscaler explain --namespace ml --metadata queue=demo --metadata queueTarget=4

or give the ScaledObject or ScaledJob it is in (several, in a multi-document file):

  gpuscaler explain --file scaledobject.yaml            (every external trigger in it)
  kubectl get scaledobject llm -n ml -o yaml | gpuscaler explain --file -

With --file it also names the object's settings that change what KEDA and the HPA do
with the answers, which the scaler never sees: metricType Value, scalingModifiers,
fallback, a trigger with only podSelector (always active, so never at zero), an HPA
scale-up tolerance a targetWait trigger does not repeat (scaleUpTolerance), and for a
capacityAware ScaledJob its minReplicaCount and scalingStrategy.

It connects as KEDA does: to the trigger's scalerAddress (or --scaler-address, which wins),
over TLS when the trigger sets enableTLS or a --tls-* flag is given. From outside the
cluster, forward the port first and name the certificate's host:

  kubectl -n gpuscaler port-forward svc/gpuscaler 9090
  gpuscaler explain --file so.yaml --scaler-address 127.0.0.1:9090 \
      --tls-ca ca.crt --tls-cert keda.crt --tls-key keda.key \
      --tls-server-name gpuscaler.gpuscaler.svc`

// explainTarget is one trigger to explain: from --metadata, or one external trigger of a
// ScaledObject or ScaledJob, and the scaler to ask.
type explainTarget struct {
	kedaobj.Trigger
	Address string `json:"scalerAddress"`
}

func runExplain(ctx context.Context, args []string, env envFunc, stdout, stderr io.Writer) error {
	var (
		file, namespace, name, address, output string
		tlsCA, tlsCert, tlsKey, serverName     string
		useTLS, skipVerify                     bool
		timeout                                = 10 * time.Second
		md                                     = map[string]string{}
	)
	fs := newFlagSet("explain", "explain (--metadata KEY=VALUE... | --file FILE) [flags]", explainAbout, stdout)
	fs.StringVar(&file, "file", "", `ScaledObject or ScaledJob YAML (or JSON); "-" reads stdin. Each external trigger in it is explained`)
	fs.StringVar(&namespace, "namespace", "", `the trigger's namespace with --metadata ("default" when not given); with --file, that of objects naming none`)
	fs.StringVar(&name, "name", "", "the ScaledObject's name, shown only, with --metadata")
	fs.Func("metadata", "a trigger-metadata `key=value` (repeat the flag for each key; the value may hold commas and '=')", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("want key=value, as in queue=demo")
		}
		md[k] = v
		return nil
	})
	fs.StringVar(&address, "scaler-address", "", `the scaler's gRPC address, host:port (when not given: the trigger's scalerAddress, else 127.0.0.1:9090)`)
	fs.BoolVar(&useTLS, "tls", false, "connect over TLS (the trigger's enableTLS); implied by the other --tls-* flags")
	fs.StringVar(&tlsCA, "tls-ca", "", "PEM CA bundle that verifies the scaler's certificate (KEDA's caCert)")
	fs.StringVar(&tlsCert, "tls-cert", "", "PEM client certificate for mutual TLS (KEDA's tlsClientCert)")
	fs.StringVar(&tlsKey, "tls-key", "", "PEM key of --tls-cert (KEDA's tlsClientKey)")
	fs.StringVar(&serverName, "tls-server-name", "", "the host name the scaler's certificate must carry, when --scaler-address is another (a port-forward)")
	fs.BoolVar(&skipVerify, "tls-insecure-skip-verify", false, "accept any server certificate (the trigger's unsafeSsl); never in production")
	fs.StringVar(&output, "output", "table", "output format: table or json (-o for short)")
	shortFlag(fs, "o", "output")
	fs.DurationVar(&timeout, "timeout", timeout, "how long to wait for the scaler's answer, per trigger")
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	if output != "table" && output != "json" {
		return usageError{fmt.Errorf("--output %q: want table or json", output)}
	}
	if timeout <= 0 {
		return usageError{fmt.Errorf("--timeout %s: want a positive duration, such as 10s", timeout)}
	}
	var targets []explainTarget
	switch {
	case file != "" && len(md) > 0:
		return usageError{errors.New("give --file or --metadata, not both")}
	case file != "":
		var err error
		if targets, err = readTriggers(file, namespace); err != nil {
			return err
		}
	case len(md) > 0:
		if namespace == "" {
			namespace = "default"
		}
		targets = []explainTarget{{Trigger: kedaobj.Trigger{Namespace: namespace, Name: name, Metadata: md}}}
	default:
		return usageError{errors.New("name a trigger: --metadata KEY=VALUE (repeated), or --file with a ScaledObject or ScaledJob")}
	}
	if (tlsCert == "") != (tlsKey == "") {
		return usageError{errors.New("--tls-cert and --tls-key go together")}
	}

	type result struct {
		explainTarget
		Explanation json.RawMessage `json:"explanation"`
	}
	var results []result
	for _, tg := range targets {
		addr := cmp.Or(address, tg.Address, "127.0.0.1:9090")
		wantTLS := useTLS || tlsCA != "" || tlsCert != "" || serverName != "" || skipVerify || tg.Metadata["enableTLS"] == "true"
		creds, err := clientCreds(wantTLS, tlsCA, tlsCert, tlsKey, serverName, skipVerify || tg.Metadata["unsafeSsl"] == "true")
		if err != nil {
			return err
		}
		ex, err := explainOne(ctx, addr, creds, timeout, tg, address == "" && tg.Address != "")
		if err != nil {
			return err
		}
		if output == "table" {
			if len(results) > 0 {
				fmt.Fprintln(stdout)
			}
			printExplanation(stdout, tg, addr, ex)
		}
		raw, err := protojson.MarshalOptions{EmitUnpopulated: false}.Marshal(ex)
		if err != nil {
			return err
		}
		tg.Address = addr
		results = append(results, result{tg, raw})
	}
	if output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(results)
	}
	return nil
}

// clientCreds builds the transport credentials KEDA would use for these settings
// (pkg/scalers/external_scaler.go: TLS when enableTLS, a client certificate or a CA is
// given; unsafeSsl skips verification).
func clientCreds(useTLS bool, caFile, certFile, keyFile, serverName string, skipVerify bool) (credentials.TransportCredentials, error) {
	if !useTLS {
		return insecure.NewCredentials(), nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName, InsecureSkipVerify: skipVerify} //nolint:gosec // --tls-insecure-skip-verify asks for it
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", caFile)
		}
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert %s / --tls-key %s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(cfg), nil
}

// explainOne asks the scaler at addr to explain tg. fromTrigger says addr is the
// trigger's own scalerAddress, often a cluster DNS name this machine cannot reach.
func explainOne(ctx context.Context, addr string, creds credentials.TransportCredentials, timeout time.Duration, tg explainTarget, fromTrigger bool) (*gpuscalerv1.Explanation, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, usageError{fmt.Errorf("scaler address %q: %w", addr, err)}
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ex, err := gpuscalerv1.NewExplainerClient(conn).Explain(ctx, &gpuscalerv1.ExplainRequest{
		Namespace: tg.Namespace, Name: tg.Name, Metadata: tg.Metadata,
	}, grpc.WaitForReady(true))
	if err == nil {
		return ex, nil
	}
	st := status.Convert(err)
	var hint string
	switch st.Code() {
	case codes.Unimplemented:
		hint = "; the scaler there is older than this command (explain came with 0.2) or is not gpuscaler"
	case codes.DeadlineExceeded, codes.Unavailable:
		hint = "; is 'gpuscaler scaler' running there, and does it serve TLS when you did not ask for it (or the reverse)?"
		if fromTrigger {
			hint = fmt.Sprintf("; %s is the trigger's scalerAddress, which resolves only inside the cluster: run 'kubectl -n gpuscaler port-forward svc/gpuscaler 9090' and give --scaler-address 127.0.0.1:9090", addr)
		}
	}
	what := "trigger"
	if tg.Kind != "" {
		what = fmt.Sprintf("%s %s/%s trigger %d", tg.Kind, tg.Namespace, tg.Name, tg.Index)
	}
	return nil, fmt.Errorf("explain %s: scaler at %s: %s (%s)%s", what, addr, st.Message(), st.Code(), hint)
}

// readTriggers reads the external triggers of every ScaledObject and ScaledJob in file
// ("-" for stdin); namespace fills in objects without one.
func readTriggers(file, namespace string) ([]explainTarget, error) {
	var (
		data []byte
		err  error
	)
	if file == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, usageError{fmt.Errorf("--file: %w", err)}
	}
	triggers, err := kedaobj.External(data, namespace)
	if err != nil {
		return nil, usageError{fmt.Errorf("--file %s: %w", file, err)}
	}
	out := make([]explainTarget, len(triggers))
	for i, tr := range triggers {
		out[i] = explainTarget{Trigger: tr, Address: tr.Metadata["scalerAddress"]}
	}
	return out, nil
}

// printExplanation writes ex as tables an operator reads top to bottom: what KEDA gets,
// from what, and why.
func printExplanation(w io.Writer, tg explainTarget, addr string, ex *gpuscalerv1.Explanation) {
	title := "Trigger"
	if tg.Kind != "" {
		title = fmt.Sprintf("%s %s/%s, trigger %d", tg.Kind, tg.Namespace, tg.Name, tg.Index)
		if tg.TrigName != "" {
			title += fmt.Sprintf(" (%s)", tg.TrigName)
		}
	} else if tg.Name != "" {
		title = fmt.Sprintf("Trigger of %s/%s", tg.Namespace, tg.Name)
	} else {
		title = fmt.Sprintf("Trigger in namespace %s", tg.Namespace)
	}
	fmt.Fprintf(w, "%s, answered by the scaler at %s at %s\n", title, addr, ex.GetReadAt().AsTime().UTC().Format(time.RFC3339))
	if !ex.GetReady() {
		fmt.Fprintln(w, "The scaler is not ready: it is restoring its state from NATS.")
	}

	fmt.Fprintln(w, "\nKEDA gets")
	tw := newTable(w)
	a := ex.GetAnswer()
	if a.GetError() != "" {
		fmt.Fprintf(tw, "  IsActive\t%s: %s\n", a.GetErrorCode(), a.GetError())
	} else {
		fmt.Fprintf(tw, "  IsActive\t%v\n", a.GetActive())
	}
	for _, m := range a.GetMetrics() {
		if m.GetError() != "" {
			fmt.Fprintf(tw, "  %s\ttarget %s\t%s: %s\n", m.GetName(), fnum(m.GetTarget()), m.GetErrorCode(), m.GetError())
			continue
		}
		fmt.Fprintf(tw, "  %s\ttarget %s\tvalue %s\t→ %d replicas\n", m.GetName(), fnum(m.GetTarget()), fnum(m.GetValue()), m.GetReplicas())
	}
	tw.Flush()
	if len(ex.GetEffective()) > 0 {
		keys := slices.Sorted(maps.Keys(ex.GetEffective()))
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + "=" + ex.GetEffective()[k]
		}
		fmt.Fprintf(w, "  as read, defaults included: %s\n", strings.Join(parts, " "))
	}
	if len(tg.Warnings) > 0 {
		fmt.Fprintf(w, "\nSettings of this %s that change what KEDA does with these answers\n", tg.Kind)
		for _, warn := range tg.Warnings {
			fmt.Fprintf(w, "  ! %s\n", warn)
		}
	}

	if q := ex.GetQueue(); q != nil {
		fmt.Fprintf(w, "\nQueue %s/%s\n", q.GetNamespace(), q.GetQueue())
		switch {
		case q.GetFromConsumer():
			fmt.Fprintf(w, "  JetStream consumer: %d pending + %d ack pending = %d\n", q.GetWaiting(), q.GetInFlight(), q.GetBacklog())
		case q.GetStored() == nil:
			fmt.Fprintln(w, "  no report since the scaler started")
		default:
			live := 0
			for _, p := range q.GetProducers() {
				if !p.GetStopped() && !p.GetStale() {
					live++
				}
			}
			fmt.Fprintf(w, "  %d waiting + %d in flight = %d, summed over %d live producer%s, newest report stored %s (%s ago)%s\n",
				q.GetWaiting(), q.GetInFlight(), q.GetBacklog(), live, plural(live),
				q.GetStored().AsTime().UTC().Format(time.RFC3339), age(q.GetAge()), flagIf(q.GetStale(), ", NO LIVE PRODUCER"))
			for _, p := range q.GetProducers() {
				state := fmt.Sprintf("%d waiting + %d in flight", p.GetWaiting(), p.GetInFlight())
				switch {
				case p.GetStopped():
					state = "stopped"
				case p.GetStale():
					state += ", stale: left out"
				}
				if c := p.GetColdStartSeconds(); c > 0 {
					state += fmt.Sprintf(", measured cold start %.3g s", c)
				}
				fmt.Fprintf(w, "    producer %q: %s, %s ago\n", p.GetProducerId(), state, age(p.GetAge()))
			}
			if ex.GetEffective()["targetWait"] != "" {
				service := "unknown: no item seen to finish yet"
				if q.GetServiceSeconds() > 0 {
					service = fmt.Sprintf("%.3g s", q.GetServiceSeconds())
				}
				source := "estimated from differences between reports (a producer that does not measure)"
				switch m := int(q.GetMeasuringProducers()); {
				case m > 0 && m == live:
					source = "measured by its producers"
				case m > 0:
					source = fmt.Sprintf("measured by %d of %d live producers, estimated for the others from differences between reports", m, live)
				}
				dispersion := "unknown"
				if d := q.GetArrivalDispersion(); d > 0 {
					dispersion = fmt.Sprintf("%.3g", d)
				}
				trend := ""
				if g := q.GetArrivalTrend(); g != 0 {
					trend = fmt.Sprintf(", %+.3g/s a minute", 60*g)
				}
				if lw := q.GetLevelWindowSeconds(); lw > 0 {
					trend += fmt.Sprintf(", level %.3g/s over %s", q.GetArrivalLevel(), time.Duration(lw*float64(time.Second)).Round(time.Second))
				}
				fmt.Fprintf(w, "  arrivals %.3g/s (dispersion %s%s), service time %s: %s\n", q.GetArrivalRate(), dispersion, trend, service, source)
				if o := q.GetOldestWaitSeconds(); o > 0 {
					fmt.Fprintf(w, "  the oldest waiting item has waited %s\n", time.Duration(o*float64(time.Second)).Round(100*time.Millisecond))
				}
				fmt.Fprintf(w, "  cold start %s\n", q.GetColdStart().Describe())
			}
		}
	}

	if ex.GetEffective()["podSelector"] != "" {
		fmt.Fprintf(w, "\nGPUs of the pods podSelector %q selects (pods holding GPUs in the namespace: %d)\n", ex.GetEffective()["podSelector"], ex.GetNamespaceGpuPods())
		if len(ex.GetNodes()) == 0 {
			fmt.Fprintln(w, "  none")
		} else {
			tw = newTable(w)
			fmt.Fprintln(tw, "  NODE\tREPORTED\tSOURCE\tDEVICE\tPOD\tSHARE\tUTIL\tMEMORY\tNOTE")
			for _, n := range ex.GetNodes() {
				when := age(n.GetAge()) + " ago" + flagIf(n.GetStale(), " STALE")
				for _, g := range n.GetGpus() {
					for _, h := range g.GetHolds() {
						note := g.GetUnhealthy()
						if h.GetLabelsUnknown() {
							note = cmp.Or(note+"; ", "") + "labels unknown"
						}
						fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.GetNode(), when, n.GetSource(), g.GetDevice(), h.GetPod(),
							fnum(h.GetShare()), optPct(h.Util), optPct(h.Memory), note)
					}
				}
				for _, u := range n.GetUnattributed() {
					fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t\t\t\tunattributed: %s\n", n.GetNode(), when, n.GetSource(), u.GetDevice(), u.GetPod(), u.GetReason())
				}
			}
			tw.Flush()
		}
	}

	if c := ex.GetCapacity(); c != nil {
		per := strconv.Itoa(int(c.GetGpusPerReplica())) + " GPUs per replica"
		if c.GetProfile() != "" {
			per = "one " + c.GetProfile() + " slice per replica"
		}
		fmt.Fprintf(w, "\nCapacity on nodes matching nodeSelector %q, %s: %d replicas free, headroom %d\n",
			cmp.Or(c.GetNodeSelector(), "(every node)"), per, c.GetSlots(), c.GetHeadroom())
		if c.GetBacklog() > 0 || c.GetCapped() > 0 {
			from := "the items in flight over queueTarget"
			if c.GetJobsFromPods() {
				from = "the pods podSelector selects holding devices"
			}
			fmt.Fprintf(w, "Jobs running: %d (%s), less minReplicaCount %d\n", c.GetRunningJobs(), from, c.GetMinReplicaCount())
		}
		if len(c.GetNodes()) > 0 {
			tw = newTable(w)
			fmt.Fprintln(tw, "  NODE\tREPORTED\tFREE\tREPLICAS\tSCHEDULER")
			for _, n := range c.GetNodes() {
				sched := "places Jobs"
				switch {
				case n.GetUnplaceable() != "":
					sched = n.GetUnplaceable() + " (counted as full)"
				case n.GetSchedulingUnknown():
					sched = "unknown (counted)"
				}
				replicas := strconv.Itoa(int(n.GetSlots()))
				switch {
				case n.GetLimitedBy() != "":
					replicas += fmt.Sprintf(" (%s; free devices take %d)", n.GetLimitedBy(), n.GetGpuSlots())
				case n.GetResourcesUnknown():
					replicas += " (CPU and memory unknown)"
				}
				fmt.Fprintf(tw, "  %s\t%s ago%s\t%d\t%s\t%s\n", n.GetNode(), age(n.GetAge()), flagIf(n.GetStale(), " STALE (counted as full)"), n.GetFree(), replicas, sched)
			}
			tw.Flush()
		}
	}

	if len(ex.GetReasons()) > 0 {
		fmt.Fprintln(w, "\nWhy")
		for _, r := range ex.GetReasons() {
			fmt.Fprintf(w, "  - %s\n", r)
		}
	}
}

// table aligns columns as tabwriter does, without the padding it leaves after a last
// column that is empty.
type table struct {
	out io.Writer
	buf bytes.Buffer
	tw  *tabwriter.Writer
}

func newTable(w io.Writer) *table {
	t := &table{out: w}
	t.tw = tabwriter.NewWriter(&t.buf, 2, 4, 2, ' ', 0)
	return t
}

func (t *table) Write(p []byte) (int, error) { return t.tw.Write(p) }

func (t *table) Flush() {
	t.tw.Flush()
	for line := range strings.Lines(t.buf.String()) {
		fmt.Fprintln(t.out, strings.TrimRight(line, " \n"))
	}
	t.buf.Reset()
}

func fnum(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func optPct(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'f', 1, 64) + "%"
}

func age(d *durationpb.Duration) string {
	if d == nil {
		return "?"
	}
	return d.AsDuration().Round(100 * time.Millisecond).String()
}

func flagIf(b bool, s string) string {
	if b {
		return s
	}
	return ""
}

// plural is "s" unless n is 1.
func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
