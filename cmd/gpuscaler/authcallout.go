package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/gpuscaler/gpuscaler/authcallout"
	"github.com/gpuscaler/gpuscaler/internal/natsconn"
)

const authCalloutAbout = `
NATS auth callout: decides who may do what on the bus. The NATS server sends it every
connecting client's credentials (auth_callout in its configuration, with this service's
user among auth_users); it answers with a NATS user, valid until the client's credential
expires and at most --user-max-ttl, whose permissions follow from the identity alone:

  producer   a ServiceAccount matching --producer-identities, in namespace <ns>:
             publish gpuscaler.v1.queue.<ns>.*.*, subscribe _INBOX.gpuscaler.<ns>.> (acks)
  collector  --collector-identities: publish gpuscaler.v1.node.<node>, the node its token
             is bound to as the Kubernetes API reports it, never what the client says
  scaler     --scaler-identities: read everything; the JetStream API of stream GPUSCALER
             and read-only info of other streams and consumers

A producer of a namespace in --jetstream-namespaces joins that namespace's own account
instead, where it may publish and subscribe anything, JetStream included: the account
reaches others only through its own queue subjects and the consumer info the scaler reads.

Clients send a projected ServiceAccount token (audience --audience) as their NATS token
(--nats-token-file); the callout reviews it with the TokenReview API (RBAC:
system:auth-delegator). Clients outside the cluster log in with a user and password from
--static-users. Everything else is refused, with the reason in the client's error, this
service's log and gpuscaler_auth_callout_decisions_total.

Subcommands:
  gpuscaler auth-callout issuer-key --issuer-seed-file FILE [--out FILE]
      print the issuer's public key, the NATS server's auth_callout.issuer
  gpuscaler auth-callout hash-password
      read a password on stdin and print its bcrypt hash, for --static-users
  gpuscaler auth-callout nats-config [--jetstream-namespaces NS,...]
      print the accounts and auth_callout configuration a nats-server needs for it`

func runAuthCallout(ctx context.Context, args []string, env envFunc, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "issuer-key":
			return runIssuerKey(args[1:], env, stdout)
		case "hash-password":
			return runHashPassword(args[1:], env, os.Stdin, stdout)
		case "nats-config":
			return runNATSConfig(args[1:], env, stdout)
		}
	}
	natsOpts := natsconn.Options{URLs: natsconn.DefaultURL}
	var (
		cfg             authcallout.Config
		seedFile, users string
		kubeconfig      string
		httpAddr        string
		issuerConfigMap string
	)
	fs := newFlagSet("auth-callout", "auth-callout [flags] | issuer-key | hash-password", authCalloutAbout, stdout)
	fs.StringVar(&seedFile, "issuer-seed-file", "", "secret the issued users are signed with: an NKey account seed (SA…), or a random secret of at least 32 bytes the key is derived from (required)")
	fs.StringVar(&cfg.Accounts.Scaler, "scaler-account", authcallout.DefaultAccounts.Scaler, "NATS account scalers join: it holds the GPUSCALER stream and exports the report subjects")
	fs.StringVar(&cfg.Accounts.Collector, "collector-account", authcallout.DefaultAccounts.Collector, "NATS account collectors join: it imports the node report subjects from the scaler's")
	fs.StringVar(&cfg.Accounts.Producer, "producer-account", authcallout.DefaultAccounts.Producer, "NATS account producers join: it imports the queue report subjects from the scaler's")
	fs.Var((*namespaceList)(&cfg.Accounts.JetStreamNamespaces), "jetstream-namespaces", jetStreamNamespacesHelp+": their producers join that account, where they may do anything")
	fs.StringVar(&cfg.Audience, "audience", authcallout.DefaultAudience, "audience the ServiceAccount tokens must carry (the projected volume's serviceAccountToken.audience)")
	fs.StringVar(&cfg.Scalers, "scaler-identities", "", "ServiceAccounts that are scalers: comma-separated namespace/name")
	fs.StringVar(&cfg.Collectors, "collector-identities", "", "ServiceAccounts that are collectors: comma-separated namespace/name")
	fs.StringVar(&cfg.Producers, "producer-identities", "*/*", `ServiceAccounts that produce queue reports, each for its own namespace: comma-separated namespace/name, "*" matching a whole part`)
	fs.StringVar(&users, "static-users", "", "YAML file of clients outside the cluster: users: [{user, passwordHash (bcrypt), role, namespace (producer) | node (collector)}]")
	fs.DurationVar(&cfg.MaxTTL, "user-max-ttl", authcallout.DefaultMaxTTL, "longest an issued NATS user lives; it never outlives the token it was issued for")
	fs.BoolVar(&cfg.PodLookup, "pod-lookup", false, "when a collector's token carries no node claim (Kubernetes before 1.30), read the node from the pod it is bound to (needs get on pods)")
	fs.StringVar(&issuerConfigMap, "issuer-key-configmap", "", "namespace/name of a ConfigMap to write the issuer's public key to at start (key "+authcallout.IssuerKeyName+"; needs patch on it), for NATS servers to read without the seed")
	fs.StringVar(&kubeconfig, "kubeconfig", "", `kubeconfig for the TokenReview API; empty uses the in-cluster config, "none" admits static users only`)
	fs.StringVar(&httpAddr, "http-addr", ":8082", `address of /metrics, /healthz and /readyz; "-" turns HTTP off`)
	natsFlags(fs, &natsOpts, "comma-separated NATS URLs; log in as one of the server's auth_callout auth_users")
	newLogger := logFlags(fs, stderr, "info")
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	log, err := newLogger()
	if err != nil {
		return err
	}
	if seedFile == "" {
		return usageError{errors.New("--issuer-seed-file is required: the key the issued users are signed with")}
	}
	if cfg.MaxTTL <= 0 {
		return usageError{fmt.Errorf("--user-max-ttl %s: want a positive duration", cfg.MaxTTL)}
	}
	if cfg.Issuer, err = authcallout.LoadIssuer(seedFile); err != nil {
		return err
	}
	if users != "" {
		if cfg.StaticUsers, err = authcallout.LoadStaticUsers(users); err != nil {
			return err
		}
	}
	if kubeconfig != "none" {
		if cfg.Kube, err = authcallout.NewKube(kubeconfig); err != nil {
			return err
		}
	}
	if issuerConfigMap != "" {
		if kubeconfig == "none" {
			return usageError{errors.New("--issuer-key-configmap needs the Kubernetes API: not with --kubeconfig none")}
		}
		// Before connecting: the NATS servers start only once they can read the key.
		pub, err := cfg.Issuer.PublicKey()
		if err != nil {
			return err
		}
		if err := authcallout.PublishIssuerKey(ctx, kubeconfig, issuerConfigMap, pub); err != nil {
			return err
		}
		log.Info("published the issuer's public key", "configMap", issuerConfigMap, "key", authcallout.IssuerKeyName)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Log, cfg.Registry = log.With("component", "auth-callout"), reg
	svc, err := authcallout.New(cfg)
	if err != nil {
		return err
	}
	log.Info("auth callout", "issuer", svc.IssuerPublicKey(), "accounts", cfg.Accounts, "audience", cfg.Audience,
		"scalers", cfg.Scalers, "collectors", cfg.Collectors, "producers", cfg.Producers, "staticUsers", len(cfg.StaticUsers),
		"kubernetes", cfg.Kube != nil)

	natsOpts.Name = "gpuscaler-auth-callout"
	natsOpts.Log = log.With("component", "nats")
	natsOpts.RetryInitialConnect = true
	nc, err := natsconn.Connect(ctx, natsOpts)
	if err != nil {
		return err
	}
	defer nc.Close()

	g, ctx := errgroup.WithContext(ctx)
	err = serveMetricsAndProbes(ctx, g, httpAddr, reg, log, func() error {
		if err := nc.Problem(); err != nil {
			return err
		}
		select {
		case <-svc.Ready():
			return nil
		default:
			return errors.New("not yet subscribed to authorization requests")
		}
	}, nil)
	if err != nil {
		return err
	}
	g.Go(func() error { return svc.Run(ctx, nc.Conn) })
	return g.Wait()
}

