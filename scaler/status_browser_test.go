package scaler

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"
	"golang.org/x/net/html/atom"
	"google.golang.org/grpc/codes"

	"github.com/gpuscaler/gpuscaler/internal/natstest"
	pb "github.com/gpuscaler/gpuscaler/proto/externalscaler"
	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// browser runs Debian's chromium headless against pages of a scaler in the test.
type browser struct {
	t       *testing.T
	bin     string
	profile string
}

// newBrowser finds chromium. Without it the test skips, unless GPUSCALER_REQUIRE_CHROMIUM
// is set (.ci/run sets it, and installs chromium): there it fails.
func newBrowser(t *testing.T) *browser {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		const msg = "chromium not found: this test loads the status page in a headless browser; install Debian's chromium (apt-get install chromium) to run it"
		if os.Getenv("GPUSCALER_REQUIRE_CHROMIUM") != "" {
			t.Fatal(msg + " (GPUSCALER_REQUIRE_CHROMIUM is set, as in CI)")
		}
		t.Skip(msg)
	}
	return &browser{t: t, bin: bin, profile: t.TempDir()}
}

func (b *browser) run(args ...string) []byte {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.t.Context(), 90*time.Second)
	defer cancel()
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-dev-shm-usage", "--hide-scrollbars", "--user-data-dir=" + b.profile}, args...)
	cmd := exec.CommandContext(ctx, b.bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		b.t.Fatalf("chromium %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes()
}

// load loads url in a window w×h, and returns the document as the browser holds it once
// loaded and the screenshot it takes then, a PNG. With GPUSCALER_SCREENSHOT_DIR set, it
// keeps a copy of the screenshot there under name, to look at.
func (b *browser) load(url, name string, w, h int) (*html.Node, []byte) {
	b.t.Helper()
	path := filepath.Join(b.t.TempDir(), name)
	dom := b.run("--dump-dom", "--screenshot="+path, "--window-size="+itoa(w)+","+itoa(h), url)
	doc, err := html.Parse(bytes.NewReader(dom))
	if err != nil {
		b.t.Fatalf("parse the DOM of %s: %v", url, err)
	}
	shot, err := os.ReadFile(path)
	if err != nil {
		b.t.Fatalf("chromium took no screenshot of %s: %v", url, err)
	}
	if dir := os.Getenv("GPUSCALER_SCREENSHOT_DIR"); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, name), shot, 0o644); err != nil {
			b.t.Fatal(err)
		}
	}
	return doc, shot
}

func findAll(n *html.Node, match func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	if match(n) {
		out = append(out, n)
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		out = append(out, findAll(c, match)...)
	}
	return out
}

func byID(t *testing.T, doc *html.Node, id string) *html.Node {
	t.Helper()
	found := findAll(doc, func(n *html.Node) bool {
		for _, a := range n.Attr {
			if a.Key == "id" && a.Val == id {
				return true
			}
		}
		return false
	})
	if len(found) != 1 {
		t.Fatalf("%d elements with id %q, want 1", len(found), id)
	}
	return found[0]
}

// text is what a reader sees of n: its text, a space between cells and blocks, runs of
// white space made one space.
func text(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		block := false
		switch n.DataAtom {
		case atom.Td, atom.Th, atom.Tr, atom.Ul, atom.Li, atom.Div, atom.P, atom.H1, atom.H2, atom.Br:
			block = true
		}
		if block {
			b.WriteByte(' ')
		}
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
		if block {
			b.WriteByte(' ')
		}
	}
	walk(n)
	return strings.Join(strings.Fields(b.String()), " ")
}

// rows returns the text of each row of table but its header.
func rows(table *html.Node) []string {
	var out []string
	for _, tr := range findAll(table, func(n *html.Node) bool { return n.DataAtom == atom.Tr })[1:] {
		out = append(out, text(tr))
	}
	return out
}

// rowWith returns the one row of rows that starts with prefix.
func rowWith(t *testing.T, rows []string, prefix string) string {
	t.Helper()
	var found []string
	for _, r := range rows {
		if strings.HasPrefix(r, prefix) {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d rows start with %q, want 1; rows:\n%s", len(found), prefix, strings.Join(rows, "\n"))
	}
	return found[0]
}

func wantContains(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Errorf("%s = %q, want it to contain %q", what, got, w)
		}
	}
}

