package bench

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler"
)

// TestWorkloadBigNamespace lays out a cluster with a big namespace and checks what the
// bench's figures rest on: the namespace holds exactly the GPUs asked for, in apps of a
// few to tens of GPUs, and every trigger reads data, a GPU trigger some GPUs.
func TestWorkloadBigNamespace(t *testing.T) {
	cfg := Config{Nodes: 1000, BigNamespaceGPUs: 2000, Triggers: 1000}.withDefaults()
	w, err := newWorkload(cfg)
	if err != nil {
		t.Fatal(err)
	}
	state := scaler.NewState(nil)
	now := time.Now()
	perNS, perApp := map[string]int{}, map[string]int{}
	bigNodes := 0
	for _, n := range w.nodeReports() {
		ev, err := gpuscalerv1.Decode(n.subject, n.data)
		if err != nil {
			t.Fatal(err)
		}
		holdsBig := false
		for _, g := range ev.Node.GetGpus() {
			if p := g.GetPod(); p != nil {
				perNS[p.GetNamespace()]++
				if p.GetNamespace() == BigNamespace {
					perApp[p.GetLabels()["app"]]++
					holdsBig = true
				}
			}
		}
		if holdsBig {
			bigNodes++
		}
		if err := state.Apply(ev, now); err != nil {
			t.Fatal(err)
		}
	}
	if got := perNS[BigNamespace]; got != cfg.BigNamespaceGPUs {
		t.Errorf("namespace %s holds %d GPUs, want %d", BigNamespace, got, cfg.BigNamespaceGPUs)
	}
	if want := (cfg.BigNamespaceGPUs + 6) / 7; bigNodes != want {
		t.Errorf("%d nodes hold the big namespace's GPUs, want %d: whole nodes of 7 held GPUs", bigNodes, want)
	}
	if len(perApp) != len(w.apps) {
		t.Errorf("%d apps hold GPUs, want %d", len(perApp), len(w.apps))
	}
	for _, a := range w.apps {
		if perApp[a.name] != a.gpus || a.gpus < 1 || a.gpus > 64 {
			t.Errorf("app %s holds %d GPUs, want %d, from 1 to 64", a.name, perApp[a.name], a.gpus)
		}
	}
	if want := 50 + 1; len(perNS) != want {
		t.Errorf("GPUs held in %d namespaces, want %d", len(perNS), want)
	}

	trigs := w.triggers()
	kinds := map[int]int{}
	setBased := 0
	for _, tr := range trigs {
		kinds[tr.kind]++
		if tr.kind == kindQueue {
			subject, data := queueReport(tr.queue, tr.waiting)
			ev, err := gpuscalerv1.Decode(subject, data)
			if err != nil {
				t.Fatal(err)
			}
			state.SetMaxQueuesPerNamespace(0)
			if err := state.Apply(ev, now); err != nil {
				t.Fatal(err)
			}
		}
		if sel := tr.ref.GetScalerMetadata()[scaler.KeyPodSelector]; strings.Contains(sel, " in (") || strings.Contains(sel, " notin (") {
			setBased++
		}
	}
	if want := map[int]int{kindQueue: 500, kindGPU: 250, kindGPUBig: 250}; len(kinds) != len(want) || kinds[kindQueue] != want[kindQueue] || kinds[kindGPU] != want[kindGPU] || kinds[kindGPUBig] != want[kindGPUBig] {
		t.Errorf("triggers by kind: got %v, want %v", kinds, want)
	}
	if setBased == 0 {
		t.Error("no podSelector with a set-based requirement (in, notin)")
	}
	for _, tr := range trigs {
		tg, err := scaler.ParseTrigger(tr.ref.GetNamespace(), tr.ref.GetScalerMetadata(), time.Minute)
		if err != nil {
			t.Fatalf("trigger %s: %v", tr.ref.GetName(), err)
		}
		r := state.Read(tg)
		if _, err := r.Metric(tr.metric); err != nil {
			t.Errorf("trigger %s/%s: %v", tr.ref.GetNamespace(), tr.ref.GetName(), err)
		}
		if active, err := r.Active(); tr.kind != kindQueue && (err != nil || !active) {
			t.Errorf("trigger %s/%s (podSelector %q): active %v, %v; want true: it selects pods holding GPUs",
				tr.ref.GetNamespace(), tr.ref.GetName(), tr.ref.GetScalerMetadata()[scaler.KeyPodSelector], active, err)
		}
	}
}

// TestWorkloadWithoutBigNamespace keeps the layout the bench has always had: every held
// GPU with one of 100 apps over 50 namespaces, round-robin.
func TestWorkloadWithoutBigNamespace(t *testing.T) {
	cfg := Config{Nodes: 20}.withDefaults()
	w, err := newWorkload(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range w.nodeReports() {
		ev, err := gpuscalerv1.Decode(n.subject, n.data)
		if err != nil {
			t.Fatal(err)
		}
		for g, s := range ev.Node.GetGpus() {
			app := (i*cfg.GPUsPerNode + g) % 100
			want := ""
			if g != cfg.GPUsPerNode-1 {
				want = fmt.Sprintf("svc-%02d", app)
			}
			if got := s.GetPod().GetLabels()["app"]; got != want {
				t.Errorf("node %d GPU %d: app %q, want %q", i, g, got, want)
			}
		}
	}
}

// TestMoreNodeReports: the nodes the absorption steps add are new nodes (names and GPUs no
// other node has), laid out round-robin as a larger --nodes would lay them out, and a
// State takes them beside the workload's own.
func TestMoreNodeReports(t *testing.T) {
	cfg := Config{Nodes: 30, BigNamespaceGPUs: 50}.withDefaults()
	w, err := newWorkload(cfg)
	if err != nil {
		t.Fatal(err)
	}
	nodes := slices.Concat(w.nodeReports(), w.moreNodeReports(30, 45), w.moreNodeReports(45, 52))
	state := scaler.NewState(nil)
	seen := map[string]bool{}
	for i, n := range nodes {
		ev, err := gpuscalerv1.Decode(n.subject, n.data)
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("bench-node-%05d", i); ev.Node.GetNode() != want {
			t.Fatalf("node %d is %q, want %q", i, ev.Node.GetNode(), want)
		}
		for g, s := range ev.Node.GetGpus() {
			if seen[s.GetUuid()] {
				t.Errorf("node %d GPU %d: UUID %s reported twice", i, g, s.GetUuid())
			}
			seen[s.GetUuid()] = true
			if i < cfg.Nodes {
				continue
			}
			want := ""
			if g != cfg.GPUsPerNode-1 {
				want = fmt.Sprintf("svc-%02d", (i*cfg.GPUsPerNode+g)%100)
			}
			if got := s.GetPod().GetLabels()["app"]; got != want {
				t.Errorf("added node %d GPU %d: app %q, want %q", i, g, got, want)
			}
		}
		if err := state.Apply(ev, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if n, gpus, _ := state.Size(); n != len(nodes) || gpus != len(nodes)*cfg.GPUsPerNode {
		t.Errorf("state holds %d nodes, %d GPUs; want %d, %d", n, gpus, len(nodes), len(nodes)*cfg.GPUsPerNode)
	}
}

func TestWorkloadBigNamespaceTooBig(t *testing.T) {
	cfg := Config{Nodes: 10, BigNamespaceGPUs: 71}.withDefaults()
	if _, err := newWorkload(cfg); err == nil || !strings.Contains(err.Error(), "hold only 70") {
		t.Errorf("got %v, want an error saying the nodes' pods hold only 70 GPUs", err)
	}
}
