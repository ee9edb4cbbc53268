package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuscaler/gpuscaler/internal/natsconn"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

const publishAbout = `
Publishes one report to NATS and waits until its stream has stored it (GPUSCALER_QUEUES
for a queue's, GPUSCALER for a node's):

  gpuscaler publish queue --namespace NS --queue Q --waiting N [--in-flight N] [--producer-id P]
      a QueueReport on gpuscaler.v1.queue.<NS>.<Q>.<P>: producer P's share of the queue,
      which the scaler adds to the other live producers'; --stopped takes P's share out
  gpuscaler publish node --file report.json
      a NodeReport written as protobuf JSON (field names as in events.proto), "-" for stdin

observed_at is set to now when the report gives none. A scaler must have created the
stream first (any running 'gpuscaler scaler' against the same NATS has).

Examples:
  gpuscaler publish queue --namespace default --queue demo --waiting 3
  gpuscaler publish queue --namespace ml --queue jobs --waiting 40 --in-flight 8 \
      --nats-url tls://nats.example:4222 --nats-tls-ca ca.pem --nats-token-file token
  gpuscaler publish node --file report.json`

// publishArgs are the flags of publish queue and publish node, with their defaults.
type publishArgs struct {
	natsOpts                            natsconn.Options
	timeout                             time.Duration
	q                                   gpuscalerv1.QueueReport
	waitingSet                          bool
	file                                string
	waiting, inFlight, arrived, dropped uint64
}

func newPublishArgs() *publishArgs {
	return &publishArgs{natsOpts: natsconn.Options{URLs: natsconn.DefaultURL, Name: "gpuscaler-publish"}, timeout: 5 * time.Second}
}

// common adds the flags both kinds take.
func (a *publishArgs) common(fs *flag.FlagSet) {
	natsFlags(fs, &a.natsOpts, "comma-separated NATS URLs")
	fs.DurationVar(&a.timeout, "timeout", a.timeout, "how long to wait for NATS to store the report")
}

// queue adds the flags of publish queue.
func (a *publishArgs) queue(fs *flag.FlagSet) {
	fs.StringVar(&a.q.Namespace, "namespace", "", "the queue's Kubernetes namespace (required)")
	fs.StringVar(&a.q.Queue, "queue", "", "the queue's name (required)")
	fs.Func("waiting", "`count` of items queued and not yet started (required)", func(s string) error {
		a.waitingSet = true
		return parseUint(s, &a.waiting)
	})
	fs.Uint64Var(&a.inFlight, "in-flight", 0, "items started and not yet finished")
	fs.Uint64Var(&a.arrived, "arrivals", 0, "items enqueued since the previous report")
	fs.Uint64Var(&a.dropped, "dropped", 0, "items that left the queue unserved since the previous report (timed out, cancelled)")
	fs.StringVar(&a.q.ProducerId, "producer-id", "gpuscaler-publish", "identifies the publisher: the queue reads the sum of its producers' shares, one per id (a NATS subject token)")
	fs.BoolVar(&a.q.Stopped, "stopped", false, "this producer stopped: its share leaves the queue at once")
}

// node adds the flags of publish node.
func (a *publishArgs) node(fs *flag.FlagSet) {
	fs.StringVar(&a.file, "file", "", `NodeReport as protobuf JSON; "-" reads stdin (required)`)
}

// printPublishHelp prints what publish does, and the flags of both kinds: every error
// of publish points here.
func printPublishHelp(w io.Writer) {
	fmt.Fprintf(w, "Usage: gpuscaler publish queue|node [flags]\n\n%s\n", strings.TrimSpace(publishAbout))
	a := newPublishArgs()
	for _, part := range []struct {
		heading string
		add     func(*flag.FlagSet)
	}{
		{"Flags of publish queue and publish node (each also read from its environment variable; a flag given on the command line wins)", a.common},
		{"Flags of publish queue", a.queue},
		{"Flags of publish node", a.node},
	} {
		fs := flag.NewFlagSet("publish", flag.ContinueOnError)
		part.add(fs)
		fmt.Fprintf(w, "\n%s:\n", part.heading)
		printFlags(w, fs)
	}
}