// Hostile strings, as a tenant can put them in a pod name (a NodeReport checks only that
// it is not empty), a ScaledObject's name or its trigger metadata (echoed by the
// InvalidArgument message).
const (
	hostilePod      = `<script>document.title='pwned-pod'</script>`
	hostileName     = `<img src=x onerror=document.title='pwned-name'>`
	hostileMetadata = `</td><script>document.title='pwned-md'</script>`
)

// statusFixture runs a scaler fed real reports over an in-process NATS, and makes KEDA's
// calls over gRPC for four triggers: one active with two metrics, one idle with a
// stream open, one whose queue has no report, one with invalid (hostile) metadata.
func statusFixture(t *testing.T) *testScaler {
	t.Helper()
	ns := natstest.Start(t, "", "")
	s := startScaler(t, ns.ClientURL(), Config{})
	pub := newPublisher(t, ns.ClientURL())
	pub.queue("ml", "jobs", 12, 3)
	pub.queue("ml", "idle", 0, 0)
	pub.queue("web", "render", 4, 0)
	devices := func(ids ...string) []*gpuscalerv1.Device {
		var out []*gpuscalerv1.Device
		for _, id := range ids {
			out = append(out, &gpuscalerv1.Device{Id: id, Resource: "nvidia.com/gpu"})
		}
		return out
	}
	unhealthy := gpu("GPU-b2", "", "", nil, 0, 0, 80)
	unhealthy.Unhealthy = "XID 79: fallen off the bus"
	pub.node(&gpuscalerv1.NodeReport{Node: "gpu-node-a", Source: "dcgm",
		Gpus: []*gpuscalerv1.GPUSample{
			gpu("GPU-a1", "ml", "llm-0", llm, 80, 40, 80),
			gpu("GPU-a2", "ml", "llm-1", llm, 70, 30, 80),
			gpu("GPU-a3", "web", hostilePod, map[string]string{"app": "render"}, 20, 10, 80),
			gpu("GPU-a4", "", "", nil, 0, 0, 80),
		},
		Allocatable: devices("GPU-a1", "GPU-a2", "GPU-a3", "GPU-a4"),
		Allocated:   devices("GPU-a1", "GPU-a2", "GPU-a3"),
	})
	pub.node(&gpuscalerv1.NodeReport{Node: "gpu-node-b", Source: "nvml", NodeLabels: map[string]string{"pool": "a100", "zone": "eu-1"},
		Gpus:        []*gpuscalerv1.GPUSample{gpu("GPU-b1", "ml", "train-0", map[string]string{"app": "train"}, 95, 70, 80), unhealthy},
		Allocatable: devices("GPU-b1", "GPU-b2"),
		Allocated:   devices("GPU-b1"),
		Scheduling: &gpuscalerv1.NodeScheduling{Unschedulable: true, Taints: []*gpuscalerv1.Taint{
			{Key: "ToBeDeletedByClusterAutoscaler", Value: "1732700000", Effect: "NoSchedule"}, {Key: "node.kubernetes.io/unschedulable", Effect: "NoSchedule"}}},
	})
	testkit.Eventually(t, 5*time.Second, func() bool { n, _, q := s.State().Size(); return n == 2 && q == 3 })

	ctx := t.Context()
	llmRef := ref("ml", "llm", map[string]string{"queue": "jobs", "queueTarget": "5", "podSelector": "app=llm", "gpuUtilTarget": "60"})
	if _, err := s.client.GetMetricSpec(ctx, llmRef); err != nil {
		t.Fatal(err)
	}
	if r, err := s.client.IsActive(ctx, llmRef); err != nil || !r.GetResult() {
		t.Fatalf("IsActive(ml/llm) = %v, %v; want true", r, err)
	}
	for _, m := range []string{MetricQueueBacklog, MetricGPUUtil} {
		if _, err := s.client.GetMetrics(ctx, &pb.GetMetricsRequest{ScaledObjectRef: llmRef, MetricName: m}); err != nil {
			t.Fatalf("GetMetrics(ml/llm, %s): %v", m, err)
		}
	}
	idleRef := ref("ml", "idle-worker", map[string]string{"queue": "idle"})
	if r, err := s.client.IsActive(ctx, idleRef); err != nil || r.GetResult() {
		t.Fatalf("IsActive(ml/idle-worker) = %v, %v; want false", r, err)
	}
	streamCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	stream, err := s.client.StreamIsActive(streamCtx, idleRef)
	if err != nil {
		t.Fatal(err)
	}
	msgs, _ := recvAll(stream)
	expectMsg(t, msgs, false)
	missingRef := ref("ml", "missing", map[string]string{"queue": "nosuch"})
	_, err = s.client.GetMetrics(ctx, &pb.GetMetricsRequest{ScaledObjectRef: missingRef, MetricName: MetricQueueBacklog})
	wantCode(t, err, codes.Unavailable)
	_, err = s.client.IsActive(ctx, ref("web", hostileName, map[string]string{"queue": hostileMetadata}))
	wantCode(t, err, codes.InvalidArgument)
	// The stream's open is recorded after its first message is sent: wait for it.
	testkit.Eventually(t, 5*time.Second, func() bool {
		rows, _ := s.calls.snapshot()
		for _, r := range rows {
			if r.streamsOpen == 1 {
				return true
			}
		}
		return false
	})
	return s
}

