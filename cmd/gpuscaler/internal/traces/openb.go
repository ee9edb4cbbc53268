package traces

import (
	"cmp"
	"io"
	"slices"
	"strings"
	"time"
)

// Alibaba's openb trace (alibaba/clusterdata, cluster-trace-gpu-v2023; Weng et al., "Beware
// of Fragmentation", USENIX ATC 2023): the tasks submitted to a production GPU cluster
// (openb_pod_list_*.csv) and the cluster's nodes (openb_node_list_*.csv).
//
// Times are whole seconds since the trace's start. The upstream README
// (cluster-trace-gpu-v2023/README.md) says so for each column: "creation_time: Timestamp
// of creation (in seconds)", and likewise for deletion_time and scheduled_time. The data
// agree: the default pod list runs to 12,902,960, which in seconds is the 149 days the
// paper's trace covers, and in milliseconds would be 3.6 hours.

// OpenBPod is one task of an openb pod list (columns name, cpu_milli, memory_mib, num_gpu,
// gpu_milli, gpu_spec, qos, pod_phase, creation_time, deletion_time, scheduled_time; the
// reader uses those it names below). Times are since the trace's start.
type OpenBPod struct {
	Name string
	// NumGPU is the GPUs the task requests, 0 to 8; 0 is a CPU-only task.
	NumGPU int
	// GPUMilli is the share of each GPU the task uses, in thousandths: 1000 is a whole GPU.
	// It is 0 for a CPU-only task and 1 to 1000 otherwise; below 1000 only with NumGPU 1
	// (GPU sharing), as the upstream README says.
	GPUMilli int
	// GPUSpec is the GPU models the task may run on, as the file writes them
	// ("V100M16|V100M32"; see GPUModels); empty when any model will do, which the file
	// writes as an empty cell or "nan".
	GPUSpec string
	// Phase is the task's pod_phase when the trace ended: Succeeded, Running, Pending or
	// Failed.
	Phase string
	// Created is creation_time. Scheduled is scheduled_time, when the task was bound to a
	// node, valid when HasScheduled; the file leaves it empty for a task never scheduled
	// (in the default list, exactly those in phase Pending). Deleted is deletion_time; a
	// task still running when the trace ended has the trace's end there.
	Created      time.Duration
	Scheduled    time.Duration
	Deleted      time.Duration
	HasScheduled bool
}

// GPUModels returns the models of GPUSpec, sorted and without repeats (the files hold
// specs such as "V100M16|V100M32|V100M32"); nil when any model will do.
func (p OpenBPod) GPUModels() []string {
	if p.GPUSpec == "" {
		return nil
	}
	models := strings.Split(p.GPUSpec, "|")
	slices.Sort(models)
	return slices.Compact(models)
}

// RunTime is how long the task ran: from being scheduled to its deletion. It is false
// for a task never scheduled.
func (p OpenBPod) RunTime() (time.Duration, bool) {
	if !p.HasScheduled {
		return 0, false
	}
	return p.Deleted - p.Scheduled, true
}

// OpenBPhases are the pod phases an openb pod list holds.
var OpenBPhases = []string{"Succeeded", "Running", "Pending", "Failed"}

const (
	openBMaxTaskGPUs = 8             // "num_gpu: ... (integers from 0 to 8)", upstream README
	openBMaxNodeGPUs = 64            // far above the 8 of any node in the trace
	openBMaxSeconds  = 1_000_000_000 // about 31 years: far beyond any trace, far from overflow
)

// ReadOpenBPods reads an openb pod list (openb_pod_list_default.csv and its siblings that
// carry the time columns), sorted by Created; tasks created at the same time keep the
// file's order. An error names the line, the column and the value.
func ReadOpenBPods(r io.Reader) ([]OpenBPod, error) {
	t, err := newTable(r, "openb pod list", "name", "num_gpu", "gpu_milli", "gpu_spec", "pod_phase",
		"creation_time", "deletion_time", "scheduled_time")
	if err != nil {
		return nil, err
	}
	pods, err := readRows(t, func(row row) (OpenBPod, bool, error) {
		p, err := openBPod(row)
		return p, true, err
	})
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(pods, func(a, b OpenBPod) int { return cmp.Compare(a.Created, b.Created) })
	return pods, nil
}

