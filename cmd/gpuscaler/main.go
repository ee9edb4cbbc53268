// Command gpuscaler is gpuscaler's one binary. Each subcommand wires packages together and
// runs them; main is the only place that exits the process.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, env envFunc, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"scaler", "run the KEDA external scaler (with an embedded NATS server unless --nats-url is given)", runScaler},
		{"collector", "read this node's GPUs and pods, and publish a NodeReport every interval", runCollector},
		{"demo", "run everything on this machine with simulated GPUs and print a live timeline", runDemo},
		{"explain", "ask a running scaler what it answers KEDA for a trigger, and why", runExplain},
		{"gateway", "the front door for HTTP inference services: hold requests while a route's backend has no ready replica, forward and count them as a queue producer", runGateway},
		{"publish", "publish one QueueReport or NodeReport, for operators and tests", runPublish},
		{"auth-callout", "admit NATS clients by their Kubernetes ServiceAccount token (a NATS auth callout), each only for its own namespace or node", runAuthCallout},
		{"replay", "replay a real production trace through the scaler's decisions on a virtual clock: GPU-hours and waits of each policy", runReplay},
		{"bench", "measure activation latency, GetMetrics latency, NodeReport throughput and memory", runBench},
		{"version", "print the version", runVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches to a subcommand and returns the exit code: 0 on success, 2 for a usage
// error, 1 for any other failure.
func run(ctx context.Context, args []string, env envFunc, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		w := stdout
		if len(args) == 0 {
			w = stderr
		}
		printMainUsage(w)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], env, stdout, stderr)
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return 0
		case errors.As(err, new(usageError)):
			fmt.Fprintf(stderr, "gpuscaler %s: %v\nRun 'gpuscaler %s --help' for usage.\n", c.name, err, c.name)
			return 2
		default:
			fmt.Fprintf(stderr, "gpuscaler %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "gpuscaler: unknown command %q\n\n", args[0])
	printMainUsage(stderr)
	return 2
}

func printMainUsage(w io.Writer) {
	fmt.Fprint(w, `gpuscaler scales GPU workloads on Kubernetes on what their GPUs and queues are doing now:
a KEDA external scaler fed over NATS by GPU node collectors and queue producers.

Usage: gpuscaler <command> [flags]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Run 'gpuscaler <command> --help' for a command's flags. Every flag can also be set from
the environment as GPUSCALER_<FLAG> (--grpc-addr is GPUSCALER_GRPC_ADDR); flags win.
`)
}
