package manifests

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"

	"github.com/gpuscaler/gpuscaler/deploy/render"
)

// chartImages returns the image of every container of the collector DaemonSet and of
// every other gpuscaler container (NATS's own is not), by workload and container.
func chartImages(t *testing.T, objs []Object) (collector, others map[string]string) {
	t.Helper()
	collector, others = map[string]string{}, map[string]string{}
	for _, w := range workloads(objs) {
		for _, ctr := range append(slices.Clone(w.pod.Spec.InitContainers), w.pod.Spec.Containers...) {
			where := w.kind + " " + w.name + " container " + ctr.Name
			switch {
			case w.kind == "DaemonSet" && strings.HasSuffix(w.name, "-collector"):
				collector[where] = ctr.Image
			case strings.Contains(ctr.Image, "gpuscaler"):
				others[where] = ctr.Image
			}
		}
	}
	return collector, others
}

// TestChartImages: the collector runs the collector's image (cgo, which make image
// builds as <repository>-collector) and everything else the static image, by default,
// with the repository and tag set, and with the collector's set apart. The static
// image's collector has no DCGM or NVML source, so a mix-up would fail on GPU nodes.
func TestChartImages(t *testing.T) {
	chart := filepath.Join(root(t), render.ChartDir)
	tests := map[string]struct {
		values                 map[string]any
		wantStatic, wantCollec string
	}{
		"defaults": {
			wantStatic: "gpuscaler:0.1.0", wantCollec: "gpuscaler-collector:0.1.0",
		},
		"a registry": {
			values:     map[string]any{"image": map[string]any{"repository": "registry.example.com/team/gpuscaler", "tag": "v1.2.3"}},
			wantStatic: "registry.example.com/team/gpuscaler:v1.2.3", wantCollec: "registry.example.com/team/gpuscaler-collector:v1.2.3",
		},
		"the collector's own": {
			values: map[string]any{
				"image":     map[string]any{"repository": "registry.example.com/team/gpuscaler", "tag": "v1.2.3"},
				"collector": map[string]any{"image": map[string]any{"repository": "registry.example.com/team/collector-dcgm", "tag": "v1.2.3-dcgm4"}},
			},
			wantStatic: "registry.example.com/team/gpuscaler:v1.2.3", wantCollec: "registry.example.com/team/collector-dcgm:v1.2.3-dcgm4",
		},
		"the collector's tag alone": {
			values:     map[string]any{"collector": map[string]any{"image": map[string]any{"tag": "dev"}}},
			wantStatic: "gpuscaler:0.1.0", wantCollec: "gpuscaler-collector:dev",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out, err := render.Render(chart, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := DecodeAll(name, []byte(out))
			if err != nil {
				t.Fatal(err)
			}
			collector, others := chartImages(t, objs)
			if len(collector) != 1 || len(others) < 2 {
				t.Fatalf("got collector containers %v and others %v, want the collector and the scaler and auth callout", collector, others)
			}
			for where, img := range collector {
				if img != tc.wantCollec {
					t.Errorf("%s: got image %s, want %s", where, img, tc.wantCollec)
				}
			}
			for where, img := range others {
				if img != tc.wantStatic {
					t.Errorf("%s: got image %s, want %s", where, img, tc.wantStatic)
				}
			}
		})
	}

	// Every committed rendering keeps the split.
	for _, c := range render.Cases {
		collector, others := chartImages(t, caseObjects(t, c))
		for where, img := range collector {
			if repo, _, _ := strings.Cut(img, ":"); !strings.HasSuffix(repo, "-collector") {
				t.Errorf("%s: %s: got image %s, want the collector's (<repository>-collector)", c.Name, where, img)
			}
		}
		for where, img := range others {
			if repo, _, _ := strings.Cut(img, ":"); strings.HasSuffix(repo, "-collector") {
				t.Errorf("%s: %s: got the collector's image %s, want the static one", c.Name, where, img)
			}
		}
	}
}

// TestNotesNameTheImages: gpuscaler publishes no image, so what helm install prints names
// the two images the pods will pull and how to make them exist.
func TestNotesNameTheImages(t *testing.T) {
	chrt, err := loader.Load(filepath.Join(root(t), render.ChartDir))
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{"image": map[string]any{"repository": "registry.example.com/team/gpuscaler", "tag": "v1"}}
	top, err := chartutil.ToRenderValues(chrt, vals, chartutil.ReleaseOptions{Name: render.Release, Namespace: render.Namespace, Revision: 1, IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(chrt, top)
	if err != nil {
		t.Fatal(err)
	}
	notes := files["gpuscaler/templates/NOTES.txt"]
	for _, want := range []string{
		"registry.example.com/team/gpuscaler:v1 and registry.example.com/team/gpuscaler-collector:v1",
		"publishes no image", "ErrImagePull", "make image", "kind load image-archive", "image.repository and image.tag",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("NOTES.txt does not say %q:\n%s", want, notes)
		}
	}
}
