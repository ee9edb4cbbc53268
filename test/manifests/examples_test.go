package manifests

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpuscaler/gpuscaler/deploy/render"
	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// scalerAddress is where the examples' triggers find the chart's scaler Service.
const scalerAddress = render.Release + "." + render.Namespace + ".svc.cluster.local:9090"

// example is one folder of examples/ with its objects decoded strictly.
type example struct {
	dir  string
	objs []Object
}

// isManifest says d is a file of Kubernetes objects among the examples.
func isManifest(d fs.DirEntry) bool {
	if d.IsDir() || !(strings.HasSuffix(d.Name(), ".yaml") || strings.HasSuffix(d.Name(), ".yml")) {
		return false
	}
	// A collector's --sim-config holds no Kubernetes objects: collector/sim/config_test.go
	// checks it. Helm values (the gateway's) are rendered and checked by the cases that
	// name them (render.go, TestGatewayExample).
	return d.Name() != "sim-config.yaml" && !strings.HasSuffix(d.Name(), "-values.yaml")
}

func examples(t *testing.T) []example {
	t.Helper()
	base := filepath.Join(root(t), "examples")
	byDir := map[string][]Object{}
	err := filepath.WalkDir(base, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !isManifest(d) {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(filepath.Dir(base), path)
		objs, err := DecodeAll(rel, data)
		if err != nil {
			return err
		}
		byDir[filepath.Dir(rel)] = append(byDir[filepath.Dir(rel)], objs...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []example
	for dir, objs := range byDir {
		out = append(out, example{dir, objs})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].dir < out[j].dir })
	if len(out) < 2 {
		t.Fatalf("got example folders %v, want inference-scale-to-zero and training-queue at least", out)
	}
	return out
}

// TestExamples decodes every example object strictly into its Kubernetes or KEDA v2.21.0
// type (in examples), and checks each folder holds together: KEDA's own validation passes,
// triggers point at the chart's scaler with the chart's ClusterTriggerAuthentication (or a
// TriggerAuthentication in the folder), a scaleTargetRef or namespace named is in the
// folder, a podSelector selects the workload's pods.
func TestExamples(t *testing.T) {
	for _, ex := range examples(t) {
		t.Run(ex.dir, func(t *testing.T) {
			namespaces := map[string]bool{}
			for _, ns := range all[*corev1.Namespace](ex.objs) {
				namespaces[ns.Name] = true
			}
			for _, o := range ex.objs {
				m, _ := meta.Accessor(o.Obj)
				if ns := m.GetNamespace(); ns != "" && !namespaces[ns] {
					t.Errorf("%s: got namespace %s, not created in %s (kubectl apply -f %s/ should work)", o.Source, ns, ex.dir, ex.dir)
				}
			}
			for _, so := range all[*kedav1alpha1.ScaledObject](ex.objs) {
				checkScaledObject(t, ex, so)
			}
			for _, sj := range all[*kedav1alpha1.ScaledJob](ex.objs) {
				checkScaledJob(t, ex, sj)
			}
			for _, ta := range all[*kedav1alpha1.TriggerAuthentication](ex.objs) {
				if _, err := ta.ValidateCreate(new(bool)); err != nil {
					t.Errorf("TriggerAuthentication %s: KEDA's webhook rejects it: %v", ta.Name, err)
				}
			}
		})
	}
}

func checkScaledObject(t *testing.T, ex example, so *kedav1alpha1.ScaledObject) {
	t.Helper()
	where := "ScaledObject " + so.Name
	for _, check := range []func(*kedav1alpha1.ScaledObject) error{
		func(so *kedav1alpha1.ScaledObject) error { return kedav1alpha1.ValidateTriggers(so.Spec.Triggers) },
		kedav1alpha1.CheckReplicaCountBoundsAreValid,
		kedav1alpha1.CheckFallbackValid,
	} {
		if err := check(so); err != nil {
			t.Errorf("%s: KEDA's validation rejects it: %v", where, err)
		}
	}
	ref := so.Spec.ScaleTargetRef
	var target *appsv1.Deployment
	for _, d := range all[*appsv1.Deployment](ex.objs) {
		if d.Name == ref.Name && d.Namespace == so.Namespace && (ref.Kind == "" || ref.Kind == "Deployment") {
			target = d
		}
	}
	if target == nil {
		t.Fatalf("%s: got scaleTargetRef %s, want a Deployment of that name in %s", where, ref.Name, ex.dir)
	}
	for i, tr := range so.Spec.Triggers {
		checkTrigger(t, ex, fmt.Sprintf("%s trigger %d", where, i), so.Namespace, tr)
		if sel, ok := tr.Metadata["podSelector"]; ok {
			s, err := labels.Parse(sel)
			if err != nil || !s.Matches(labels.Set(target.Spec.Template.Labels)) {
				t.Errorf("%s trigger %d: got podSelector %q (%v), want it to select %s's pods %v",
					where, i, sel, err, target.Name, target.Spec.Template.Labels)
			}
		}
	}
}

func checkScaledJob(t *testing.T, ex example, sj *kedav1alpha1.ScaledJob) {
	t.Helper()
	where := "ScaledJob " + sj.Name
	if _, err := sj.ValidateCreate(new(bool)); err != nil {
		t.Errorf("%s: KEDA's webhook rejects it: %v", where, err)
	}
	if len(sj.Spec.Triggers) != 1 {
		t.Errorf("%s: got %d triggers, want one: KEDA divides a ScaledJob's first metric by the average target of all", where, len(sj.Spec.Triggers))
	}
	pod := sj.Spec.JobTargetRef.Template.Spec
	for i, tr := range sj.Spec.Triggers {
		checkTrigger(t, ex, fmt.Sprintf("%s trigger %d", where, i), sj.Namespace, tr)
		if tr.Metadata["capacityAware"] != "true" {
			continue
		}
		// The reported backlog counts running work; KEDA's default strategy subtracts
		// running Jobs, accurate does not (examples/training-queue/README.md).
		if s := sj.Spec.ScalingStrategy.Strategy; s != "" && s != "default" {
			t.Errorf("%s: got scalingStrategy %q with capacityAware, want default", where, s)
		}
		gpus := pod.Containers[0].Resources.Limits["nvidia.com/gpu"]
		if got := tr.Metadata["gpusPerReplica"]; got != gpus.String() {
			t.Errorf("%s: got gpusPerReplica %q, want the Job's nvidia.com/gpu limit %s", where, got, gpus.String())
		}
		sel, err := labels.Parse(tr.Metadata["nodeSelector"])
		if err != nil || !sel.Matches(labels.Set(pod.NodeSelector)) {
			t.Errorf("%s: got trigger nodeSelector %q, want it to match the Job's nodeSelector %v", where, tr.Metadata["nodeSelector"], pod.NodeSelector)
		}
		// KEDA subtracts only the unfinished Jobs beyond minReplicaCount
		// (getScalingDecision, pkg/scaling/executor/scale_jobs.go); the scaler cannot see
		// the ScaledJob, so the trigger repeats it.
		if got := cmp.Or(tr.Metadata["minReplicaCount"], "0"); got != strconv.FormatInt(sj.MinReplicaCount(), 10) {
			t.Errorf("%s: got trigger minReplicaCount %q, want the ScaledJob's %d", where, got, sj.MinReplicaCount())
		}
		// The Jobs' pods carry the label KEDA gives them (generateJobs) beside the
		// template's own.
		if ps, ok := tr.Metadata["podSelector"]; ok {
			podLabels := labels.Set{"scaledjob.keda.sh/name": sj.Name}
			maps.Copy(podLabels, sj.Spec.JobTargetRef.Template.Labels)
			if s, err := labels.Parse(ps); err != nil || !s.Matches(podLabels) {
				t.Errorf("%s: got podSelector %q (%v), want it to select the Jobs' pods %v", where, ps, err, podLabels)
			}
		}
	}
}

func checkTrigger(t *testing.T, ex example, where, namespace string, tr kedav1alpha1.ScaleTriggers) {
	t.Helper()
	if tr.Type != "external" && tr.Type != "external-push" {
		return
	}
	if got := tr.Metadata["scalerAddress"]; got != scalerAddress {
		t.Errorf("%s: got scalerAddress %q, want the chart's Service %q", where, got, scalerAddress)
	}
	// The chart's scaler serves gRPC mutual TLS by default: a trigger without KEDA's
	// client certificate gets nothing from it.
	ref := tr.AuthenticationRef
	if ref == nil {
		t.Errorf("%s: got no authenticationRef, want the chart's ClusterTriggerAuthentication %s (gRPC mutual TLS is the chart's default)", where, chartCTA(t))
		return
	}
	if ref.Kind == "ClusterTriggerAuthentication" {
		if ref.Name != chartCTA(t) {
			t.Errorf("%s: got ClusterTriggerAuthentication %s, want the chart's, %s", where, ref.Name, chartCTA(t))
		}
		return
	}
	for _, ta := range all[*kedav1alpha1.TriggerAuthentication](ex.objs) {
		if ta.Name != ref.Name || ta.Namespace != namespace {
			continue
		}
		var params []string
		for _, s := range ta.Spec.SecretTargetRef {
			params = append(params, s.Parameter)
		}
		slices.Sort(params)
		if want := []string{"caCert", "tlsClientCert", "tlsClientKey"}; !slices.Equal(params, want) {
			t.Errorf("%s: got TriggerAuthentication %s parameters %v, want %v (what KEDA's external scaler reads)", where, ta.Name, params, want)
		}
		return
	}
	t.Errorf("%s: got authenticationRef %s, want a TriggerAuthentication of that name in %s", where, ref.Name, ex.dir)
}

// chartCTA is the name of the chart's ClusterTriggerAuthentication with its default values.
func chartCTA(t *testing.T) string {
	t.Helper()
	vals, err := chartutil.ReadValuesFile(filepath.Join(root(t), render.ChartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	name, err := vals.PathValue("keda.clusterTriggerAuthentication.name")
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(name)
}

// TestExampleTriggersAgainstScaler starts the gpuscaler binary and asks it, as KEDA does,
// for the metric specs of every external trigger in the examples: their metadata must
// be accepted, and give the metrics the READMEs describe.
func TestExampleTriggersAgainstScaler(t *testing.T) {
	want := map[string][]string{ // trigger name (or object name) -> metric names
		"requests": {"queue-backlog", "gpu-util"},
		"trainer":  {"queue-backlog"},
	}
	client := startScaler(t)
	var seen []string
	for _, ex := range examples(t) {
		type ref struct {
			name, namespace string
			triggers        []kedav1alpha1.ScaleTriggers
		}
		var refs []ref
		for _, so := range all[*kedav1alpha1.ScaledObject](ex.objs) {
			refs = append(refs, ref{so.Name, so.Namespace, so.Spec.Triggers})
		}
		for _, sj := range all[*kedav1alpha1.ScaledJob](ex.objs) {
			refs = append(refs, ref{sj.Name, sj.Namespace, sj.Spec.Triggers})
		}
		for _, r := range refs {
			for i, tr := range r.triggers {
				if tr.Type != "external" && tr.Type != "external-push" {
					continue
				}
				name := cmpOr(tr.Name, r.name)
				t.Run(ex.dir+"/"+r.name+"/"+strconv.Itoa(i), func(t *testing.T) {
					ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
					defer cancel()
					resp, err := client.GetMetricSpec(ctx, &externalscaler.ScaledObjectRef{
						Name: r.name, Namespace: r.namespace, ScalerMetadata: tr.Metadata,
					})
					if err != nil {
						t.Fatalf("GetMetricSpec with %v: %v", tr.Metadata, err)
					}
					var got []string
					for _, m := range resp.GetMetricSpecs() {
						got = append(got, m.GetMetricName())
					}
					if !slices.Equal(got, want[name]) {
						t.Errorf("got metrics %v, want %v", got, want[name])
					}
				})
				seen = append(seen, name)
			}
		}
	}
	for name := range want {
		if !slices.Contains(seen, name) {
			t.Errorf("got no trigger %s in the examples, want it checked", name)
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// startScaler runs `gpuscaler scaler` with its embedded NATS on loopback, waits until it
// is ready, and returns a client of its ExternalScaler service (KEDA's generated code).
func startScaler(t *testing.T) externalscaler.ExternalScalerClient {
	t.Helper()
	conn, err := grpc.NewClient(startScalerBinary(t), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return externalscaler.NewExternalScalerClient(conn)
}

// startScalerBinary runs `gpuscaler scaler` with its embedded NATS on loopback, waits
// until it is ready, and returns its gRPC address.
func startScalerBinary(t *testing.T) string {
	t.Helper()
	grpcAddr, httpAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	runArgs(t, corev1.Container{Args: []string{"scaler", "--grpc-addr=" + grpcAddr, "--http-addr=" + httpAddr,
		"--embedded-nats-addr=127.0.0.1:0", "--data-dir=" + t.TempDir(), "--log-level=warn"}}, nil, nil)
	waitHTTP(t, "http://"+httpAddr+"/readyz", func(string) bool { return true })
	return grpcAddr
}

// TestExplainReadsExamplesAsKEDA runs `gpuscaler explain --file` on every example file
// that holds a ScaledObject or ScaledJob, and checks it explains exactly the external
// triggers KEDA's own types decode from it, in order, with the same namespace, name and
// metadata. explain reads KEDA objects with a small decoder of its own (internal/kedaobj)
// rather than KEDA's types, which would add controller-runtime to the binary: this is
// what keeps the two readings one.
func TestExplainReadsExamplesAsKEDA(t *testing.T) {
	addr := startScalerBinary(t)
	bin := gpuscalerBinary(t)
	base := filepath.Join(root(t), "examples")
	checked := 0
	err := filepath.WalkDir(base, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !isManifest(d) {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		objs, err := DecodeAll(path, data)
		if err != nil {
			return err
		}
		type trigger struct {
			Kind, Namespace, Name, Type string
			Trigger                     int
			Metadata                    map[string]string
		}
		var want []trigger
		for _, o := range objs {
			var (
				kind, ns, name string
				triggers       []kedav1alpha1.ScaleTriggers
			)
			switch obj := o.Obj.(type) {
			case *kedav1alpha1.ScaledObject:
				kind, ns, name, triggers = "ScaledObject", obj.Namespace, obj.Name, obj.Spec.Triggers
			case *kedav1alpha1.ScaledJob:
				kind, ns, name, triggers = "ScaledJob", obj.Namespace, obj.Name, obj.Spec.Triggers
			default:
				continue
			}
			for i, tr := range triggers {
				if tr.Type == "external" || tr.Type == "external-push" {
					want = append(want, trigger{kind, cmpOr(ns, "default"), name, tr.Type, i, tr.Metadata})
				}
			}
		}
		if len(want) == 0 {
			return nil
		}
		checked++
		out, err := exec.Command(bin, "explain", "--file", path, "--scaler-address", addr, "-o", "json").Output()
		if err != nil {
			t.Errorf("gpuscaler explain --file %s: %v", path, err)
			return nil
		}
		var got []trigger
		if err := json.Unmarshal(out, &got); err != nil {
			t.Errorf("gpuscaler explain --file %s printed %q: %v", path, out, err)
			return nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("gpuscaler explain --file %s explained\n%+v\nKEDA's types decode\n%+v", path, got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 2 {
		t.Errorf("checked %d example files, want the ScaledObject and the ScaledJob at least", checked)
	}
}

// TestGatewayExample: the inference example's gateway holds together with the rest of
// the folder: each route forwards to a Service of the folder, on a port it serves, whose
// pods are a Deployment a ScaledObject scales on the route's queue; and every queue
// trigger there has a route that reports it. gateway.yaml is the chart rendered with
// gateway-values.yaml (TestGolden), and TestGatewayChart checks the rendering.
func TestGatewayExample(t *testing.T) {
	const dir = "examples/inference-scale-to-zero"
	var ex example
	for _, e := range examples(t) {
		if e.dir == dir {
			ex = e
		}
	}
	var c render.Case
	for _, gc := range render.GatewayCases {
		if filepath.Dir(gc.Out) == dir {
			c = gc
		}
	}
	if ex.dir == "" || c.Name == "" {
		t.Fatalf("got folder %q and gateway case %q, want %s and its gateway rendered into it", ex.dir, c.Name, dir)
	}
	if want := []string{dir + "/gateway-values.yaml"}; !slices.Equal(c.Values, want) {
		t.Errorf("got the example's gateway rendered from %v, want %v", c.Values, want)
	}
	g := findGateway(t, c, caseObjects(t, c))
	if len(g.routes.Routes) == 0 {
		t.Fatal("got no routes in the example's gateway")
	}
	dep, ok := find[*appsv1.Deployment](ex.objs, c.ReleaseName())
	if !ok || dep.Namespace != c.ReleaseNamespace() {
		t.Fatalf("got no Deployment %s/%s in %s: gateway.yaml is to be applied with the rest", c.ReleaseNamespace(), c.ReleaseName(), dir)
	}

	// Queues the ScaledObjects scale on, by the Deployment they scale.
	queues := map[string]string{} // queue -> Deployment
	for _, so := range all[*kedav1alpha1.ScaledObject](ex.objs) {
		for _, tr := range so.Spec.Triggers {
			if q := tr.Metadata["queue"]; (tr.Type == "external" || tr.Type == "external-push") && q != "" {
				queues[q] = so.Spec.ScaleTargetRef.Name
			}
		}
	}
	routed := map[string]bool{}
	for _, r := range g.routes.Routes {
		where := "route " + r.Name
		routed[r.Queue] = true
		target, ok := queues[r.Queue]
		if !ok {
			t.Errorf("%s: got queue %q, which no ScaledObject in %s scales on (its triggers' queues: %v)", where, r.Queue, dir, slices.Sorted(maps.Keys(queues)))
			continue
		}
		var svc *corev1.Service
		for _, s := range all[*corev1.Service](ex.objs) {
			if s.Name == r.Service.Name && s.Namespace == c.ReleaseNamespace() {
				svc = s
			}
		}
		if svc == nil {
			t.Errorf("%s: got Service %s, not in %s (namespace %s)", where, r.Service.Name, dir, c.ReleaseNamespace())
			continue
		}
		var port *corev1.ServicePort
		for i, p := range svc.Spec.Ports {
			if p.Port == r.Service.Port {
				port = &svc.Spec.Ports[i]
			}
		}
		if port == nil {
			t.Errorf("%s: got port %d, which Service %s does not serve (%v)", where, r.Service.Port, svc.Name, svc.Spec.Ports)
			continue
		}
		var server *appsv1.Deployment
		for _, d := range all[*appsv1.Deployment](ex.objs) {
			if d.Name == target && d.Namespace == svc.Namespace {
				server = d
			}
		}
		if server == nil {
			t.Errorf("%s: got queue %q scaling Deployment %s, not in %s", where, r.Queue, target, dir)
			continue
		}
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(server.Spec.Template.Labels)) {
			t.Errorf("%s: got Service %s selecting %v, want the pods of %s, which the queue's ScaledObject scales (%v)", where, svc.Name, svc.Spec.Selector, server.Name, server.Spec.Template.Labels)
		}
		var served bool
		for _, ctr := range server.Spec.Template.Spec.Containers {
			for _, p := range ctr.Ports {
				served = served || p.Name == port.TargetPort.String() || p.ContainerPort == int32(port.TargetPort.IntValue())
			}
		}
		if !served {
			t.Errorf("%s: got Service %s port %d to targetPort %s, which %s's containers do not declare", where, svc.Name, port.Port, port.TargetPort.String(), server.Name)
		}
		if server.Spec.Template.Spec.Containers[0].ReadinessProbe == nil {
			t.Errorf("%s: got %s without a readiness probe, want one: the gateway forwards once an endpoint is ready, and a pod without a probe is ready before it serves", where, server.Name)
		}
		if d, err := time.ParseDuration(r.HoldTimeout); err != nil || d < time.Minute {
			t.Errorf("%s: got holdTimeout %q (%v), want a minute or more: a cold start loads a model", where, r.HoldTimeout, err)
		}
	}
	for q := range queues {
		if !routed[q] {
			t.Errorf("got a ScaledObject on queue %q, which no route of the gateway reports: it would never wake", q)
		}
	}
}

// TestExampleApplyCommand: the inference example's README applies every file of objects
// in its folder, the namespace first (kubectl applies in the order given), and not the
// gateway's Helm values.
func TestExampleApplyCommand(t *testing.T) {
	dir := filepath.Join(root(t), "examples/inference-scale-to-zero")
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for line := range strings.SplitSeq(string(readme), "\n") {
		if rest, ok := strings.CutPrefix(line, "kubectl apply "); ok {
			for _, f := range strings.Fields(rest) {
				if f != "-f" {
					files = append(files, f)
				}
			}
			break
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, e := range entries {
		if isManifest(e) {
			want = append(want, e.Name())
		}
	}
	if len(files) == 0 || files[0] != "namespace.yaml" {
		t.Errorf("got kubectl apply of %v, want namespace.yaml first", files)
	}
	if got := slices.Sorted(slices.Values(files)); !slices.Equal(got, want) {
		t.Errorf("got kubectl apply of %v, want every file of objects in the folder: %v", got, want)
	}
}
