package traces

import (
	"bytes"
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// tracesDir is shared/testdata/traces, beside the repository.
const tracesDir = "../../../../../shared/testdata/traces"

func openBFile(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(tracesDir, name))
	if err != nil {
		t.Fatalf("the openb trace is part of the shared test data: %v", err)
	}
	return data
}

// TestReadOpenBPodsRealFile checks facts of openb_pod_list_default.csv, each counted
// with awk on the file, e.g. awk -F, 'NR>1 && $4>0 && $11!=""' | wc -l.
func TestReadOpenBPodsRealFile(t *testing.T) {
	pods, err := ReadOpenBPods(bytes.NewReader(openBFile(t, "openb-pods-default.csv")))
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 8152 {
		t.Fatalf("got %d pods, want 8152 (the upstream README's count)", len(pods))
	}
	byGPUs := map[int]int{}
	var scheduledGPU, shared, endOfTrace int
	var gpuSeconds int64
	var last time.Duration
	for i, p := range pods {
		byGPUs[p.NumGPU]++
		if p.Created < last {
			t.Fatalf("pod %d (%s) created at %s, before the one before it (%s)", i, p.Name, p.Created, last)
		}
		last = p.Created
		// Every task without a scheduled time is Pending, and every Pending one lacks it.
		if p.HasScheduled == (p.Phase == "Pending") {
			t.Errorf("%s: phase %s, has scheduled time %v", p.Name, p.Phase, p.HasScheduled)
		}
		if p.GPUSpec != "" {
			t.Errorf("%s: gpu_spec %q, want none in the default list", p.Name, p.GPUSpec)
		}
		if p.NumGPU > 0 && p.GPUMilli < 1000 {
			shared++
		}
		if p.Deleted == 12_902_960*time.Second {
			endOfTrace++
		}
		if run, ok := p.RunTime(); ok && p.NumGPU > 0 {
			scheduledGPU++
			gpuSeconds += int64(p.NumGPU) * int64(run/time.Second)
		}
	}
	// The most GPUs the tasks held at once by their own times, a task freeing its GPUs
	// before one starting at the same second takes them: sort the starts (+num_gpu) and
	// ends (-num_gpu) by time, ends first, and sum (awk, then sort -k1,1n -k2,2n). It is
	// far below the 6,212 GPUs of the nodes: the list is a sample of the cluster's tasks.
	type change struct {
		at   time.Duration
		gpus int
	}
	var changes []change
	for _, p := range pods {
		if p.HasScheduled && p.NumGPU > 0 {
			changes = append(changes, change{p.Scheduled, p.NumGPU}, change{p.Deleted, -p.NumGPU})
		}
	}
	slices.SortFunc(changes, func(a, b change) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.gpus, b.gpus)) })
	held, peak := 0, 0
	var peakAt time.Duration
	for _, c := range changes {
		if held += c.gpus; held > peak {
			peak, peakAt = held, c.at
		}
	}
	if peak != 71 || peakAt != 12_523_649*time.Second {
		t.Errorf("at most %d GPUs held at once, first at %s; want 71 at 12523649s", peak, peakAt)
	}
	want := map[int]int{0: 1088, 1: 6989, 2: 16, 4: 15, 8: 44}
	for n, c := range want {
		if byGPUs[n] != c {
			t.Errorf("%d pods of num_gpu %d, want %d", byGPUs[n], n, c)
		}
	}
	if len(byGPUs) != len(want) {
		t.Errorf("num_gpu values %v, want only %v", byGPUs, want)
	}
	for _, c := range []struct {
		what      string
		got, want int64
	}{
		{"GPU tasks with a scheduled time", int64(scheduledGPU), 6203},
		{"tasks sharing a GPU (gpu_milli < 1000)", int64(shared), 3078},
		{"tasks deleted at the trace's end, 12,902,960 s", int64(endOfTrace), 34},
		{"GPU-seconds of the scheduled GPU tasks", gpuSeconds, 214_603_958},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %d, want %d", c.what, c.got, c.want)
		}
	}
}

