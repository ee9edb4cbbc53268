package manifests

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpuscaler/gpuscaler/deploy/render"
)

// workload is a pod template and what owns it.
type workload struct {
	kind, name string
	selector   *metav1.LabelSelector
	pod        *corev1.PodTemplateSpec
	claims     []string // a StatefulSet's volumeClaimTemplates, volumes of its pods too
}

func workloads(objs []Object) []workload {
	var out []workload
	for _, o := range objs {
		switch v := o.Obj.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{kind: "Deployment", name: v.Name, selector: v.Spec.Selector, pod: &v.Spec.Template})
		case *appsv1.StatefulSet:
			w := workload{kind: "StatefulSet", name: v.Name, selector: v.Spec.Selector, pod: &v.Spec.Template}
			for _, c := range v.Spec.VolumeClaimTemplates {
				w.claims = append(w.claims, c.Name)
			}
			out = append(out, w)
		case *appsv1.DaemonSet:
			out = append(out, workload{kind: "DaemonSet", name: v.Name, selector: v.Spec.Selector, pod: &v.Spec.Template})
		case *batchv1.Job:
			out = append(out, workload{kind: "Job", name: v.Name, selector: v.Spec.Selector, pod: &v.Spec.Template})
		}
	}
	return out
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func find[T runtime.Object](objs []Object, name string) (T, bool) {
	var zero T
	for _, o := range objs {
		if v, ok := o.Obj.(T); ok {
			if m, ok := any(v).(metav1.Object); ok && (name == "" || m.GetName() == name) {
				return v, true
			}
		}
	}
	return zero, false
}

func all[T runtime.Object](objs []Object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.Obj.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// TestPodHardening: every container (init containers too) runs with a read-only root file
// system, no privilege escalation, every capability dropped, the runtime's seccomp
// profile, CPU and memory requests and a memory limit, and all but init containers have
// probes; all but the collector run as non-root.
func TestPodHardening(t *testing.T) {
	for _, c := range render.AllCases() {
		t.Run(c.Name, func(t *testing.T) {
			for _, w := range workloads(caseObjects(t, c)) {
				ps := w.pod.Spec.SecurityContext
				where := w.kind + " " + w.name
				if ps == nil || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
					t.Errorf("%s: got pod seccompProfile %v, want RuntimeDefault", where, ps)
				}
				collector := w.kind == "DaemonSet"
				if !collector && (ps == nil || !deref(ps.RunAsNonRoot, false)) {
					t.Errorf("%s: got runAsNonRoot unset or false, want true", where)
				}
				inits := len(w.pod.Spec.InitContainers)
				for i, ctr := range append(slices.Clone(w.pod.Spec.InitContainers), w.pod.Spec.Containers...) {
					where := where + " container " + ctr.Name
					sc := ctr.SecurityContext
					switch {
					case sc == nil:
						t.Errorf("%s: got no securityContext", where)
						continue
					case !deref(sc.ReadOnlyRootFilesystem, false):
						t.Errorf("%s: got readOnlyRootFilesystem false, want true", where)
					case deref(sc.AllowPrivilegeEscalation, true):
						t.Errorf("%s: got allowPrivilegeEscalation true or unset, want false", where)
					case deref(sc.Privileged, false):
						t.Errorf("%s: got privileged, want not", where)
					case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL"):
						t.Errorf("%s: got capabilities %v, want ALL dropped", where, sc.Capabilities)
					}
					if i >= inits && (ctr.LivenessProbe == nil || ctr.ReadinessProbe == nil) {
						t.Errorf("%s: got liveness %v, readiness %v, want both probes", where, ctr.LivenessProbe, ctr.ReadinessProbe)
					}
					req, lim := ctr.Resources.Requests, ctr.Resources.Limits
					if req.Cpu().IsZero() || req.Memory().IsZero() || lim.Memory().IsZero() {
						t.Errorf("%s: got requests %v, limits %v, want CPU and memory requests and a memory limit", where, req, lim)
					}
				}
			}
		})
	}
}

