package replay

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/gpuscaler/gpuscaler/cmd/gpuscaler/internal/traces"
)

// The trace formats Load reads, as --format names them.
const (
	FormatGenTD26  = "gentd26"
	FormatAzureLLM = "azure-llm"
	FormatMooncake = "mooncake"
	FormatOpenB    = "openb"
)

// LoadOptions say which part of a trace to replay and, for the formats that need a
// second file, where it is. The zero value replays the whole trace with the files
// beside it.
type LoadOptions struct {
	// Nodes is openb's node list; empty: openb-gpu-nodes.csv beside the trace.
	Nodes string
	// LoadLatency is the model load latencies in ms (GenTD26's basemodel load latency)
	// that the inference formats draw from; empty: gentd26-basemodel-load-latency-ms.csv
	// beside the trace.
	LoadLatency string
	// From and To keep what arrived within [From, To) of the trace's first request or
	// task; To 0: to the end.
	From, To time.Duration
	// Limit keeps the first Limit requests of what From and To keep (openb: passed on
	// as OpenBConfig.Limit); 0: all.
	Limit int
	// Speed is the LLM formats' service model speed factor (LLMServiceModel.Service).
	Speed float64
	// Seed draws the model loads and the clocks' phases.
	Seed uint64
	// LoadScale multiplies every model load drawn (0: 1), to ask what a slower load
	// (a larger model, a colder node) would do to the same traffic.
	LoadScale float64
	// Reverse plays the inference formats' requests backwards in time (see
	// Scenario.Reverse).
	Reverse bool
	// HPATolerance, where not nil, is the modelled HPA's tolerance both ways, which the
	// inference formats' queue-demand triggers repeat (Scenario.SetHPATolerance); nil:
	// the HPA's default.
	HPATolerance *float64
}

// Trace is a trace loaded for replay: for gentd26 and azure-llm a Scenario for
// inference.Run, for openb the tasks and nodes for OpenB.
type Trace struct {
	Format   string
	Scenario *Scenario
	Pods     []traces.OpenBPod
	Nodes    []traces.OpenBNode
}

// Load reads the trace at path in format (FormatGenTD26, FormatAzureLLM,
// FormatMooncake or FormatOpenB), keeps the part opt selects and, for the inference formats, builds
// its scenario. Its errors name the file, and the flag of a file not given.
func Load(format, path string, opt LoadOptions) (*Trace, error) {
	switch format {
	case FormatOpenB:
		return loadOpenB(path, opt)
	case FormatGenTD26:
		reqs, err := readRequests(path, traces.ReadGenTD26, func(r traces.GenTD26Request) time.Time { return r.At }, opt)
		if err != nil {
			return nil, err
		}
		return scenarioTrace(format, path, opt, func(load *traces.Durations) (*Scenario, error) {
			return GenTD26(head(reqs, opt.Limit), load, opt.Seed)
		})
	case FormatAzureLLM:
		reqs, err := readRequests(path, traces.ReadAzureLLM, func(r traces.AzureLLMRequest) time.Time { return r.At }, opt)
		if err != nil {
			return nil, err
		}
		return scenarioTrace(format, path, opt, func(load *traces.Durations) (*Scenario, error) {
			return AzureLLM(head(reqs, opt.Limit), DefaultLLMServiceModel, opt.Speed, load, opt.Seed)
		})
	case FormatMooncake:
		reqs, err := readRequests(path, traces.ReadMooncake, func(r traces.MooncakeRequest) time.Time { return time.Time{}.Add(r.At) }, opt)
		if err != nil {
			return nil, err
		}
		return scenarioTrace(format, path, opt, func(load *traces.Durations) (*Scenario, error) {
			return Mooncake(head(reqs, opt.Limit), DefaultLLMServiceModel, opt.Speed, load, opt.Seed)
		})
	}
	return nil, fmt.Errorf("--format %q: want gentd26, azure-llm, mooncake or openb", format)
}