// TestOpenBTimesAreSeconds pins the unit. cluster-trace-gpu-v2023/README.md upstream:
// "creation_time: Timestamp of creation (in seconds)", and so for deletion_time and
// scheduled_time. The last task of the default list is created at 12,901,761: read as
// seconds that is 149.3 days, the span of the trace in the paper (read as milliseconds
// it would be 3.6 hours).
func TestOpenBTimesAreSeconds(t *testing.T) {
	pods, err := ReadOpenBPods(bytes.NewReader(openBFile(t, "openb-pods-default.csv")))
	if err != nil {
		t.Fatal(err)
	}
	lastCreated := pods[len(pods)-1].Created
	if want := 12_901_761 * time.Second; lastCreated != want {
		t.Fatalf("last creation at %s, want %s", lastCreated, want)
	}
	if days := lastCreated.Hours() / 24; days < 149 || days > 150 {
		t.Errorf("the trace spans %.1f days, want about 149", days)
	}
	// openb-pod-0001: creation 427061, scheduled 427061, deletion 12902960.
	p := pods[1]
	if p.Name != "openb-pod-0001" || p.Created != 427061*time.Second || p.Scheduled != 427061*time.Second ||
		p.Deleted != 12902960*time.Second || p.NumGPU != 1 || p.GPUMilli != 460 || p.Phase != "Running" {
		t.Errorf("second row read as %+v", p)
	}
}

// TestReadOpenBNodesRealFile checks openb_node_list_gpu_node.csv against counts made
// with awk -F, 'NR>1{n[$5]++; g[$5]+=$4}'.
func TestReadOpenBNodesRealFile(t *testing.T) {
	nodes, err := ReadOpenBNodes(bytes.NewReader(openBFile(t, "openb-gpu-nodes.csv")))
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1213 {
		t.Fatalf("got %d nodes, want 1213", len(nodes))
	}
	type count struct{ nodes, gpus int }
	got := map[string]count{}
	total := 0
	for _, n := range nodes {
		c := got[n.Model]
		got[n.Model] = count{c.nodes + 1, c.gpus + n.GPUs}
		total += n.GPUs
	}
	want := map[string]count{"A10": {2, 2}, "G2": {549, 4392}, "G3": {39, 312}, "P100": {134, 265},
		"T4": {404, 842}, "V100M16": {55, 195}, "V100M32": {30, 204}}
	for m, c := range want {
		if got[m] != c {
			t.Errorf("model %s: got %+v, want %+v", m, got[m], c)
		}
	}
	if len(got) != len(want) || total != 6212 {
		t.Errorf("models %v, %d GPUs; want %v, 6212 GPUs", got, total, want)
	}
	if n := nodes[1]; n != (OpenBNode{Name: "openb-node-0001", GPUs: 2, Model: "P100"}) {
		t.Errorf("second row read as %+v", n)
	}
}

const openBHeader = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"