// TestServicesReachPods: every Service selects the pods of a workload in the release, and
// each of its target ports names a port those pods declare.
func TestServicesReachPods(t *testing.T) {
	for _, c := range render.AllCases() {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			ws := workloads(objs)
			for _, svc := range all[*corev1.Service](objs) {
				var matched *workload
				for i, w := range ws {
					if len(svc.Spec.Selector) > 0 && labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(w.pod.Labels)) {
						matched = &ws[i]
					}
				}
				if matched == nil {
					t.Errorf("Service %s: got selector %v matching no workload's pods", svc.Name, svc.Spec.Selector)
					continue
				}
				ports := map[string]bool{}
				for _, ctr := range matched.pod.Spec.Containers {
					for _, p := range ctr.Ports {
						ports[p.Name] = true
					}
				}
				for _, p := range svc.Spec.Ports {
					if !ports[p.TargetPort.String()] {
						t.Errorf("Service %s port %s: got targetPort %s, want one of %s's ports %v",
							svc.Name, p.Name, p.TargetPort.String(), matched.name, slices.Sorted(maps.Keys(ports)))
					}
				}
			}
			for _, w := range ws {
				sel, err := metav1.LabelSelectorAsSelector(w.selector)
				if err != nil || !sel.Matches(labels.Set(w.pod.Labels)) {
					t.Errorf("%s %s: got selector %v not matching its own pod labels %v", w.kind, w.name, w.selector, w.pod.Labels)
				}
			}
		})
	}
}

// TestScalerForKEDA: what KEDA's round-robin gRPC client needs from the scaler.
func TestScalerForKEDA(t *testing.T) {
	for _, c := range render.Cases {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			dep, ok := find[*appsv1.Deployment](objs, render.Release)
			if !ok {
				t.Fatalf("got no Deployment %s", render.Release)
			}
			if got := deref(dep.Spec.Replicas, 1); got < 2 {
				t.Errorf("got %d scaler replicas, want at least 2", got)
			}
			svc, ok := find[*corev1.Service](objs, render.Release)
			if !ok {
				t.Fatalf("got no Service %s: scalerAddress is %s.%s.svc:<port>", render.Release, render.Release, render.Namespace)
			}
			if svc.Spec.ClusterIP != corev1.ClusterIPNone {
				t.Errorf("got Service clusterIP %q, want None (headless: KEDA's gRPC DNS resolver sees every replica)", svc.Spec.ClusterIP)
			}
			if svc.Spec.PublishNotReadyAddresses {
				t.Errorf("got publishNotReadyAddresses, want only ready (replayed) replicas listed")
			}
			if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(dep.Spec.Template.Labels)) {
				t.Errorf("got Service selector %v, want it to select the scaler's pods %v", svc.Spec.Selector, dep.Spec.Template.Labels)
			}
			var grpc bool
			for _, p := range svc.Spec.Ports {
				grpc = grpc || (p.Name == "grpc" && deref(p.AppProtocol, "") == "grpc")
			}
			if !grpc {
				t.Errorf("got Service ports %v, want a port named grpc with appProtocol grpc", svc.Spec.Ports)
			}
			pdb, ok := find[*policyv1.PodDisruptionBudget](objs, render.Release)
			if !ok {
				t.Fatalf("got no PodDisruptionBudget for the scaler")
			}
			sel, _ := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			if !sel.Matches(labels.Set(dep.Spec.Template.Labels)) {
				t.Errorf("got PDB selector %v, want it to select the scaler's pods", pdb.Spec.Selector)
			}
			if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() >= int(deref(dep.Spec.Replicas, 1)) {
				t.Errorf("got PDB minAvailable %v with %d replicas, want fewer than the replicas (or drains block)", pdb.Spec.MinAvailable, deref(dep.Spec.Replicas, 1))
			}
			pod := dep.Spec.Template.Spec
			ctr := pod.Containers[0]
			api := flagValue(ctr.Args, "kubeconfig") == "in-cluster"
			if got := deref(pod.AutomountServiceAccountToken, true); got != api {
				t.Errorf("got the scaler's API token mounted %v with --kubeconfig=%s, want it mounted only for in-cluster (it watches pods)", got, flagValue(ctr.Args, "kubeconfig"))
			}
			if p := ctr.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
				t.Errorf("got readiness probe %v, want GET /readyz", p)
			}
			if p := ctr.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
				t.Errorf("got liveness probe %v, want GET /healthz", p)
			}
			if args := strings.Join(ctr.Args, " "); !strings.Contains(args, "--nats-url=") {
				t.Errorf("got args %q, want --nats-url: without it every replica would start its own embedded NATS", args)
			}
		})
	}
}

