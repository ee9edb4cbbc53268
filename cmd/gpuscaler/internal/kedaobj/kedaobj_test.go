package kedaobj

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestExamples reads the project's own examples: every external trigger, in order, with
// its metadata as written.
func TestExamples(t *testing.T) {
	read := func(path string) []byte {
		data, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "examples", path))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	got, err := External(read("inference-scale-to-zero/scaledobject.yaml"), "")
	if err != nil {
		t.Fatal(err)
	}
	// One trigger on the queue and the pods' GPUs (a trigger with only podSelector beside
	// it would keep the service from reaching zero).
	if len(got) != 1 || got[0].Kind != "ScaledObject" || got[0].Namespace != "inference" || got[0].Name != "llm-server" ||
		got[0].Type != "external-push" || got[0].TrigName != "requests" || got[0].Metadata["queueTarget"] != "4" ||
		got[0].Index != 0 || got[0].Metadata["podSelector"] != "app.kubernetes.io/name=llm-server" {
		t.Errorf("scaledobject.yaml: got %+v", got)
	}
	// Its fallback (2 replicas) is what the docs advise, and still changes what an
	// Unavailable answer does: the one warning.
	for _, tr := range got {
		if len(tr.Warnings) != 1 || !strings.Contains(tr.Warnings[0], "sets 2 replicas; a workload at zero is woken") {
			t.Errorf("the example's trigger %d: warnings %q, want the fallback's alone", tr.Index, tr.Warnings)
		}
	}
	got, err = External(read("training-queue/scaledjob.yaml"), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Kind != "ScaledJob" || got[0].Metadata["stream"] != "TRAINING" || got[0].Metadata["nodeSelector"] != "pool=a100" {
		t.Errorf("scaledjob.yaml: got %+v", got)
	}
}