// TestStatusPageInBrowser loads the status page and a trigger's explanation in headless
// Chromium, from a real scaler fed real reports, and checks what a reader sees: the
// triggers with KEDA's answers and the errors, queues with backlog and age, nodes with
// their GPUs, the pods holding them and free capacity; hostile names shown as text, and
// no script run. It takes a screenshot of each and checks the page was drawn with its
// styles.
func TestStatusPageInBrowser(t *testing.T) {
	b := newBrowser(t)
	s := statusFixture(t)
	base := "http://" + s.HTTPAddr().String()

	doc, shot := b.load(base+"/status", "status.png", 1400, 1100)
	checkScreenshot(t, shot, 1400, 1100)
	title := findAll(doc, func(n *html.Node) bool { return n.DataAtom == atom.Title })
	if len(title) != 1 || text(title[0]) != "gpuscaler status" {
		t.Fatalf("title = %v, want gpuscaler status: a hostile name ran a script", text(doc))
	}
	if scripts := findAll(doc, func(n *html.Node) bool { return n.DataAtom == atom.Script || n.DataAtom == atom.Img }); len(scripts) > 0 {
		t.Fatalf("the page holds %d script or img elements, want none: a name or message was not escaped", len(scripts))
	}

	triggers := rows(byID(t, doc, "triggers"))
	if len(triggers) != 4 {
		t.Fatalf("%d trigger rows, want 4:\n%s", len(triggers), strings.Join(triggers, "\n"))
	}
	// Failing triggers come first: the invalid one and the one without a report.
	wantContains(t, "the first two rows", triggers[0]+triggers[1], "ml/missing", "web/"+hostileName)
	wantContains(t, "ml/llm's row", rowWith(t, triggers, "ml/llm "),
		"queue: jobs", "podSelector: app=llm", "active", "queue-backlog 15 / 5 → 3 replicas", "gpu-util 150 / 60 → 3 replicas", "why?")
	if strings.Contains(rowWith(t, triggers, "ml/llm "), "scalerAddress") {
		t.Errorf("ml/llm's row shows scalerAddress, which every trigger has")
	}
	wantContains(t, "ml/idle-worker's row", rowWith(t, triggers, "ml/idle-worker "), "inactive", "1 open", "last sent inactive")
	wantContains(t, "ml/missing's row", rowWith(t, triggers, "ml/missing "), "queue-backlog Unavailable", "nosuch")
	wantContains(t, "the hostile trigger's row", rowWith(t, triggers, "web/"+hostileName), "invalid metadata", "InvalidArgument", hostileMetadata, "want a queue name")
	wantContains(t, "the triggers' heading", text(doc), "Triggers KEDA asked about 4, 2 failing")

	queues := rows(byID(t, doc, "queues"))
	if len(queues) != 3 {
		t.Fatalf("%d queue rows, want 3:\n%s", len(queues), strings.Join(queues, "\n"))
	}
	wantContains(t, "ml/jobs's row", rowWith(t, queues, "ml jobs "), "ml jobs 12 3 15")

	nodes := rows(byID(t, doc, "nodes"))
	if len(nodes) != 2 {
		t.Fatalf("%d node rows, want 2:\n%s", len(nodes), strings.Join(nodes, "\n"))
	}
	wantContains(t, "gpu-node-a's row", rowWith(t, nodes, "gpu-node-a "),
		"dcgm", " 4 1 GPU ", "GPU-a1 · ml/llm-0 80% util · 50% mem", "web/"+hostilePod, "GPU-a4 free")
	wantContains(t, "gpu-node-b's row", rowWith(t, nodes, "gpu-node-b "), "nvml", "pool=a100,zone=eu-1", "1 GPU", "unhealthy XID 79: fallen off the bus")
	wantContains(t, "the nodes' heading", text(doc), "Nodes 2: 6 GPUs, 2 whole GPUs free")

	// The trigger's explanation, through the page's own link.
	links := findAll(byID(t, doc, "triggers"), func(n *html.Node) bool { return n.DataAtom == atom.A })
	var href string
	for _, a := range links {
		for _, attr := range a.Attr {
			if attr.Key == "href" && strings.Contains(text(a.Parent.Parent), "ml/llm ") {
				href = attr.Val
			}
		}
	}
	if !strings.HasPrefix(href, "/status/trigger?id=") {
		t.Fatalf("ml/llm's link = %q, want /status/trigger?id=…", href)
	}
	detail, shot := b.load(base+href, "status-trigger.png", 1400, 1500)
	checkScreenshot(t, shot, 1400, 1500)
	wantContains(t, "the explanation's answer", text(byID(t, detail, "answer")),
		"IsActive active", "queue-backlog 15 / 5 per replica → 3 replicas", "gpu-util 150 / 60 per replica → 3 replicas")
	wantContains(t, "the explanation's reasons", text(byID(t, detail, "reasons")),
		"The queue's backlog 15 is above activationQueueDepth 0.", "The selected pods hold 2 GPUs")
	wantContains(t, "the recorded calls", text(byID(t, detail, "calls")), "IsActive active", "GetMetricSpec", "queue-backlog 15 / 5 → 3 replicas")
	gpus := rows(byID(t, detail, "selected-gpus"))
	if len(gpus) != 1 {
		t.Fatalf("%d nodes hold the selected pods' GPUs, want 1:\n%s", len(gpus), strings.Join(gpus, "\n"))
	}
	wantContains(t, "the selected GPUs", gpus[0], "gpu-node-a", "ml/llm-0", "ml/llm-1")
	if strings.Contains(gpus[0], "GPU-a3") || strings.Contains(gpus[0], "GPU-a4") {
		t.Errorf("the selected GPUs %q show GPUs no selected pod holds", gpus[0])
	}
}

// checkScreenshot checks data is a w×h PNG drawn with the page's styles: the header's
// dark band at the top, and the white page below it.
func checkScreenshot(t *testing.T, data []byte, w, h int) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if b := img.Bounds(); b.Dx() != w || b.Dy() != h {
		t.Fatalf("screenshot is %dx%d, want %dx%d", b.Dx(), b.Dy(), w, h)
	}
	r, g, bl, _ := img.At(4, 4).RGBA()
	if r>>8 != 0x1d || g>>8 != 0x23 || bl>>8 != 0x30 {
		t.Errorf("top-left pixel is #%02x%02x%02x, want the header's #1d2330: the page's styles did not apply", r>>8, g>>8, bl>>8)
	}
	r, g, bl, _ = img.At(w-4, h-4).RGBA()
	if r>>8 != 0xff || g>>8 != 0xff || bl>>8 != 0xff {
		t.Errorf("bottom-right pixel is #%02x%02x%02x, want the page's white", r>>8, g>>8, bl>>8)
	}
}