// TestScalerRBAC: with --kubeconfig=in-cluster the scaler may list and watch pods and
// Nodes and nothing else (it believes a node only of the pods the API places on that
// node, and takes nodes' CPU and memory from the API); with --kubeconfig=none (always
// with the sim source, whose pods are made up) it reads no API and has no role.
func TestScalerRBAC(t *testing.T) {
	want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "nodes"}, Verbs: []string{"list", "watch"}}}
	for _, c := range render.Cases {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			dep, ok := find[*appsv1.Deployment](objs, render.Release)
			if !ok {
				t.Fatal("got no scaler Deployment")
			}
			pod := dep.Spec.Template.Spec
			ds, _ := find[*appsv1.DaemonSet](objs, "")
			sim := ds != nil && slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, "--source=sim")
			kubeconfig := flagValue(pod.Containers[0].Args, "kubeconfig")
			role, hasRole := find[*rbacv1.ClusterRole](objs, render.Release)
			if sim && kubeconfig != "none" {
				t.Errorf("got --kubeconfig=%s with the sim source, want none (its pods are in no API)", kubeconfig)
			}
			if kubeconfig == "none" {
				if hasRole {
					t.Errorf("got ClusterRole %s with --kubeconfig=none, want none", role.Name)
				}
				return
			}
			if !hasRole || kubeconfig != "in-cluster" {
				t.Fatalf("got ClusterRole %v and --kubeconfig=%s, want the scaler to check node reports against the API", hasRole, kubeconfig)
			}
			if fmt.Sprint(role.Rules) != fmt.Sprint(want) {
				t.Errorf("got rules\n%v\nwant\n%v", role.Rules, want)
			}
			binding, ok := find[*rbacv1.ClusterRoleBinding](objs, render.Release)
			wantSubject := rbacv1.Subject{Kind: "ServiceAccount", Name: pod.ServiceAccountName, Namespace: render.Namespace}
			if !ok || binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0] != wantSubject {
				t.Errorf("got binding %v, want %s bound to %v", binding, role.Name, wantSubject)
			}
		})
	}
}