func TestStreams(t *testing.T) {
	const so = `apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: web}
spec:
  triggers:
    - type: cpu
      metadata: {value: "50"}
    - type: external
      metadata: {queue: q, podSelector: "app in (a,b)"}
`
	tests := map[string]struct {
		data, ns string
		want     []Trigger
		wantErr  string
	}{
		"a Deployment beside the ScaledObject, namespace filled in": {
			data: "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n---\n" + so, ns: "ml",
			want: []Trigger{{Kind: "ScaledObject", Namespace: "ml", Name: "web", Index: 1, Type: "external", Metadata: map[string]string{"queue": "q", "podSelector": "app in (a,b)"}}},
		},
		"no namespace anywhere": {
			data: so,
			want: []Trigger{{Kind: "ScaledObject", Namespace: "default", Name: "web", Index: 1, Type: "external", Metadata: map[string]string{"queue": "q", "podSelector": "app in (a,b)"}}},
		},
		"JSON, as kubectl -o json prints it": {
			data: `{"apiVersion":"keda.sh/v1alpha1","kind":"ScaledJob","metadata":{"name":"j","namespace":"t"},"spec":{"triggers":[{"type":"external-push","metadata":{"queue":"q"}}]}}`,
			want: []Trigger{{Kind: "ScaledJob", Namespace: "t", Name: "j", Type: "external-push", Metadata: map[string]string{"queue": "q"}}},
		},
		"empty documents and comments are skipped": {
			data: "---\n# nothing\n---\n" + so,
			want: []Trigger{{Kind: "ScaledObject", Namespace: "default", Name: "web", Index: 1, Type: "external", Metadata: map[string]string{"queue": "q", "podSelector": "app in (a,b)"}}},
		},
		"only a Deployment":               {data: "apiVersion: apps/v1\nkind: Deployment\n", wantErr: "no keda.sh/v1alpha1 ScaledObject or ScaledJob in it (found Deployment (apps/v1))"},
		"empty":                           {data: "", wantErr: "(found no document)"},
		"a ScaledObject of another group": {data: "apiVersion: example.com/v1\nkind: ScaledObject\n", wantErr: "found ScaledObject (example.com/v1)"},
		"no external trigger": {
			data:    "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata: {name: web, namespace: ml}\nspec:\n  triggers:\n    - type: cpu\n",
			wantErr: "document 1: ScaledObject ml/web has no external or external-push trigger",
		},
		"metadata not strings": {
			data:    "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nspec:\n  triggers:\n    - type: external\n      metadata: {queueTarget: {a: 1}}\n",
			wantErr: "document 1:",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := External([]byte(tc.data), tc.ns)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %+v, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// FuzzExternal: any input gives triggers or an error, never a panic, and every trigger
// returned is an external one with a namespace.
func FuzzExternal(f *testing.F) {
	for _, p := range []string{"inference-scale-to-zero/scaledobject.yaml", "training-queue/scaledjob.yaml"} {
		if data, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "examples", p)); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(`{"apiVersion":"keda.sh/v1alpha1","kind":"ScaledJob","spec":{"triggers":[{"type":"external"}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := External(data, "")
		if err != nil {
			return
		}
		if len(got) == 0 {
			t.Fatal("no trigger and no error")
		}
		for _, tr := range got {
			if tr.Namespace == "" || (tr.Type != "external" && tr.Type != "external-push") {
				t.Fatalf("trigger %+v", tr)
			}
		}
	})
}

// TestWarnings: each KEDA setting that changes what the scaler's answers do is named,
// with what KEDA v2.21.0 and the HPA then do (the code each follows is cited in
// warnings); an object without them has none.
func TestWarnings(t *testing.T) {
	const head = "apiVersion: keda.sh/v1alpha1\nkind: %s\nmetadata: {name: llm, namespace: ml}\nspec:\n"
	trigger := "  triggers:\n  - type: external-push\n    %s\n    metadata: {scalerAddress: s:9090, queue: q%s}\n"
	const capacity = ", capacityAware: \"true\", gpusPerReplica: \"1\""
	for _, c := range []struct {
		name, kind, spec, metricType, metadata string
		want                                   []string // a substring of each warning, in order
	}{
		{name: "plain", kind: "ScaledObject"},
		{name: "metricType AverageValue", kind: "ScaledObject", metricType: "metricType: AverageValue"},
		{name: "metricType Value", kind: "ScaledObject", metricType: "metricType: Value", want: []string{"multiplies value/target by the ready pods"}},
		{name: "ScaledJob metricType Value", kind: "ScaledJob", metricType: "metricType: Value", want: []string{"creates no Jobs"}},
		{name: "scalingModifiers", kind: "ScaledObject",
			spec: "  advanced: {scalingModifiers: {formula: \"s0 + s1\", target: \"2\", activationTarget: \"1.5\"}}\n",
			want: []string{"formula's value > activationTarget (1.5)"}},
		{name: "scalingModifiers Value", kind: "ScaledObject",
			spec: "  advanced: {scalingModifiers: {formula: \"s0\", target: \"2\", metricType: Value}}\n",
			want: []string{"activationTarget (0)", "scalingModifiers.metricType Value"}},
		{name: "fallback 3", kind: "ScaledObject", spec: "  fallback: {failureThreshold: 3, replicas: 3}\n",
			want: []string{"after 3 failures KEDA counts the trigger active and sets 3 replicas"}},
		{name: "fallback currentReplicas", kind: "ScaledObject", spec: "  fallback: {failureThreshold: 3, replicas: 2, behavior: currentReplicas}\n",
			want: []string{"keeps the current replicas;"}},
		{name: "fallback 0, long cooldown", kind: "ScaledObject", spec: "  fallback: {failureThreshold: 3, replicas: 0}\n",
			want: []string{"the HPA goes to its minimum, 1", "takes the failing trigger as idle"}},
		{name: "fallback 0, short cooldown", kind: "ScaledObject", spec: "  cooldownPeriod: 60\n  pollingInterval: 30\n  fallback: {failureThreshold: 3, replicas: 0}\n",
			want: []string{"the HPA goes to its minimum, 1", "takes the failing trigger as idle", "can scale the workload to zero before the fallback applies"}},
		{name: "ScaledJob fallback ignored", kind: "ScaledJob", spec: "  fallback: {failureThreshold: 3, replicas: 0}\n"},
		{name: "fallback beside modifiers with a fractional target", kind: "ScaledObject",
			spec: "  advanced: {scalingModifiers: {formula: \"s0\", target: \"1.5\"}}\n  fallback: {failureThreshold: 3, replicas: 2}\n",
			want: []string{"activationTarget (0)", "KEDA never applies it here"}},
		{name: "fallback behavior scalingModifiers", kind: "ScaledObject",
			spec: "  advanced: {scalingModifiers: {formula: \"s0 ?? 1\", target: \"2\"}}\n  fallback: {failureThreshold: 3, replicas: 2, behavior: scalingModifiers}\n",
			want: []string{"activationTarget (0)", "hands the formula the failing metric as missing"}},
		// A capacityAware ScaledJob: its minReplicaCount repeated in the trigger, and the
		// default strategy (pkg/scaling/executor/scale_jobs.go, getScalingDecision).
		{name: "capacityAware, no standby", kind: "ScaledJob", metadata: capacity},
		{name: "capacityAware, minReplicaCount repeated", kind: "ScaledJob", spec: "  minReplicaCount: 2\n  scalingStrategy: {strategy: default}\n",
			metadata: capacity + ", minReplicaCount: \"2\""},
		{name: "capacityAware, minReplicaCount not repeated", kind: "ScaledJob", spec: "  minReplicaCount: 2\n", metadata: capacity,
			want: []string{`the ScaledJob's is 2 and the capacityAware trigger's 0`}},
		{name: "capacityAware, accurate", kind: "ScaledJob", spec: "  scalingStrategy: {strategy: accurate}\n", metadata: capacity,
			want: []string{"scalingStrategy accurate: capacityAware's cap is made for the default strategy"}},
		{name: "not capacityAware, accurate", kind: "ScaledJob", spec: "  minReplicaCount: 2\n  scalingStrategy: {strategy: accurate}\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			doc := fmt.Sprintf(head, c.kind) + c.spec + fmt.Sprintf(trigger, c.metricType, c.metadata)
			got, err := External([]byte(doc), "")
			if err != nil {
				t.Fatal(err)
			}
			w := got[0].Warnings
			if len(w) != len(c.want) {
				t.Fatalf("warnings %q, want %d", w, len(c.want))
			}
			for i, sub := range c.want {
				if !strings.Contains(w[i], sub) {
					t.Errorf("warning %d = %q, want it to say %q", i, w[i], sub)
				}
			}
		})
	}
}

// TestWarningsPodSelectorOnly: a trigger with only podSelector is always active (the
// scaler's answer, so that it never reaches a zero it could not wake from), which keeps
// the ScaledObject at 1 or more, beside other triggers too.
func TestWarningsPodSelectorOnly(t *testing.T) {
	const head = "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata: {name: llm, namespace: ml}\nspec:\n  triggers:\n"
	gpu := "  - type: external-push\n    metadata: {scalerAddress: s:9090, podSelectorFromEnv: SEL, gpuUtilTarget: \"60\"}\n"
	queue := "  - type: external-push\n    metadata: {scalerAddress: s:9090, queue: q}\n"
	both := "  - type: external-push\n    metadata: {scalerAddress: s:9090, queue: q, podSelector: app=llm, gpuUtilTarget: \"60\"}\n"
	for _, c := range []struct {
		name, triggers string
		want           []string // per trigger: a substring of its one warning, or "" for none
	}{
		{"alone", gpu, []string{"KEDA keeps at least 1 replica"}},
		{"beside a queue trigger", queue + gpu, []string{"", "never scales to zero whatever its other triggers say"}},
		{"one trigger with both", both, []string{""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := External([]byte(head+c.triggers), "")
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range c.want {
				w := got[i].Warnings
				if want == "" && len(w) != 0 || want != "" && (len(w) != 1 || !strings.Contains(w[0], want)) {
					t.Errorf("trigger %d: warnings %q, want %q", i, w, want)
				}
			}
		})
	}
}

// TestWarningsPushInterval: a pushInterval (30s by default) longer than the
// ScaledObject's cooldownPeriod is named; one within it, or a ScaledJob's, is not.
func TestWarningsPushInterval(t *testing.T) {
	for _, c := range []struct {
		name, doc, want string
	}{
		{"default against a 10s cooldown", "kind: ScaledObject\nmetadata: {name: a}\nspec:\n  cooldownPeriod: 10\n  triggers:\n  - type: external-push\n    metadata: {queue: q}\n", "pushInterval 30s is longer than cooldownPeriod 10s"},
		{"given, within the cooldown", "kind: ScaledObject\nmetadata: {name: a}\nspec:\n  cooldownPeriod: 10\n  triggers:\n  - type: external-push\n    metadata: {queue: q, pushInterval: 5s}\n", ""},
		{"default against KEDA's default cooldown", "kind: ScaledObject\nmetadata: {name: a}\nspec:\n  triggers:\n  - type: external-push\n    metadata: {queue: q}\n", ""},
		{"a ScaledJob", "kind: ScaledJob\nmetadata: {name: a}\nspec:\n  triggers:\n  - type: external\n    metadata: {queue: q}\n", ""},
	} {
		t.Run(c.name, func(t *testing.T) { wantOneWarning(t, c.doc, c.want) })
	}
}

// TestWarningsScaleUpTolerance: a queue-demand trigger whose scaleUpTolerance is not the
// scale-up tolerance of the ScaledObject's HPA is named, compared as numbers (the HPA's
// is a Kubernetes quantity, written as a number or a string); an HPA without one of its
// own has the cluster's, unseen, so only a trigger that gives another is named.
func TestWarningsScaleUpTolerance(t *testing.T) {
	so := func(behavior, metadata string) string {
		doc := "kind: ScaledObject\nmetadata: {name: a}\nspec:\n"
		if behavior != "" {
			doc += "  advanced:\n    horizontalPodAutoscalerConfig:\n      behavior:\n        scaleUp: {tolerance: " + behavior + "}\n"
		}
		return doc + "  triggers:\n  - type: external-push\n    metadata: {" + metadata + "}\n"
	}
	for _, c := range []struct {
		name, doc, want string
	}{
		{"the HPA's 50%, the trigger's default", so(`"500m"`, "queue: q, targetWait: 10s"),
			`the HPA tolerates 50% scaling up and the trigger's scaleUpTolerance is 10%; a wait missed now raises the metric past the trigger's only, which the HPA leaves as it is, and the queue stands: give the trigger scaleUpTolerance: "500m"`},
		{"the HPA's 5%, the trigger's default", so("0.05", "queue: q, targetWait: 10s"), "further past the HPA's tolerance than it needs"},
		{"repeated, as a number", so("0.2", "queue: q, targetWait: 10s, scaleUpTolerance: '0.2'"), ""},
		{"repeated, in thousandths", so(`"200m"`, "queue: q, targetWait: 10s, scaleUpTolerance: '0.2'"), ""},
		{"the trigger's 20%, no HPA tolerance", so("", "queue: q, targetWait: 10s, scaleUpTolerance: '0.2'"), "right only where the cluster's is 20%"},
		{"the trigger's 10%, no HPA tolerance", so("", "queue: q, targetWait: 10s, scaleUpTolerance: '100m'"), ""},
		{"the trigger's 10% in micro", so("", "queue: q, targetWait: 10s, scaleUpTolerance: '100000u'"), ""},
		{"0.3 and 300m, whose floats differ", so("0.3", "queue: q, targetWait: 10s, scaleUpTolerance: '300m'"), ""},
		{"300m and 0.3", so(`"300m"`, "queue: q, targetWait: 10s, scaleUpTolerance: '0.3'"), ""},
		{"the HPA's 2, beyond a share", so("2", "queue: q, targetWait: 10s"), "more than 3 times those running"},
		{"neither", so("", "queue: q, targetWait: 10s"), ""},
		{"queue-backlog does not read it", so(`"500m"`, "queue: q"), ""},
		{"from the environment", so(`"500m"`, "queue: q, targetWait: 10s, scaleUpToleranceFromEnv: TOL"), ""},
	} {
		t.Run(c.name, func(t *testing.T) { wantOneWarning(t, c.doc, c.want) })
	}
}

// wantOneWarning reads the keda.sh/v1alpha1 object doc and checks its first trigger's
// warnings: none when want is empty, else one that contains want.
func wantOneWarning(t *testing.T, doc, want string) {
	t.Helper()
	got, err := External([]byte("apiVersion: keda.sh/v1alpha1\n"+doc), "")
	if err != nil {
		t.Fatal(err)
	}
	w := got[0].Warnings
	if want == "" && len(w) != 0 || want != "" && (len(w) != 1 || !strings.Contains(w[0], want)) {
		t.Errorf("warnings %q, want %q", w, want)
	}
}