// loadOpenB reads openb's tasks at path, keeps those created within opt's window, and
// reads the node list.
func loadOpenB(path string, opt LoadOptions) (*Trace, error) {
	pods, err := readTrace(path, traces.ReadOpenBPods)
	if err != nil {
		return nil, err
	}
	lo, hi := window(len(pods), func(i int) time.Duration { return pods[i].Created }, opt.From, opt.To)
	if pods = pods[lo:hi]; len(pods) == 0 {
		return nil, fmt.Errorf("no task created within --from %s --to %s", opt.From, opt.To)
	}
	nodesPath, nodesFlag := opt.Nodes, "--nodes"
	if nodesPath == "" {
		nodesPath = filepath.Join(filepath.Dir(path), "openb-gpu-nodes.csv")
		nodesFlag += " (not given: the file beside --trace)"
	}
	nodes, err := readTrace(nodesPath, traces.ReadOpenBNodes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", nodesFlag, err)
	}
	return &Trace{Format: FormatOpenB, Pods: pods, Nodes: nodes}, nil
}

// readRequests reads the requests at path with read and keeps those that arrived
// within opt's window, at times from the first request's.
func readRequests[T any](path string, read func(io.Reader) ([]T, error), at func(T) time.Time, opt LoadOptions) ([]T, error) {
	reqs, err := readTrace(path, read)
	if err != nil {
		return nil, err
	}
	lo, hi := window(len(reqs), func(i int) time.Duration { return at(reqs[i]).Sub(at(reqs[0])) }, opt.From, opt.To)
	if reqs = reqs[lo:hi]; len(reqs) == 0 {
		return nil, fmt.Errorf("no request arrived within --from %s --to %s", opt.From, opt.To)
	}
	return reqs, nil
}

// scenarioTrace reads the model load latencies for trace and builds its scenario on
// them.
func scenarioTrace(format, trace string, opt LoadOptions, build func(load *traces.Durations) (*Scenario, error)) (*Trace, error) {
	load, err := loadLatency(trace, opt)
	if err != nil {
		return nil, err
	}
	sc, err := build(load)
	if err != nil {
		return nil, err
	}
	if opt.Reverse {
		sc.Reverse()
	}
	if opt.HPATolerance != nil {
		sc.SetHPATolerance(*opt.HPATolerance)
	}
	return &Trace{Format: format, Scenario: sc}, nil
}

// loadLatency reads the model load latencies the inference formats draw from.
func loadLatency(trace string, opt LoadOptions) (*traces.Durations, error) {
	path, flag := opt.LoadLatency, "--load-latency"
	if path == "" {
		path = filepath.Join(filepath.Dir(trace), "gentd26-basemodel-load-latency-ms.csv")
		flag += " (not given: the file beside --trace)"
	}
	loads, err := readTrace(path, traces.ReadLoadLatency)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if opt.LoadScale > 0 && opt.LoadScale != 1 {
		for i := range loads {
			loads[i] = time.Duration(float64(loads[i]) * opt.LoadScale)
		}
	}
	load, err := traces.NewDurations(loads)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return load, nil
}

// window returns the indexes [lo, hi) of the n items, in order of their offsets at(i)
// from the trace's start, that fall within [from, to); to 0: to the end.
func window(n int, at func(i int) time.Duration, from, to time.Duration) (lo, hi int) {
	lo, hi = n, n
	for i := range n {
		if at(i) >= from && lo == n {
			lo = i
		}
		if to != 0 && at(i) >= to {
			hi = i
			break
		}
	}
	return lo, max(lo, hi)
}

// readTrace opens path and reads it with read, naming the file in any error.
func readTrace[T any](path string, read func(io.Reader) ([]T, error)) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out, err := read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// head returns the first n of s, or all of s when n is 0.
func head[T any](s []T, n int) []T {
	if n > 0 && n < len(s) {
		return s[:n]
	}
	return s
}