// TestCollectorRBAC: the collector's ClusterRole grants exactly the reads it makes, bound
// to the DaemonSet's service account; without API access there is no role and no token.
func TestCollectorRBAC(t *testing.T) {
	// What a collector reads of its own pods: labels, owners and requests.
	podReads := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"apps"}, Resources: []string{"replicasets"}, Verbs: []string{"get"}},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"get"}},
	}
	// Its Node alone, when the scaler reads pods from the API itself.
	nodeOnly := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch"}}}
	for _, c := range render.Cases {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			ds, ok := find[*appsv1.DaemonSet](objs, "")
			if !ok {
				t.Fatal("got no collector DaemonSet")
			}
			pod := ds.Spec.Template.Spec
			sim := slices.Contains(pod.Containers[0].Args, "--source=sim")
			role, hasRole := find[*rbacv1.ClusterRole](objs, render.Release+"-collector")
			if sim {
				if hasRole || deref(pod.AutomountServiceAccountToken, true) {
					t.Errorf("got ClusterRole %v and token %v with the sim source, want neither (it reads no API)", hasRole, pod.AutomountServiceAccountToken)
				}
				return
			}
			if !hasRole {
				t.Fatal("got no ClusterRole for the collector")
			}
			// It reads pods unless the scaler does, or unless it measures each pod's own
			// use of a shared GPU (the host's /proc), which needs the pods' UIDs.
			want, readPods := podReads, "true"
			hostProc := flagValue(pod.Containers[0].Args, "proc-root") == "/host/proc"
			if dep, ok := find[*appsv1.Deployment](objs, render.Release); ok && !hostProc && flagValue(dep.Spec.Template.Spec.Containers[0].Args, "kubeconfig") == "in-cluster" {
				want, readPods = nodeOnly, "false"
			}
			if fmt.Sprint(role.Rules) != fmt.Sprint(want) {
				t.Errorf("got rules\n%v\nwant\n%v", role.Rules, want)
			}
			if got := flagValue(pod.Containers[0].Args, "read-pods"); got != readPods && !(got == "" && readPods == "true") {
				t.Errorf("got --read-pods=%q, want %s: the collector reads pods exactly when the scaler does not", got, readPods)
			}
			binding, ok := find[*rbacv1.ClusterRoleBinding](objs, render.Release+"-collector")
			if !ok {
				t.Fatal("got no ClusterRoleBinding")
			}
			wantSubject := rbacv1.Subject{Kind: "ServiceAccount", Name: pod.ServiceAccountName, Namespace: render.Namespace}
			if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0] != wantSubject {
				t.Errorf("got binding of %s to %v, want %s to %v", binding.RoleRef.Name, binding.Subjects, role.Name, wantSubject)
			}
			if !deref(pod.AutomountServiceAccountToken, true) {
				t.Errorf("got no API token in the collector's pods, want one (it watches its node's pods)")
			}
		})
	}
}

// TestCollectorNode: the collector runs on GPU nodes, knows its node and pod from the
// downward API, and reads the kubelet's pod-resources socket from the host.
func TestCollectorNode(t *testing.T) {
	for _, c := range render.Cases {
		t.Run(c.Name, func(t *testing.T) {
			ds, ok := find[*appsv1.DaemonSet](caseObjects(t, c), "")
			if !ok {
				t.Fatal("got no collector DaemonSet")
			}
			pod := ds.Spec.Template.Spec
			ctr := pod.Containers[0]
			env := map[string]string{}
			for _, e := range ctr.Env {
				if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
					env[e.Name] = e.ValueFrom.FieldRef.FieldPath
				}
			}
			if env["NODE_NAME"] != "spec.nodeName" || env["POD_NAME"] != "metadata.name" {
				t.Errorf("got downward API env %v, want NODE_NAME=spec.nodeName and POD_NAME=metadata.name", env)
			}
			if slices.Contains(ctr.Args, "--source=sim") {
				// The published sim manifest is for clusters without GPUs: every node.
				if c.Name == "sim" && (len(pod.NodeSelector) > 0 || len(pod.Tolerations) > 0) {
					t.Errorf("got nodeSelector %v and tolerations %v, want neither: the sim runs on every node", pod.NodeSelector, pod.Tolerations)
				}
				return
			}
			var tolerates bool
			for _, tol := range pod.Tolerations {
				tolerates = tolerates || (tol.Key == "nvidia.com/gpu" && tol.Operator == corev1.TolerationOpExists)
			}
			if !tolerates || len(pod.NodeSelector) == 0 {
				t.Errorf("got tolerations %v and nodeSelector %v, want nvidia.com/gpu tolerated and GPU nodes selected", pod.Tolerations, pod.NodeSelector)
			}
			var hostPath string
			for _, v := range pod.Volumes {
				if v.Name == "pod-resources" && v.HostPath != nil {
					hostPath = v.HostPath.Path
				}
			}
			var mounted bool
			for _, m := range ctr.VolumeMounts {
				mounted = mounted || (m.Name == "pod-resources" && m.ReadOnly &&
					strings.HasPrefix(flagValue(ctr.Args, "pod-resources-socket"), m.MountPath+"/"))
			}
			if hostPath != "/var/lib/kubelet/pod-resources" || !mounted {
				t.Errorf("got hostPath %q mounted %v, want /var/lib/kubelet/pod-resources mounted read-only where --pod-resources-socket points", hostPath, mounted)
			}
		})
	}
}