func TestReadOpenBPods(t *testing.T) {
	for name, tc := range map[string]struct {
		body    string
		want    []OpenBPod
		wantErr string // every part must appear in the error
	}{
		"sorted by creation, stable": {
			body: "b,1,1,1,1000,,LS,Running,20,30,25\n" +
				"a,1,1,2,1000,V100M16|V100M32,LS,Succeeded,10,40,10\n" +
				"c,1,1,0,0,nan,BE,Pending,20,21,\n",
			want: []OpenBPod{
				{Name: "a", NumGPU: 2, GPUMilli: 1000, GPUSpec: "V100M16|V100M32", Phase: "Succeeded", Created: 10 * time.Second, Scheduled: 10 * time.Second, Deleted: 40 * time.Second, HasScheduled: true},
				{Name: "b", NumGPU: 1, GPUMilli: 1000, Phase: "Running", Created: 20 * time.Second, Scheduled: 25 * time.Second, Deleted: 30 * time.Second, HasScheduled: true},
				{Name: "c", Phase: "Pending", Created: 20 * time.Second, Deleted: 21 * time.Second},
			},
		},
		"columns by name": {
			body: "", // replaced below
			want: []OpenBPod{{Name: "x", NumGPU: 1, GPUMilli: 500, Phase: "Failed", Created: time.Second, Deleted: 2 * time.Second}},
		},
		"missing column":    {body: "-", wantErr: "lacks column(s) scheduled_time"},
		"num_gpu too large": {body: "a,1,1,9,1000,,LS,Running,1,2,1\n", wantErr: `line 2, column num_gpu: "9"`},
		"num_gpu not a number": {
			body: "a,1,1,one,1000,,LS,Running,1,2,1\n", wantErr: `line 2, column num_gpu: "one"`},
		"shared multi-GPU":          {body: "ok,1,1,1,1000,,LS,Running,1,2,1\na,1,1,2,500,,LS,Running,1,2,1\n", wantErr: `line 3, column gpu_milli: "500" with num_gpu 2`},
		"CPU task with a GPU share": {body: "a,1,1,0,500,,LS,Running,1,2,1\n", wantErr: `column gpu_milli: "500" with num_gpu 0`},
		"GPU task without a share":  {body: "a,1,1,1,0,,LS,Running,1,2,1\n", wantErr: `column gpu_milli: "0" with num_gpu 1`},
		"bad spec":                  {body: "a,1,1,1,1000,V100||T4,LS,Running,1,2,1\n", wantErr: `column gpu_spec: "V100||T4"`},
		"bad phase":                 {body: "a,1,1,1,1000,,LS,Done,1,2,1\n", wantErr: `column pod_phase: "Done"`},
		"negative time":             {body: "a,1,1,1,1000,,LS,Running,-1,2,1\n", wantErr: `column creation_time: "-1"`},
		"fractional time":           {body: "a,1,1,1,1000,,LS,Running,1.5,2,1\n", wantErr: `column creation_time: "1.5"`},
		"deleted before created":    {body: "a,1,1,1,1000,,LS,Running,5,4,\n", wantErr: `column deletion_time: "4": before creation_time 5`},
		"scheduled before created":  {body: "a,1,1,1,1000,,LS,Running,5,9,4\n", wantErr: `column scheduled_time: "4": before creation_time 5`},
		"scheduled after deleted":   {body: "a,1,1,1,1000,,LS,Running,5,9,10\n", wantErr: `column scheduled_time: "10": after deletion_time 9`},
		"no name":                   {body: ",1,1,1,1000,,LS,Running,5,9,5\n", wantErr: "column name: empty"},
		"empty file":                {body: "", wantErr: "empty file"},
	} {
		t.Run(name, func(t *testing.T) {
			in := openBHeader + tc.body
			switch name {
			case "columns by name":
				in = "deletion_time,scheduled_time,creation_time,pod_phase,gpu_spec,gpu_milli,num_gpu,name\n2,,1,Failed,,500,1,x\n"
			case "missing column":
				in = "name,num_gpu,gpu_milli,gpu_spec,pod_phase,creation_time,deletion_time\n"
			case "empty file":
				in = ""
			}
			got, err := ReadOpenBPods(strings.NewReader(in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestOpenBPodGPUModels(t *testing.T) {
	for spec, want := range map[string][]string{
		"":                        nil,
		"T4":                      {"T4"},
		"V100M32|V100M16|V100M32": {"V100M16", "V100M32"},
	} {
		if got := (OpenBPod{GPUSpec: spec}).GPUModels(); !slices.Equal(got, want) {
			t.Errorf("GPUModels of %q = %q, want %q", spec, got, want)
		}
	}
}

func TestReadOpenBNodes(t *testing.T) {
	const header = "sn,cpu_milli,memory_mib,gpu,model\n"
	for name, tc := range map[string]struct {
		body    string
		want    []OpenBNode
		wantErr string
	}{
		"GPU and CPU nodes": {
			body: "n1,64000,262144,2,P100\nn0,32000,262144,0,\nn2,32000,262144,0,nan\n",
			want: []OpenBNode{{"n1", 2, "P100"}, {"n0", 0, ""}, {"n2", 0, ""}},
		},
		"duplicate":             {body: "n1,1,1,2,P100\nn1,1,1,2,P100\n", wantErr: `line 3, column sn: "n1": repeats the node of line 2`},
		"no model":              {body: "n1,1,1,2,\n", wantErr: `line 2, column model: ""`},
		"model on a CPU node":   {body: "n1,1,1,0,T4\n", wantErr: `column model: "T4" on a node of 0 GPUs`},
		"model with a space":    {body: "n1,1,1,8,Tesla T4\n", wantErr: `column model: "Tesla T4"`},
		"negative GPUs":         {body: "n1,1,1,-1,T4\n", wantErr: `column gpu: "-1"`},
		"too many GPUs":         {body: "n1,1,1,65,T4\n", wantErr: `column gpu: "65"`},
		"no name":               {body: ",1,1,1,T4\n", wantErr: "column sn: empty"},
		"short row reads empty": {body: "n1,1,1\n", wantErr: `line 2, column gpu: ""`},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := ReadOpenBNodes(strings.NewReader(header + tc.body))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// realRows returns the header and the first n data rows of a trace file, with one more
// row made from each given line, as fuzz seeds.
func realRows(t testing.TB, file string, n int) []string {
	lines := strings.SplitAfter(string(openBFile(t, file)), "\n")
	var seeds []string
	for i := 1; i <= n && i < len(lines); i++ {
		seeds = append(seeds, lines[0]+lines[i])
	}
	return append(seeds, strings.Join(lines[:min(n+1, len(lines))], ""))
}

// FuzzOpenBPods feeds the reader real rows and their mutations: it must never panic, and
// what it accepts must hold the invariants its doc promises.
func FuzzOpenBPods(f *testing.F) {
	for _, s := range realRows(f, "openb-pods-default.csv", 20) {
		f.Add(s)
	}
	f.Add(openBHeader + "a,1,1,2,1000,V100M16|V100M32|V100M32,LS,Pending,5,9,\n")
	f.Fuzz(func(t *testing.T, in string) {
		pods, err := ReadOpenBPods(strings.NewReader(in))
		if err != nil {
			if pods != nil {
				t.Errorf("pods %v with error %v", pods, err)
			}
			return
		}
		for i, p := range pods {
			switch {
			case i > 0 && p.Created < pods[i-1].Created:
				t.Errorf("pod %d created at %s, before pod %d at %s", i, p.Created, i-1, pods[i-1].Created)
			case p.Name == "":
				t.Errorf("pod %d has no name", i)
			case p.NumGPU < 0 || p.NumGPU > 8:
				t.Errorf("%s: num_gpu %d", p.Name, p.NumGPU)
			case p.NumGPU == 0 && p.GPUMilli != 0, p.NumGPU > 0 && (p.GPUMilli < 1 || p.GPUMilli > 1000), p.NumGPU > 1 && p.GPUMilli != 1000:
				t.Errorf("%s: num_gpu %d with gpu_milli %d", p.Name, p.NumGPU, p.GPUMilli)
			case !slices.Contains(OpenBPhases, p.Phase):
				t.Errorf("%s: phase %q", p.Name, p.Phase)
			case p.Created < 0 || p.Deleted < p.Created:
				t.Errorf("%s: created %s, deleted %s", p.Name, p.Created, p.Deleted)
			case p.HasScheduled && (p.Scheduled < p.Created || p.Scheduled > p.Deleted):
				t.Errorf("%s: scheduled %s outside [%s, %s]", p.Name, p.Scheduled, p.Created, p.Deleted)
			case !p.HasScheduled && p.Scheduled != 0:
				t.Errorf("%s: scheduled %s without HasScheduled", p.Name, p.Scheduled)
			}
			if run, ok := p.RunTime(); ok != p.HasScheduled || run < 0 {
				t.Errorf("%s: run time %s, %v", p.Name, run, ok)
			}
			for _, m := range p.GPUModels() {
				if !validOpenBModel(m) {
					t.Errorf("%s: GPU model %q in spec %q", p.Name, m, p.GPUSpec)
				}
			}
		}
	})
}

// FuzzOpenBNodes is FuzzOpenBPods for the node list.
func FuzzOpenBNodes(f *testing.F) {
	for _, s := range realRows(f, "openb-gpu-nodes.csv", 20) {
		f.Add(s)
	}
	f.Add("sn,cpu_milli,memory_mib,gpu,model\nopenb-node-0000,32000,262144,0,nan\n")
	f.Fuzz(func(t *testing.T, in string) {
		nodes, err := ReadOpenBNodes(strings.NewReader(in))
		if err != nil {
			if nodes != nil {
				t.Errorf("nodes %v with error %v", nodes, err)
			}
			return
		}
		seen := map[string]bool{}
		for _, n := range nodes {
			switch {
			case n.Name == "" || seen[n.Name]:
				t.Errorf("node name %q empty or repeated", n.Name)
			case n.GPUs < 0 || n.GPUs > 64:
				t.Errorf("%s: %d GPUs", n.Name, n.GPUs)
			case (n.GPUs == 0) != (n.Model == ""):
				t.Errorf("%s: %d GPUs of model %q", n.Name, n.GPUs, n.Model)
			case n.Model != "" && !validOpenBModel(n.Model):
				t.Errorf("%s: model %q", n.Name, n.Model)
			}
			seen[n.Name] = true
		}
	})
}
