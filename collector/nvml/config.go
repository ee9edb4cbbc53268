// Package nvml is the collector's "nvml" GPU source, for nodes without DCGM: it reads
// every GPU and MIG device through NVML (go-nvml, calling the driver's
// libnvidia-ml.so.1), follows their XID errors, and measures each pod's share of a
// shared GPU from NVML's per-process samples, finding each process's pod through its
// cgroup (collector/kubelet/cgroup). It needs cgo: built without it, New fails with an
// error wrapping sourceerr.ErrNoCgo (nocgo.go). It imports nothing of the collector's:
// a Source is a collector.Source and PodUsageSource by its methods alone.
package nvml

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultXIDHold is how long a critical XID keeps a device unhealthy after the last
// one, unless Config.XIDHold says otherwise.
//
// NVIDIA's device plugin marks a device unhealthy on a critical XID and keeps it so
// until it restarts; NVIDIA's XID catalogue asks for a GPU reset or a reboot after
// most of them. A device that did recover is not worth a flapping report: five minutes
// covers the device plugin's own reaction and a drain, and a device that keeps
// failing keeps raising XIDs and stays unhealthy. A GPU that is lost (XID 79) stays
// unhealthy for as long as NVML cannot read it, whatever the hold.
const DefaultXIDHold = 5 * time.Minute

// Config configures the NVML source. The zero value works: host processes are
// read under /proc, critical XIDs hold for DefaultXIDHold, nothing is logged and
// no metric is registered.
type Config struct {
	// ProcRoot is where the host's /proc is seen, to find the pod of each process NVML
	// samples (PodUsage): NVML reports host PIDs. "" means /proc, which is the host's
	// only when the collector's pod runs with hostPID: true; otherwise mount the host's
	// /proc (a hostPath volume) and name the mount here, e.g. /host/proc.
	ProcRoot string
	// XIDHold is how long a critical XID keeps a device unhealthy after the last one;
	// 0 means DefaultXIDHold.
	XIDHold time.Duration
	// Log receives what the source wants an operator to know (a GPU lost or back, a
	// process whose pod cannot be found); nil discards it.
	Log *slog.Logger
	// Registerer registers the source's metrics, gpuscaler_collector_nvml_*; nil
	// registers none.
	Registerer prometheus.Registerer
}