// flagValue returns the value of --name=value in args, or "".
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// TestFilesAreMounted: every file a flag names lies under a volume mount, and every mount
// names a volume of its pod; every ConfigMap a pod mounts is rendered with it.
func TestFilesAreMounted(t *testing.T) {
	for _, c := range render.AllCases() {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			configMaps := map[string]bool{}
			for _, cm := range all[*corev1.ConfigMap](objs) {
				configMaps[cm.Name] = true
			}
			for _, w := range workloads(objs) {
				volumes := map[string]corev1.Volume{}
				for _, v := range w.pod.Spec.Volumes {
					volumes[v.Name] = v
					if v.ConfigMap != nil && !configMaps[v.ConfigMap.Name] {
						t.Errorf("%s %s: got ConfigMap volume %s, not rendered", w.kind, w.name, v.ConfigMap.Name)
					}
				}
				for _, c := range w.claims {
					volumes[c] = corev1.Volume{Name: c}
				}
				for _, ctr := range append(slices.Clone(w.pod.Spec.InitContainers), w.pod.Spec.Containers...) {
					for _, m := range ctr.VolumeMounts {
						if _, ok := volumes[m.Name]; !ok {
							t.Errorf("%s %s: got mount of volume %s, which the pod lacks", w.kind, w.name, m.Name)
						}
					}
					for _, a := range append(slices.Clone(ctr.Command), ctr.Args...) {
						_, val, _ := strings.Cut(a, "=")
						if !strings.HasPrefix(val, "/") {
							continue
						}
						var under bool
						for _, m := range ctr.VolumeMounts {
							under = under || val == m.MountPath || strings.HasPrefix(val, strings.TrimSuffix(m.MountPath, "/")+"/")
						}
						if !under {
							t.Errorf("%s %s: got %s, a path under no volume mount", w.kind, w.name, a)
						}
					}
				}
			}
		})
	}
}

// TestOptionalObjects: the ServiceMonitor and the ClusterTriggerAuthentication, where
// rendered, point at what they should.
func TestOptionalObjects(t *testing.T) {
	for _, c := range render.Cases {
		t.Run(c.Name, func(t *testing.T) {
			objs := caseObjects(t, c)
			if sm, ok := find[*monitoringv1.ServiceMonitor](objs, ""); ok {
				sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
				if err != nil {
					t.Fatal(err)
				}
				var selected []string
				for _, svc := range all[*corev1.Service](objs) {
					if sel.Matches(labels.Set(svc.Labels)) {
						selected = append(selected, svc.Name)
						var metrics bool
						for _, p := range svc.Spec.Ports {
							metrics = metrics || p.Name == sm.Spec.Endpoints[0].Port
						}
						if !metrics {
							t.Errorf("ServiceMonitor selects Service %s, which has no port %s", svc.Name, sm.Spec.Endpoints[0].Port)
						}
					}
				}
				slices.Sort(selected)
				want := []string{render.Release}
				if _, ok := find[*appsv1.Deployment](objs, render.Release+"-auth-callout"); ok {
					want = append(want, render.Release+"-auth-callout")
				}
				want = append(want, render.Release+"-collector")
				if !slices.Equal(selected, want) {
					t.Errorf("got ServiceMonitor selecting %v, want %v", selected, want)
				}
			}
			if cta, ok := find[*kedav1alpha1.ClusterTriggerAuthentication](objs, ""); ok {
				var params []string
				for _, r := range cta.Spec.SecretTargetRef {
					params = append(params, r.Parameter)
				}
				if want := []string{"caCert", "tlsClientCert", "tlsClientKey"}; !slices.Equal(params, want) {
					t.Errorf("got ClusterTriggerAuthentication parameters %v, want %v (what KEDA's external scaler reads)", params, want)
				}
				if _, err := cta.ValidateCreate(new(bool)); err != nil {
					t.Errorf("KEDA's webhook rejects the ClusterTriggerAuthentication: %v", err)
				}
			}
		})
	}
}
