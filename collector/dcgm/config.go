// Package dcgm is the collector's "dcgm" GPU source: it reads every GPU and MIG instance
// through DCGM field watches (go-dcgm, calling libdcgm: the embedded host engine or a
// standalone nv-hostengine), with NVML's help for what DCGM does not say (MIG device
// UUIDs, minor numbers, MIG profile names: collector/mig). lib.go is the only code that
// calls go-dcgm; collector/dcgmerr tells what kind of failure a DCGM error is. It needs
// cgo: built without it, New fails with an error wrapping sourceerr.ErrNoCgo (nocgo.go).
// It imports nothing of the collector's: a Source is a collector.Source by its methods
// alone.
package dcgm

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures the DCGM source. The zero value reads the embedded host engine
// every second.
type Config struct {
	// Addr is a standalone nv-hostengine's address (host:port or a unix socket path);
	// empty means DCGM's embedded host engine, inside this process.
	Addr string
	// Every is how often DCGM samples the fields it watches: the report interval.
	// Zero means 1 s.
	Every time.Duration
	// Rediscover is how often the source lists the GPUs and MIG instances again, to
	// follow a MIG re-layout (mig-parted); it also does so at once when the values say
	// an entity is gone. Zero means 30 s.
	Rediscover time.Duration
	// XIDHold is how long a device stays unhealthy after its last critical XID. Zero
	// means 5 min.
	XIDHold time.Duration
	// Log receives the source's outages, recoveries and refusals, each logged once;
	// nil discards them.
	Log *slog.Logger
	// Registerer receives the source's metrics
	// (gpuscaler_collector_dcgm_fields_unsupported); nil registers none.
	Registerer prometheus.Registerer
}