func openBPod(row row) (OpenBPod, error) {
	p := OpenBPod{Name: row.str("name")}
	if p.Name == "" {
		return p, row.errorf("name", "empty: want the task's name")
	}
	n, err := row.int("num_gpu", 0, openBMaxTaskGPUs)
	if err != nil {
		return p, err
	}
	p.NumGPU = int(n)
	milli, err := row.int("gpu_milli", 0, 1000)
	if err != nil {
		return p, err
	}
	p.GPUMilli = int(milli)
	switch {
	case p.NumGPU == 0 && p.GPUMilli != 0:
		return p, row.errorf("gpu_milli", "%q with num_gpu 0: want 0, a CPU-only task uses no GPU", row.str("gpu_milli"))
	case p.NumGPU > 0 && p.GPUMilli == 0:
		return p, row.errorf("gpu_milli", "%q with num_gpu %d: want 1 to 1000, the share of each GPU", row.str("gpu_milli"), p.NumGPU)
	case p.NumGPU > 1 && p.GPUMilli != 1000:
		return p, row.errorf("gpu_milli", "%q with num_gpu %d: want 1000, only a one-GPU task shares its GPU", row.str("gpu_milli"), p.NumGPU)
	}
	if p.GPUSpec, err = openBSpec(row); err != nil {
		return p, err
	}
	p.Phase = row.str("pod_phase")
	if !slices.Contains(OpenBPhases, p.Phase) {
		return p, row.errorf("pod_phase", "%q: want one of %s", p.Phase, strings.Join(OpenBPhases, ", "))
	}
	if p.Created, err = openBSeconds(row, "creation_time"); err != nil {
		return p, err
	}
	if p.Deleted, err = openBSeconds(row, "deletion_time"); err != nil {
		return p, err
	}
	if p.Deleted < p.Created {
		return p, row.errorf("deletion_time", "%q: before creation_time %s", row.str("deletion_time"), row.str("creation_time"))
	}
	if row.str("scheduled_time") != "" {
		if p.Scheduled, err = openBSeconds(row, "scheduled_time"); err != nil {
			return p, err
		}
		p.HasScheduled = true
		switch {
		case p.Scheduled < p.Created:
			return p, row.errorf("scheduled_time", "%q: before creation_time %s", row.str("scheduled_time"), row.str("creation_time"))
		case p.Scheduled > p.Deleted:
			return p, row.errorf("scheduled_time", "%q: after deletion_time %s", row.str("scheduled_time"), row.str("deletion_time"))
		}
	}
	return p, nil
}

// openBSpec reads gpu_spec: empty or "nan" (pandas' missing value) for no constraint, else
// GPU models separated by "|".
func openBSpec(row row) (string, error) {
	v := row.str("gpu_spec")
	if v == "" || v == "nan" {
		return "", nil
	}
	for m := range strings.SplitSeq(v, "|") {
		if !validOpenBModel(m) {
			return "", row.errorf("gpu_spec", "%q: want GPU models separated by |, such as V100M16|V100M32", v)
		}
	}
	return v, nil
}

// validOpenBModel reports whether m can name a GPU model: letters, digits, '-' and '_',
// which also makes it a valid Kubernetes label value.
func validOpenBModel(m string) bool {
	if m == "" || len(m) > 63 || m == "nan" {
		return false
	}
	for i := range len(m) {
		if c := m[i]; !isAlnum(c) && c != '-' && c != '_' {
			return false
		}
	}
	return isAlnum(m[0]) && isAlnum(m[len(m)-1])
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// openBSeconds reads a time column: whole seconds since the trace's start.
func openBSeconds(row row, col string) (time.Duration, error) {
	s, err := row.int(col, 0, openBMaxSeconds)
	if err != nil {
		return 0, err
	}
	return time.Duration(s) * time.Second, nil
}

// OpenBNode is one node of an openb node list (columns sn, cpu_milli, memory_mib, gpu,
// model; the reader uses sn, gpu and model).
type OpenBNode struct {
	Name string
	// GPUs is the node's GPU count, 0 to 64 (1 to 8 in openb_node_list_gpu_node.csv).
	GPUs int
	// Model is the GPU type (P100, T4, V100M16, V100M32, A10, or the undisclosed G1, G2,
	// G3); empty exactly when GPUs is 0, which the file writes as an empty cell or "nan".
	Model string
}

// ReadOpenBNodes reads an openb node list (openb_node_list_gpu_node.csv, or
// openb_node_list_all_node.csv with its CPU-only nodes) in the file's order. Node names
// are unique. An error names the line, the column and the value.
func ReadOpenBNodes(r io.Reader) ([]OpenBNode, error) {
	t, err := newTable(r, "openb node list", "sn", "gpu", "model")
	if err != nil {
		return nil, err
	}
	seen := map[string]int{} // name → line
	return readRows(t, func(row row) (OpenBNode, bool, error) {
		n := OpenBNode{Name: row.str("sn")}
		if n.Name == "" {
			return n, false, row.errorf("sn", "empty: want the node's name")
		}
		if line, dup := seen[n.Name]; dup {
			return n, false, row.errorf("sn", "%q: repeats the node of line %d", n.Name, line)
		}
		seen[n.Name] = row.line
		gpus, err := row.int("gpu", 0, openBMaxNodeGPUs)
		if err != nil {
			return n, false, err
		}
		n.GPUs = int(gpus)
		switch m := row.str("model"); {
		case n.GPUs == 0 && (m == "" || m == "nan"):
		case n.GPUs == 0:
			return n, false, row.errorf("model", "%q on a node of 0 GPUs: want it empty", m)
		case !validOpenBModel(m):
			return n, false, row.errorf("model", "%q: want the GPU model of the node's %d GPUs, such as V100M16", m, n.GPUs)
		default:
			n.Model = m
		}
		return n, true, nil
	})
}