func runPublish(ctx context.Context, args []string, env envFunc, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "queue" && args[0] != "node") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			printPublishHelp(stdout)
			return flag.ErrHelp
		}
		return usageError{errors.New("want 'publish queue' or 'publish node'")}
	}
	kind := args[0]
	a := newPublishArgs()
	fs := newFlagSet("publish "+kind, "publish "+kind+" [flags]", publishAbout, stdout)
	a.common(fs)
	switch kind {
	case "queue":
		a.queue(fs)
	case "node":
		a.node(fs)
	}
	if err := parseFlags(fs, args[1:], env); err != nil {
		return err
	}
	if err := positive("timeout", a.timeout, "a positive duration"); err != nil {
		return err
	}
	natsOpts, timeout, file := a.natsOpts, a.timeout, a.file
	q := &a.q

	var (
		subject string
		stream  = gpuscalerv1.StreamName
		msg     proto.Message
		err     error
	)
	switch kind {
	case "queue":
		if q.Namespace == "" || q.Queue == "" || !a.waitingSet {
			return usageError{errors.New("--namespace, --queue and --waiting are required")}
		}
		q.Waiting, q.InFlight, q.Arrivals, q.Dropped, q.Sequence = a.waiting, a.inFlight, a.arrived, a.dropped, 1
		q.ObservedAt = timestamppb.Now()
		if subject, err = gpuscalerv1.QueueSubject(q.Namespace, q.Queue, q.ProducerId); err != nil {
			return usageError{err}
		}
		if err := q.Validate(); err != nil {
			return usageError{err}
		}
		msg, stream = q, gpuscalerv1.QueueStreamName
		// The stream's ack comes back below the namespace's own inbox prefix, the only
		// replies a producer may read where the bus enforces tenancy.
		natsOpts.InboxPrefix = gpuscalerv1.InboxPrefix(q.Namespace)
	case "node":
		r, err := readNodeReport(file, os.Stdin)
		if err != nil {
			return err
		}
		if subject, err = gpuscalerv1.NodeSubject(r.GetNode()); err != nil {
			return err
		}
		msg = r
	}
	data, err := proto.Marshal(msg)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	nc, err := natsconn.Connect(ctx, natsOpts)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc.Conn)
	if err != nil {
		return err
	}
	ack, err := publishStored(ctx, js, subject, data)
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		return fmt.Errorf("publish to %s: no JetStream stream stored it within --timeout %s: either stream %s does not exist "+
			"(start 'gpuscaler scaler' against this NATS first: it creates the stream), or a NATS cluster lost the stream's leader "+
			"and has not elected another yet (try again, or give a longer --timeout): %w",
			subject, timeout, stream, err)
	}
	if last := nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) {
		// The server refused the publish itself (or the ack's inbox); without this the
		// user would see only a timeout.
		return fmt.Errorf("publish to %s: NATS refused it: %w; an identity may publish only its own namespace's queues (gpuscaler.v1.queue.<its namespace>.<queue>.<producer>) or its own node's reports", subject, last)
	}
	if err != nil {
		return fmt.Errorf("publish to %s: %w", subject, nc.Explain(err))
	}
	fmt.Fprintf(stdout, "published to %s (stream %s, sequence %d)\n", subject, ack.Stream, ack.Sequence)
	return nil
}

// publishStored publishes data until a stream acknowledges it, ctx ends or NATS refuses it.
// A stream that lost its leader (a NATS cluster electing another after losing a server)
// answers nobody for a few seconds: the report must not be lost to that. No answer at
// all until ctx ends is jetstream.ErrNoStreamResponse.
func publishStored(ctx context.Context, js jetstream.JetStream, subject string, data []byte) (*jetstream.PubAck, error) {
	for {
		ack, err := js.Publish(ctx, subject, data, jetstream.WithRetryAttempts(0))
		if !errors.Is(err, jetstream.ErrNoStreamResponse) {
			return ack, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readNodeReport reads a NodeReport written as protobuf JSON from file ("-" for stdin)
// and checks it against the contract.
func readNodeReport(file string, stdin io.Reader) (*gpuscalerv1.NodeReport, error) {
	var (
		data []byte
		err  error
	)
	switch file {
	case "":
		return nil, usageError{errors.New("--file is required")}
	case "-":
		data, err = io.ReadAll(stdin)
	default:
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, err
	}
	r, err := gpuscalerv1.NodeReportFromJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return r, nil
}

func parseUint(s string, dst *uint64) error {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return errors.New("want a whole number, 0 or more")
	}
	*dst = v
	return nil
}