// runIssuerKey prints, or writes to --out, the public key of --issuer-seed-file.
func runIssuerKey(args []string, env envFunc, stdout io.Writer) error {
	var seedFile, out string
	fs := newFlagSet("auth-callout issuer-key", "auth-callout issuer-key --issuer-seed-file FILE [--out FILE]",
		"Prints the public account key of the issuer seed: what the NATS server's auth_callout.issuer must be.", stdout)
	fs.StringVar(&seedFile, "issuer-seed-file", "", "the auth callout's --issuer-seed-file (required)")
	fs.StringVar(&out, "out", "", "write the key to this file instead of stdout")
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	if seedFile == "" {
		return usageError{errors.New("--issuer-seed-file is required")}
	}
	kp, err := authcallout.LoadIssuer(seedFile)
	if err != nil {
		return err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return err
	}
	if out == "" {
		_, err = fmt.Fprintln(stdout, pub)
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(out, []byte(pub+"\n"), 0o644)
}

// runNATSConfig prints the configuration a NATS server needs for the callout, with
// the issuer's public key and the callout's password as variables: what the chart's
// bundled NATS runs, and what your own servers need.
func runNATSConfig(args []string, env envFunc, stdout io.Writer) error {
	var accounts authcallout.Accounts
	fs := newFlagSet("auth-callout nats-config", "auth-callout nats-config [--jetstream-namespaces NS,...]",
		`Prints the accounts and auth_callout blocks of a nats-server configuration for the callout
with its default accounts and limits: $CALLOUT_ISSUER is the issuer's public key (issuer-key
prints it), $CALLOUT_PASSWORD the callout's password; nats-server reads both from its
environment.`, stdout)
	fs.Var((*namespaceList)(&accounts.JetStreamNamespaces), "jetstream-namespaces", jetStreamNamespacesHelp)
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	_, err := io.WriteString(stdout, authcallout.NATSConfig{Issuer: "$CALLOUT_ISSUER", CalloutPassword: "$CALLOUT_PASSWORD", Accounts: accounts}.String())
	return err
}

// runHashPassword prints the bcrypt hash of the password on stdin.
func runHashPassword(args []string, env envFunc, stdin io.Reader, stdout io.Writer) error {
	fs := newFlagSet("auth-callout hash-password", "auth-callout hash-password < password",
		"Reads a password on stdin (one line) and prints its bcrypt hash, for the passwordHash of a --static-users entry.", stdout)
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	hash, err := authcallout.HashPassword(stdin)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, hash)
	return err
}
